//! Running the filesystem tools (mkfs, resize2fs, xfs_growfs).

use std::process::Output;

use crate::error::HostdError;

/// Runs `cmd` to completion. The child dies with hostd: a half-finished
/// mkfs must not run on while a restarted hostd retries the same device.
pub async fn run(mut cmd: std::process::Command, what: &str) -> Result<Output, HostdError> {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only the async-signal-safe prctl(2) runs.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    tokio::process::Command::from(cmd)
        .output()
        .await
        .map_err(|e| HostdError::failed("running", what, e))
}
