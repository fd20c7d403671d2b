//! The LUKS operations that derive a key (luksFormat's key slot, open,
//! the resize's unlock), each run in a process of its own: hostd's binary
//! again, as `proxmox-csi-hostd __luks-child`.
//!
//! libcryptsetup-rs serialises every libcryptsetup call of a process behind
//! one lock (its `mutex` feature), held through a derivation: an Argon2id
//! of a second or more. In hostd's own process, one volume's derivation
//! would hold every other volume's LUKS call; in a child, each derivation
//! has the lock of its own process. The passphrase goes over the child's
//! stdin, never its arguments or environment; the child is hardened as
//! hostd is and dies with the thread that started it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use proxmox_csi_common::Secret;
use serde::{Deserialize, Serialize};

use crate::error::HostdError;
use crate::luks::{self, Pbkdf};

/// The first argument that makes hostd's binary the child.
pub const CHILD_ARG: &str = "__luks-child";

/// Key derivations run at once. Each may take the header's memory cost (up
/// to `--luks-kdf-bounds`, 1 GiB by default) and half the CPUs: two at a
/// time keep a node's memory bounded whatever arrives.
const MAX_DERIVATIONS: usize = 2;

/// A counting semaphore for the blocking threads the derivations run on.
static RUNNING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

/// One of the `MAX_DERIVATIONS` slots, given back when dropped.
struct Slot;

impl Slot {
    fn take() -> Self {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        while *running >= MAX_DERIVATIONS {
            running = FREED.wait(running).unwrap_or_else(|p| p.into_inner());
        }
        *running += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        *running -= 1;
        FREED.notify_one();
    }
}

/// The largest request the child reads: a request line and a passphrase.
const MAX_INPUT: usize = 64 * 1024;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Format { device: PathBuf, pbkdf: String },
    Open { device: PathBuf, name: String },
    Resize { name: String, with_passphrase: bool },
}

/// What the child answers: nothing, or the error as hostd's own kinds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Answer {
    refused: Option<(PathBuf, String)>,
    failed: Option<(String, String)>,
}

pub fn format(device: &Path, passphrase: &Secret<Vec<u8>>, pbkdf: Pbkdf) -> Result<(), HostdError> {
    run(
        &Op::Format {
            device: device.to_path_buf(),
            pbkdf: pbkdf.to_string(),
        },
        Some(passphrase),
    )
}

pub fn open(
    device: &Path,
    name: &str,
    passphrase: &Secret<Vec<u8>>,
) -> Result<PathBuf, HostdError> {
    run(
        &Op::Open {
            device: device.to_path_buf(),
            name: name.to_string(),
        },
        Some(passphrase),
    )?;
    Ok(luks::mapper_path(name))
}

pub fn resize(name: &str, passphrase: Option<&Secret<Vec<u8>>>) -> Result<(), HostdError> {
    run(
        &Op::Resize {
            name: name.to_string(),
            with_passphrase: passphrase.is_some(),
        },
        passphrase,
    )
}

fn run(op: &Op, passphrase: Option<&Secret<Vec<u8>>>) -> Result<(), HostdError> {
    use std::os::unix::process::CommandExt;
    let _slot = Slot::take();
    let what = "the key derivation process";
    // hostd's own binary, whatever became of its path since it started.
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("proxmox-csi-hostd")
        .arg(CHILD_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: between fork and exec only the async-signal-safe prctl(2) runs.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| HostdError::io("starting", what, e))?;
    let header = serde_json::to_vec(op).map_err(|e| HostdError::lib("writing to", what, e))?;
    let written = match child.stdin.take() {
        Some(mut stdin) => stdin
            .write_all(&header)
            .and_then(|()| stdin.write_all(b"\n"))
            .and_then(|()| match passphrase {
                Some(p) => stdin.write_all(p.expose()),
                None => Ok(()),
            }),
        None => Err(std::io::Error::other("no stdin")),
    };
    if let Err(e) = written {
        // Never left running nor unreaped.
        let _ = child.kill();
        let _ = child.wait();
        return Err(HostdError::io("writing to", what, e));
    }
    let out = child
        .wait_with_output()
        .map_err(|e| HostdError::io("waiting for", what, e))?;
    // The answer is the last line: anything libcryptsetup prints comes before.
    let last = out
        .stdout
        .split(|b| *b == b'\n')
        .rev()
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    let answer: Answer = serde_json::from_slice(last).map_err(|e| {
        HostdError::lib(
            "reading the answer of",
            format_args!("{what} (it exited {})", out.status),
            e,
        )
    })?;
    match answer {
        // The reasons are words read from the child's output: its error
        // values stayed in its process (see `answer`).
        Answer {
            refused: Some((device, reason)),
            ..
        } => Err(HostdError::DeviceRefused { device, reason }),
        Answer {
            failed: Some((target, reason)),
            ..
        } => Err(HostdError::failed("LUKS", target, reason)),
        Answer { .. } if out.status.success() => Ok(()),
        Answer { .. } => Err(HostdError::failed("running", what, out.status.to_string())),
    }
}

