//! The mount table (`/proc/self/mountinfo`, through procfs) and the mount
//! system calls (through nix).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::HostdError;
use crate::mountopts::Checked;
use crate::paths::Place;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    /// `major:minor` of the mounted device.
    pub majmin: String,
    /// Path inside the mounted filesystem that is mounted here (`/` unless a bind).
    pub root: String,
    pub fs_type: String,
    pub source: String,
    pub read_only: bool,
    /// The filesystem (superblock) is read-only, whatever this mount says.
    pub super_read_only: bool,
}

/// The mount table as a decision reads it: `/proc/self/mountinfo` on a host
/// ([`crate::host::System`]), a list in unit tests.
pub trait Mounts {
    /// See [`table`].
    fn table(&self) -> Result<Vec<MountEntry>, HostdError>;
}

pub fn table() -> Result<Vec<MountEntry>, HostdError> {
    let infos = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map_err(|e| HostdError::lib("reading", "/proc/self/mountinfo", e))?;
    Ok(infos
        .into_iter()
        .map(|m| MountEntry {
            read_only: m.mount_options.contains_key("ro"),
            super_read_only: m.super_options.contains_key("ro"),
            mount_point: m.mount_point,
            majmin: m.majmin,
            root: m.root,
            fs_type: m.fs_type,
            source: m.mount_source.unwrap_or_default(),
        })
        .collect())
}

/// The topmost mount at `path`, if any.
pub fn at(path: &Path) -> Result<Option<MountEntry>, HostdError> {
    Ok(table()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// Mounts a filesystem. `target` is a `/proc/self/fd/N` path (see
/// `paths::Opened`), so the kernel mounts on exactly the directory checked.
pub fn mount_fs(
    device: &Path,
    target: &Path,
    fs_type: &str,
    opts: &Checked,
    read_only: bool,
) -> Result<(), HostdError> {
    let mut ms = opts.flags;
    if read_only {
        ms |= MsFlags::MS_RDONLY;
    }
    let data = (!opts.data.is_empty()).then_some(opts.data.as_str());
    mount(Some(device), target, Some(fs_type), ms, data)
        .map_err(|e| HostdError::sys("mounting", format!("{} ({fs_type})", device.display()), e))
}

/// Bind-mounts `source` (a `/proc/self/fd/N` path, or a device node) onto
/// the place `target`, read-only if asked (which takes a second, remounting
/// call on the new mount).
pub fn bind(
    source: &Path,
    target: &Place,
    read_only: bool,
    opts: &Checked,
) -> Result<(), HostdError> {
    let what = || format!("{} onto {}", source.display(), target.path.display());
    let under = target.open()?;
    mount(
        Some(source),
        &under.proc_path(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| HostdError::sys("bind-mounting", what(), e))?;
    drop(under);
    let ro = if read_only {
        MsFlags::MS_RDONLY
    } else {
        MsFlags::empty()
    };
    if !(opts.flags | ro).is_empty() {
        let ms = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | opts.flags | ro;
        // Opened again: now the new mount, not the directory under it.
        let result = target.open().and_then(|on| {
            mount(
                None::<&str>,
                &on.proc_path(),
                None::<&str>,
                ms,
                None::<&str>,
            )
            .map_err(|e| HostdError::sys("remounting read-only", what(), e))
        });
        if let Err(e) = result {
            let _ = umount2(&target.via_parent(), MntFlags::UMOUNT_NOFOLLOW);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts the top mount at `target`, never following a symlink there.
pub fn unmount(target: &Path) -> Result<(), HostdError> {
    umount2(target, MntFlags::UMOUNT_NOFOLLOW)
        .map_err(|e| HostdError::sys("unmounting", target.display(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_mount_table() {
        let t = table().unwrap();
        assert!(t.iter().any(|m| m.mount_point == Path::new("/")));
        assert!(
            at(Path::new("/proc"))
                .unwrap()
                .is_some_and(|m| m.fs_type == "proc")
        );
    }
}
