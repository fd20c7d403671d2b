//! Running the filesystem tools (mkfs, resize2fs, xfs_growfs).

use std::process::Output;

use crate::error::HostdError;

/// Runs `cmd` to completion, on the calling (blocking) thread, with stdin
/// from /dev/null. The child dies with hostd: a half-finished mkfs must not
/// run on while a restarted hostd retries the same device. (The death signal
/// follows the forking thread, which waits here until the child ends.)
pub fn run(mut cmd: std::process::Command, what: &str) -> Result<Output, HostdError> {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only the async-signal-safe prctl(2) runs.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    cmd.stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| HostdError::io("running", what, e))
}
