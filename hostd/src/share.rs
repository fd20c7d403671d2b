//! Directories hostd shares with the unprivileged node plugin: the one of
//! hostd's socket (which Talos creates 0700 root) and kubelet's plugin
//! directory where the node plugin puts its CSI socket (created root 0755).
//! Both get the node plugin's group, so it needs no capability.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::HostdError;

/// Creates `dir` if needed and gives it group `gid` and `mode`.
pub fn share_dir(dir: &Path, gid: u32, mode: u32) -> Result<(), HostdError> {
    let what = |step: &str| format!("{} with group {gid}: {step}", dir.display());
    std::fs::create_dir_all(dir).map_err(|e| HostdError::io("sharing", what("creating it"), e))?;
    nix::unistd::chown(dir, None, Some(nix::unistd::Gid::from_raw(gid)))
        .map_err(|e| HostdError::sys("sharing", what("setting its group"), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| HostdError::io("sharing", what("setting its mode"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn shared_dirs_get_the_group_and_mode() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("plugins/csi.proxmox.sinextra.dev");
        let gid = nix::unistd::getgid().as_raw();
        share_dir(&dir, gid, 0o770).unwrap();
        let m = std::fs::metadata(&dir).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o7777), (gid, 0o770));
        share_dir(&dir, gid, 0o750).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o750);
        let file = t.path().join("f");
        std::fs::write(&file, "").unwrap();
        let e = share_dir(&file.join("x"), gid, 0o750)
            .unwrap_err()
            .message();
        assert!(
            e.starts_with(&format!(
                "sharing {}/x with group {gid}: creating it:",
                file.display()
            )),
            "{e}"
        );
    }
}
