//! From a WWN to a verified whole-disk device node.
//!
//! Resolution reads sysfs (`/sys/block/*/device/wwid` is `naa.<wwn>` for a
//! Proxmox SCSI disk). Verification refuses partitions, devices mounted
//! anywhere else, devices with holders (device-mapper), and the disk that
//! holds the root filesystem.

use std::path::{Path, PathBuf};

use crate::error::HostdError;
use crate::mounts::MountEntry;

/// A WWN as Proxmox writes it (`0x` + 16 hex digits), stored lower-case
/// without the prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wwn(String);

impl Wwn {
    pub fn parse(raw: &str) -> Result<Self, HostdError> {
        let hex = raw.strip_prefix("0x").unwrap_or(raw).to_ascii_lowercase();
        if hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(Self(hex))
        } else {
            Err(HostdError::invalid(
                "device.wwn",
                format!("{raw:?} is not a WWN: expected 16 hex digits, optionally prefixed 0x"),
            ))
        }
    }

    pub fn hex(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Wwn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "0x{}", self.0)
    }
}

/// Where hostd looks for devices.
#[derive(Debug, Clone)]
pub enum Resolver {
    /// Real SCSI disks, by sysfs `wwid`.
    Sysfs { sys_block: PathBuf, dev: PathBuf },
    /// Test hosts without SCSI: the loop device backed by `<dir>/<wwn>.raw`.
    #[cfg(feature = "loop-resolver")]
    Loop { dir: PathBuf },
}

impl Default for Resolver {
    fn default() -> Self {
        Self::Sysfs {
            sys_block: "/sys/block".into(),
            dev: "/dev".into(),
        }
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

impl Resolver {
    pub fn resolve(&self, wwn: &Wwn) -> Result<PathBuf, HostdError> {
        let not_found = |reason: String| HostdError::DeviceNotFound {
            wwn: wwn.to_string(),
            reason,
        };
        match self {
            Self::Sysfs { sys_block, dev } => {
                let want = format!("naa.{}", wwn.hex());
                let entries = std::fs::read_dir(sys_block)
                    .map_err(|e| not_found(format!("listing {}: {e}", sys_block.display())))?;
                for entry in entries.flatten() {
                    if read_trim(&entry.path().join("device/wwid")).as_deref() == Some(&want) {
                        return Ok(dev.join(entry.file_name()));
                    }
                }
                Err(not_found(format!("no disk in {} has wwid {want}", sys_block.display())))
            }
            #[cfg(feature = "loop-resolver")]
            Self::Loop { dir } => {
                let want = dir.join(format!("{}.raw", wwn.hex()));
                let entries = std::fs::read_dir("/sys/block")
                    .map_err(|e| not_found(format!("listing /sys/block: {e}")))?;
                for entry in entries.flatten() {
                    let backing = read_trim(&entry.path().join("loop/backing_file"));
                    if backing.as_deref().map(Path::new) == Some(want.as_path()) {
                        return Ok(Path::new("/dev").join(entry.file_name()));
                    }
                }
                Err(not_found(format!("no loop device is backed by {}", want.display())))
            }
        }
    }
}

/// `major:minor` of a block device node.
pub fn majmin(device: &Path) -> Result<String, HostdError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(device)
        .map_err(|e| HostdError::failed("inspecting", device.display(), e))?;
    if !meta.file_type().is_block_device() {
        return Err(HostdError::DeviceRefused {
            device: device.to_path_buf(),
            reason: "not a block device".into(),
        });
    }
    let rdev = meta.rdev();
    Ok(format!("{}:{}", nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)))
}

/// Checks that `device` is a whole disk that nothing else uses. Mounts at
/// `allowed` (the volume's own staging path) do not count as use.
pub fn verify_unused(
    device: &Path,
    mounts: &[MountEntry],
    allowed: &[&Path],
) -> Result<String, HostdError> {
    let refuse = |reason: String| HostdError::DeviceRefused {
        device: device.to_path_buf(),
        reason,
    };
    let mm = majmin(device)?;
    let name = device
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| refuse("has no device name".into()))?;
    let sys = Path::new("/sys/class/block").join(name);
    if sys.join("partition").exists() {
        return Err(refuse("is a partition, not a whole disk".into()));
    }
    // Majors:minors of the disk and its partitions.
    let mut own = vec![mm.clone()];
    if let Ok(entries) = std::fs::read_dir(Path::new("/sys/block").join(name)) {
        for e in entries.flatten() {
            if e.path().join("partition").exists()
                && let Some(d) = read_trim(&e.path().join("dev"))
            {
                own.push(d);
            }
        }
    }
    for m in mounts.iter().filter(|m| own.contains(&m.majmin)) {
        if m.mount_point == Path::new("/") {
            return Err(refuse("holds the root filesystem".into()));
        }
        if !allowed.contains(&m.mount_point.as_path()) {
            return Err(refuse(format!("is mounted at {}", m.mount_point.display())));
        }
    }
    let holders = std::fs::read_dir(sys.join("holders"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
        .unwrap_or_default();
    if !holders.is_empty() {
        return Err(refuse(format!("is in use by {}", holders.join(", "))));
    }
    Ok(mm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wwns_as_proxmox_writes_them() {
        assert_eq!(Wwn::parse("0x5000C500A1B2C3D4").unwrap().hex(), "5000c500a1b2c3d4");
        assert_eq!(Wwn::parse("5000c500a1b2c3d4").unwrap().to_string(), "0x5000c500a1b2c3d4");
        for bad in ["", "0x123", "0xZZ00c500a1b2c3d4", "/dev/sda", "0x5000c500a1b2c3d4ff"] {
            let e = Wwn::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("device.wwn: "), "{e}");
        }
    }

    #[test]
    fn resolves_by_sysfs_wwid() {
        let dir = tempfile::tempdir().unwrap();
        for (name, wwid) in [("sda", "naa.1111111111111111"), ("sdb", "naa.5000c500a1b2c3d4")] {
            std::fs::create_dir_all(dir.path().join(name).join("device")).unwrap();
            std::fs::write(dir.path().join(name).join("device/wwid"), format!("{wwid}\n")).unwrap();
        }
        let r = Resolver::Sysfs {
            sys_block: dir.path().to_path_buf(),
            dev: "/dev".into(),
        };
        let wwn = Wwn::parse("0x5000C500A1B2C3D4").unwrap();
        assert_eq!(r.resolve(&wwn).unwrap(), Path::new("/dev/sdb"));
        let e = r.resolve(&Wwn::parse("0x2222222222222222").unwrap()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn refuses_the_root_disk_and_non_devices() {
        let mounts = crate::mounts::table().unwrap();
        let root = mounts.iter().find(|m| m.mount_point == Path::new("/")).unwrap();
        // Find the block device of the root filesystem, if it is one.
        let dev = Path::new("/dev/block").join(&root.majmin);
        if let Ok(real) = dev.canonicalize() {
            let e = verify_unused(&real, &mounts, &[]).unwrap_err().to_string();
            assert!(e.contains("root filesystem") || e.contains("partition") || e.contains("in use"), "{e}");
        }
        let e = verify_unused(Path::new("/etc/hostname"), &mounts, &[]).unwrap_err();
        assert!(e.to_string().contains("not a block device"), "{e}");
    }
}