/// The child: one operation from stdin, its answer on stdout.
pub fn child_main() -> ExitCode {
    // One buffer as large as any request, so reading never reallocates
    // (which would leave a copy behind); wiped when dropped, as is the one
    // copy of the passphrase made from it.
    let mut buf = Vec::with_capacity(MAX_INPUT + 1);
    let read = std::io::stdin()
        .take(MAX_INPUT as u64 + 1)
        .read_to_end(&mut buf);
    let input = Secret::new(buf);
    let answer = match read {
        Ok(n) if n <= MAX_INPUT => {
            let all = input.expose();
            let nl = all.iter().position(|b| *b == b'\n').unwrap_or(all.len());
            let passphrase = Secret::new(all[(nl + 1).min(all.len())..].to_vec());
            match serde_json::from_slice::<Op>(&all[..nl]) {
                Ok(op) => answer(serve(op, passphrase)),
                Err(e) => answer(Err(HostdError::lib("reading", "the request", e))),
            }
        }
        Ok(_) => answer(Err(HostdError::failed(
            "reading",
            "stdin",
            "the request is too large",
        ))),
        Err(e) => answer(Err(HostdError::io("reading", "stdin", e))),
    };
    let ok = answer.refused.is_none() && answer.failed.is_none();
    let written = serde_json::to_vec(&answer)
        .map_err(std::io::Error::other)
        .and_then(|b| {
            let mut out = std::io::stdout();
            out.write_all(b"\n")
                .and_then(|()| out.write_all(&b))
                .and_then(|()| out.write_all(b"\n"))
        });
    if written.is_ok() && ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn serve(op: Op, passphrase: Secret<Vec<u8>>) -> Result<(), HostdError> {
    match op {
        Op::Format { device, pbkdf } => {
            // `Pbkdf`'s parse error is a reason in words (clap prints it).
            let pbkdf = pbkdf
                .parse::<Pbkdf>()
                .map_err(|e| HostdError::failed("reading", "the PBKDF", e))?;
            luks::format(&device, &passphrase, pbkdf)
        }
        Op::Open { device, name } => luks::open(&device, &name, &passphrase).map(drop),
        Op::Resize {
            name,
            with_passphrase,
        } => luks::resize(&name, with_passphrase.then_some(&passphrase)),
    }
}

fn answer(result: Result<(), HostdError>) -> Answer {
    match result {
        Ok(()) => Answer::default(),
        Err(HostdError::DeviceRefused { device, reason }) => Answer {
            refused: Some((device, reason)),
            failed: None,
        },
        // The error crosses into hostd's process as text: its words are
        // all that is decided on there.
        Err(e) => Answer {
            refused: None,
            failed: Some(match e.failure() {
                Some((action, target, reason)) => {
                    (target.to_string(), format!("{action}: {reason}"))
                }
                None => (String::new(), e.message()),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_kind_across_the_process() {
        let a = answer(Err(HostdError::DeviceRefused {
            device: "/dev/sdb".into(),
            reason: "the encryption passphrase does not open its LUKS volume".into(),
        }));
        let back: Answer = serde_json::from_slice(&serde_json::to_vec(&a).unwrap()).unwrap();
        assert_eq!(
            back.refused,
            Some((
                PathBuf::from("/dev/sdb"),
                "the encryption passphrase does not open its LUKS volume".to_string()
            ))
        );
        let op: Op =
            serde_json::from_str(r#"{"op":"format","device":"/dev/sdb","pbkdf":"pbkdf2:1000"}"#)
                .unwrap();
        assert!(matches!(op, Op::Format { ref pbkdf, .. } if pbkdf == "pbkdf2:1000"));
        // What the request line carries never holds the passphrase.
        let line = serde_json::to_string(&Op::Resize {
            name: "pvecsi-0".into(),
            with_passphrase: true,
        })
        .unwrap();
        assert!(!line.contains("passphrase\":\""), "{line}");
    }
}
