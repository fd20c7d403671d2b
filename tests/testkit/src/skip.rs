//! A test that cannot run on this machine (not root, no QEMU, a tool not
//! installed) says so on one `SKIPPED:` line and returns; under `CI=true`
//! the same absence fails the test, since CI installs everything.

/// Whether this runs under CI, where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// `true` when `present`; otherwise prints why the test is skipped (naming
/// `what` is missing), or panics under CI.
pub fn present(present: bool, what: &str) -> bool {
    if present {
        return true;
    }
    assert!(
        !in_ci(),
        "{what} is missing, and CI is set: nothing may be skipped in CI"
    );
    eprintln!("SKIPPED: {what} is missing");
    false
}

/// Whether this process runs as root (loop devices, mounts, another uid).
pub fn root() -> bool {
    present(
        nix::unistd::geteuid().is_root(),
        "root (loop devices, mounts, setpriv)",
    )
}

/// Whether QEMU is installed (`scripts/deps.sh test` installs it).
pub fn qemu() -> bool {
    let ok = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    present(ok, "qemu-system-x86_64")
}

/// Returns from the test unless it runs as root (fails under CI).
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::skip::root() {
            return;
        }
    };
}

/// Returns from the test unless QEMU is installed (fails under CI).
#[macro_export]
macro_rules! require_qemu {
    () => {
        if !$crate::skip::qemu() {
            return;
        }
    };
}

/// Returns from the test unless `$ok`, naming `$what` as missing (fails
/// under CI).
#[macro_export]
macro_rules! require {
    ($ok:expr, $what:expr) => {
        if !$crate::skip::present($ok, &$what) {
            return;
        }
    };
}
