//! Loop devices and mounts a test makes, undone when it ends.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over a file, detached when dropped.
#[derive(Debug)]
pub struct Loop {
    pub dev: PathBuf,
}

impl Loop {
    /// Creates `file` of `bytes` (sparse) and attaches a loop device to it.
    pub fn create(file: &Path, bytes: u64) -> Result<Loop, String> {
        std::fs::File::create(file)
            .and_then(|f| f.set_len(bytes))
            .map_err(|e| format!("{}: {e}", file.display()))?;
        Loop::attach(file)
    }

    /// Attaches a loop device to the existing `file`.
    pub fn attach(file: &Path) -> Result<Loop, String> {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup {}: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Loop {
            dev: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// Detaches every loop device backed by a file in `dir` (devices another
/// process attached, such as pvesim's loop host).
pub fn detach_backed_by(dir: &Path) {
    for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let out = Command::new("losetup").arg("-j").arg(f.path()).output();
        let listed = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for dev in listed.lines().filter_map(|l| l.split(':').next()) {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

/// Lazily unmounts everything mounted at or below `root`, deepest first.
pub fn unmount_under(root: &Path) {
    let Some(root) = root.to_str() else { return };
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(root))
        .collect();
    points.reverse();
    for p in points {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
}
