//! What the tests share.
//!
//! - [`skip`]: `require_root!`, `require_qemu!` and `require!`: a test that
//!   cannot run here is skipped with a line saying why, and fails under
//!   `CI=true`, where everything must run.
//! - [`process`]: a child process killed with its test, whose log is printed
//!   when the test fails.
//! - [`loopdev`]: loop devices detached with their test; mounts under a
//!   scratch root undone.
//! - [`node`]: hostd and the unprivileged node plugin on loop devices, as
//!   kubelet's node sees them.
//! - [`sim`]: pvesim started for a test, and the cloud config of a token on it.
//! - [`requests`]: the calls a test makes to set up, failing it with the
//!   call and its status.
//! - [`lab`]: all of it with the controller binary: a volume's whole life on
//!   this host.

pub mod lab;
pub mod loopdev;
pub mod node;
pub mod process;
pub mod requests;
pub mod sim;
pub mod skip;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A binary of the workspace built beside the running test executable
/// (`target/<profile>/deps/<test>` → `target/<profile>/<name>`), or beside a
/// binary run from `target/<profile>`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let beside = dir.join(name);
    if beside.is_file() {
        return beside;
    }
    dir.parent().map(|d| d.join(name)).unwrap_or(beside)
}

/// Waits up to 20 s for `path` to exist (a socket a process binds).
pub async fn wait_for(path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} never appeared", path.display()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `N` distinct TCP ports free on 127.0.0.1 now, for servers started next
/// (all held while they are chosen, so no two are the same).
pub fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    let held = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| format!("a free port: {e}"))?;
    let mut ports = [0; N];
    for (p, l) in ports.iter_mut().zip(&held) {
        *p = l.local_addr().map_err(|e| e.to_string())?.port();
    }
    Ok(ports)
}

/// Sets `path`'s mode bits.
pub fn chmod(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
}

/// A kubeconfig for the API server at `server` (plain HTTP), one context,
/// with a bearer token when given.
pub fn kubeconfig(server: &str, token: Option<&str>) -> String {
    let user = token
        .map(|t| format!("\n    token: {t}"))
        .unwrap_or_else(|| " {}".into());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {server}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: t\ncurrent-context: t\nusers:\n- name: t\n  user:{user}\n"
    )
}
