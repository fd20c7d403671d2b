//! A child process of a test: its stdout and stderr go to a log file; it is
//! killed when dropped, and when the test is failing (dropped while
//! panicking) the end of its log is printed, so a failure shows what the
//! process said.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How much of a log a failing test prints.
const TAIL_LINES: usize = 80;

#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `program` with `args`, its output appended to `log`.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(
        name: &str,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[S],
        log: &Path,
    ) -> Result<Proc, String> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        Proc::start(name, cmd, log)
    }

    /// Starts `cmd` (environment and arguments set by the caller), its
    /// output appended to `log`.
    pub fn start(name: &str, mut cmd: Command, log: &Path) -> Result<Proc, String> {
        let file = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|e| format!("{name}'s log {}: {e}", log.display()))
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file()?)
            .stderr(file()?)
            .spawn()
            .map_err(|e| format!("starting {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What the process has written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for it to exit by itself.
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, as a crash would; waits for it to end.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILL, and the process is gone.
    pub fn kill9(mut self) {
        self.kill();
    }

    /// SIGTERM, then its exit status within 10 s. Async: a server the
    /// process is talking to may run on the caller's runtime.
    pub async fn stop(mut self) -> Result<ExitStatus, String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .map_err(|e| format!("SIGTERM to {}: {e}", self.name))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not stop within 10 s of SIGTERM", self.name));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
            eprintln!(
                "--- {} ({}), its last {} lines:\n{}\n---",
                self.name,
                self.log.display(),
                tail.len(),
                tail.join("\n")
            );
        }
    }
}
