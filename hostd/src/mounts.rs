//! The mount table (`/proc/self/mountinfo`, through procfs) and the mount
//! system calls (through nix).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::HostdError;

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

pub fn table() -> Result<Vec<MountEntry>, HostdError> {
    let infos = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map_err(|e| HostdError::failed("reading", "/proc/self/mountinfo", e))?;
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

/// Splits CSI mount flags into kernel flags and filesystem data.
fn split_flags(flags: &[String]) -> (MsFlags, String) {
    let mut ms = MsFlags::empty();
    let mut data = Vec::new();
    for f in flags {
        match f.as_str() {
            "ro" => ms |= MsFlags::MS_RDONLY,
            "rw" | "defaults" => {}
            "noatime" => ms |= MsFlags::MS_NOATIME,
            "nodiratime" => ms |= MsFlags::MS_NODIRATIME,
            "relatime" => ms |= MsFlags::MS_RELATIME,
            "strictatime" => ms |= MsFlags::MS_STRICTATIME,
            "lazytime" => ms |= MsFlags::MS_LAZYTIME,
            "nosuid" => ms |= MsFlags::MS_NOSUID,
            "nodev" => ms |= MsFlags::MS_NODEV,
            "noexec" => ms |= MsFlags::MS_NOEXEC,
            "sync" => ms |= MsFlags::MS_SYNCHRONOUS,
            "dirsync" => ms |= MsFlags::MS_DIRSYNC,
            other => data.push(other.to_string()),
        }
    }
    (ms, data.join(","))
}

pub fn mount_fs(
    device: &Path,
    target: &Path,
    fs_type: &str,
    flags: &[String],
    read_only: bool,
) -> Result<(), HostdError> {
    let (mut ms, data) = split_flags(flags);
    if read_only {
        ms |= MsFlags::MS_RDONLY;
    }
    let data = (!data.is_empty()).then_some(data.as_str());
    mount(Some(device), target, Some(fs_type), ms, data).map_err(|e| {
        HostdError::failed(
            "mounting",
            format!("{} on {} ({fs_type})", device.display(), target.display()),
            e,
        )
    })
}

/// Bind-mounts `source` onto `target`, read-only if asked (which takes a
/// second, remounting call).
pub fn bind(source: &Path, target: &Path, read_only: bool, flags: &[String]) -> Result<(), HostdError> {
    let what = || format!("{} onto {}", source.display(), target.display());
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| HostdError::failed("bind-mounting", what(), e))?;
    let (extra, _) = split_flags(flags);
    let ro = if read_only { MsFlags::MS_RDONLY } else { MsFlags::empty() };
    if !(extra | ro).is_empty() {
        let ms = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | extra | ro;
        if let Err(e) = mount(None::<&str>, target, None::<&str>, ms, None::<&str>) {
            let _ = umount2(target, MntFlags::empty());
            return Err(HostdError::failed("remounting read-only", what(), e));
        }
    }
    Ok(())
}

pub fn unmount(target: &Path) -> Result<(), HostdError> {
    umount2(target, MntFlags::empty())
        .map_err(|e| HostdError::failed("unmounting", target.display(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_flags_into_kernel_flags_and_data() {
        let (ms, data) = split_flags(&[
            "noatime".into(),
            "nouuid".into(),
            "ro".into(),
            "discard".into(),
        ]);
        assert_eq!(ms, MsFlags::MS_NOATIME | MsFlags::MS_RDONLY);
        assert_eq!(data, "nouuid,discard");
    }

    #[test]
    fn reads_the_mount_table() {
        let t = table().unwrap();
        assert!(t.iter().any(|m| m.mount_point == Path::new("/")));
        assert!(at(Path::new("/proc")).unwrap().is_some_and(|m| m.fs_type == "proc"));
    }
}
