//! From a WWN to a verified whole-disk device node.
//!
//! The device index (see `discovery`) finds a disk by its key; before the
//! disk is used its identity is checked again against sysfs (`wwid` is
//! `naa.<wwn>` for a Proxmox SCSI disk, and the serial when one was given),
//! and it is refused if it is a partition, mounted anywhere else, held by
//! device-mapper, or the disk of the root filesystem.

use std::path::{Path, PathBuf};

use proxmox_csi_common::contract;

use crate::discovery::Key;
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
    Sysfs { sys_block: PathBuf },
    /// Test hosts without SCSI: the loop device backed by `<dir>/<wwn>.raw`.
    #[cfg(feature = "loop-resolver")]
    Loop { dir: PathBuf },
}

impl Default for Resolver {
    fn default() -> Self {
        Self::Sysfs {
            sys_block: "/sys/block".into(),
        }
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

impl Resolver {
    /// The device index key under which `wwn`'s device is found.
    pub fn key(&self, wwn: &Wwn) -> Key {
        match self {
            Self::Sysfs { .. } => format!("naa.{}", wwn.hex()),
            #[cfg(feature = "loop-resolver")]
            Self::Loop { dir } => {
                format!("file:{}", dir.join(format!("{}.raw", wwn.hex())).display())
            }
        }
    }

    /// Checks, right before the device is used, that it still is the disk
    /// that was asked for: sysfs `wwid` is `naa.<wwn>`; when the request
    /// names a serial, the SCSI serial (VPD page 0x80) matches it; and a
    /// disk carrying a serial this driver made (`csi-…`) carries the one of
    /// `volume_id`, whatever the request says. (The Go driver set none.)
    pub fn verify_identity(
        &self,
        device: &Path,
        wwn: &Wwn,
        serial: &str,
        volume_id: &str,
    ) -> Result<(), HostdError> {
        let refuse = |reason: String| HostdError::DeviceRefused {
            device: device.to_path_buf(),
            reason,
        };
        match self {
            Self::Sysfs { sys_block, .. } => {
                let name = device
                    .file_name()
                    .ok_or_else(|| refuse("has no device name".into()))?;
                let sys = sys_block.join(name);
                let want = format!("naa.{}", wwn.hex());
                let wwid = read_trim(&sys.join("device/wwid")).map(|w| w.to_ascii_lowercase());
                if wwid.as_deref() != Some(want.as_str()) {
                    return Err(refuse(format!(
                        "its wwid is {}, expected {want}",
                        wwid.as_deref().unwrap_or("unknown")
                    )));
                }
                // Two disks with one WWID (a drive line copied by hand): the
                // index holds whichever udev announced last; use neither.
                let twins: Vec<String> = std::fs::read_dir(sys_block)
                    .map(|d| {
                        d.flatten()
                            .filter(|e| {
                                read_trim(&e.path().join("device/wwid"))
                                    .is_some_and(|w| w.to_ascii_lowercase() == want)
                            })
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                if twins.len() > 1 {
                    return Err(refuse(format!(
                        "{} disks carry {want}: {}",
                        twins.len(),
                        twins.join(", ")
                    )));
                }
                let found = read_vpd_serial(&sys.join("device/vpd_pg80"));
                if !serial.is_empty() && found.as_deref() != Some(serial) {
                    return Err(refuse(format!(
                        "its serial is {:?}, expected {serial:?}",
                        found.as_deref().unwrap_or("unknown")
                    )));
                }
                let own = contract::serial_for(volume_id);
                if let Some(found) =
                    found.filter(|f| f.starts_with(contract::SERIAL_PREFIX) && *f != own)
                {
                    return Err(refuse(format!(
                        "its serial {found:?} names another volume than {volume_id} ({own:?})"
                    )));
                }
                Ok(())
            }
            // Loop devices have neither a WWN nor a serial; the backing file is the identity.
            #[cfg(feature = "loop-resolver")]
            Self::Loop { dir } => {
                let name = device
                    .file_name()
                    .ok_or_else(|| refuse("has no device name".into()))?;
                let backing =
                    read_trim(&Path::new("/sys/block").join(name).join("loop/backing_file"));
                let want = dir.join(format!("{}.raw", wwn.hex()));
                if backing.as_deref().map(Path::new) != Some(want.as_path()) {
                    return Err(refuse(format!("it is not backed by {}", want.display())));
                }
                Ok(())
            }
        }
    }
}

impl Resolver {
    /// Whether `device` itself names `volume_id`: its SCSI serial is the
    /// one the controller derives from that id. A disk without one (the
    /// Go driver's) may be used for a request, but proves no volume id.
    /// Loop devices (tests only) are named by their backing file alone,
    /// which proves the volume unless a `<image>.noserial` file beside it
    /// says the disk stands for one attached without a serial.
    pub fn proves_volume_id(&self, device: &Path, volume_id: &str) -> bool {
        match self {
            Self::Sysfs { sys_block } => device.file_name().is_some_and(|name| {
                read_vpd_serial(&sys_block.join(name).join("device/vpd_pg80"))
                    .is_some_and(|s| s == contract::serial_for(volume_id))
            }),
            #[cfg(feature = "loop-resolver")]
            Self::Loop { .. } => device.file_name().is_some_and(|name| {
                read_trim(&Path::new("/sys/block").join(name).join("loop/backing_file"))
                    .is_some_and(|b| !Path::new(&format!("{b}.noserial")).exists())
            }),
        }
    }
}

/// The SCSI serial (VPD page 0x80) of the disk called `name`, if it has one.
pub fn serial_of(name: &str) -> Option<String> {
    read_vpd_serial(&Path::new("/sys/block").join(name).join("device/vpd_pg80"))
        .filter(|s| !s.is_empty())
}

/// The NAA WWN of the disk called `name` (sysfs `wwid` is `naa.<hex>`),
/// lower-case hex without a prefix, if it has one.
pub fn wwn_of(name: &str) -> Option<String> {
    let wwid = read_trim(&Path::new("/sys/block").join(name).join("device/wwid"))?;
    Some(wwid.strip_prefix("naa.")?.to_ascii_lowercase())
}

/// The unit serial number from a raw VPD page 0x80: a 4-byte header, the
/// length in byte 3, then the serial (space-padded).
fn read_vpd_serial(path: &Path) -> Option<String> {
    let page = std::fs::read(path).ok()?;
    let len = usize::from(*page.get(3)?);
    let body = page.get(4..4 + len)?;
    Some(String::from_utf8_lossy(body).trim().to_string())
}

/// `major:minor` of a block device node.
pub fn majmin(device: &Path) -> Result<String, HostdError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta =
        std::fs::metadata(device).map_err(|e| HostdError::io("inspecting", device.display(), e))?;
    if !meta.file_type().is_block_device() {
        return Err(HostdError::DeviceRefused {
            device: device.to_path_buf(),
            reason: "not a block device".into(),
        });
    }
    let rdev = meta.rdev();
    Ok(format!(
        "{}:{}",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    ))
}

/// Checks that `device` is a whole disk that nothing else uses. The volume's
/// own dm-crypt mapping (`own_mapping`) does not count as use.
pub fn verify_unused(
    device: &Path,
    mounts: &[MountEntry],
    own_mapping: Option<&str>,
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
    // A raw block volume's staging bind of this disk's node shows as
    // devtmpfs, its root the node's name.
    if let Some(m) = mounts
        .iter()
        .find(|m| m.fs_type == "devtmpfs" && m.root.trim_start_matches('/') == name)
    {
        return Err(refuse(format!("is bound at {}", m.mount_point.display())));
    }
    if let Some(m) = mounts.iter().find(|m| own.contains(&m.majmin)) {
        if m.mount_point == Path::new("/") {
            return Err(refuse("holds the root filesystem".into()));
        }
        return Err(refuse(format!("is mounted at {}", m.mount_point.display())));
    }
    // Holders of the disk and of each of its partitions.
    let mut dirs = vec![sys.join("holders")];
    if let Ok(entries) = std::fs::read_dir(Path::new("/sys/block").join(name)) {
        dirs.extend(
            entries
                .flatten()
                .filter(|e| e.path().join("partition").exists())
                .map(|e| e.path().join("holders")),
        );
    }
    let holders: Vec<String> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
        })
        .filter(|h| {
            let dm_name = read_trim(&Path::new("/sys/class/block").join(h).join("dm/name"));
            own_mapping.is_none() || dm_name.as_deref() != own_mapping
        })
        .collect();
    if !holders.is_empty() {
        return Err(refuse(format!("is in use by {}", holders.join(", "))));
    }
    // What hostd's mount table and sysfs cannot see: a mount in another
    // mount namespace, swap, a ZFS pool, another process's exclusive open.
    // The kernel refuses O_EXCL on a block device while any of them holds
    // it. The volume's own open mapping holds it too: then it was checked
    // above to be this disk's only holder.
    let own_open = own_mapping
        .and_then(crate::blockdev::active)
        .is_some_and(|dm| crate::blockdev::slaves(&dm) == [name.to_string()]);
    if !own_open {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_EXCL | nix::libc::O_CLOEXEC)
            .open(device)
        {
            Ok(f) => drop(f),
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {
                return Err(refuse(
                    "is in use: the kernel refuses to open it exclusively (mounted in another mount namespace, swap, or held by another process)"
                        .into(),
                ));
            }
            Err(e) => return Err(HostdError::io("opening", device.display(), e)),
        }
    }
    Ok(mm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wwns_as_proxmox_writes_them() {
        assert_eq!(
            Wwn::parse("0x5000C500A1B2C3D4").unwrap().hex(),
            "5000c500a1b2c3d4"
        );
        assert_eq!(
            Wwn::parse("5000c500a1b2c3d4").unwrap().to_string(),
            "0x5000c500a1b2c3d4"
        );
        for bad in [
            "",
            "0x123",
            "0xZZ00c500a1b2c3d4",
            "/dev/sda",
            "0x5000c500a1b2c3d4ff",
        ] {
            let e = Wwn::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("device.wwn: "), "{e}");
        }
    }

    #[test]
    fn verifies_wwid_and_serial_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sdb/device")).unwrap();
        std::fs::write(dir.path().join("sdb/device/wwid"), "naa.5000C500A1B2C3D4\n").unwrap();
        let id = "region-1/pve2/local-lvm/vm-9999-pvc-1";
        let own = contract::serial_for(id);
        let mut page = vec![0u8, 0x80, 0, 20];
        page.extend_from_slice(own.as_bytes());
        std::fs::write(dir.path().join("sdb/device/vpd_pg80"), &page).unwrap();
        let r = Resolver::Sysfs {
            sys_block: dir.path().to_path_buf(),
        };
        let wwn = Wwn::parse("0x5000C500A1B2C3D4").unwrap();
        assert_eq!(r.key(&wwn), "naa.5000c500a1b2c3d4");
        let dev = Path::new("/dev/sdb");
        r.verify_identity(dev, &wwn, "", id).unwrap();
        r.verify_identity(dev, &wwn, &own, id).unwrap();
        let e = r
            .verify_identity(dev, &wwn, "csi-0000000000000000", id)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(
            e.to_string().contains(&format!(
                "its serial is {own:?}, expected \"csi-0000000000000000\""
            )),
            "{e}"
        );
        // The request leaves the serial out; the disk's own still names its volume.
        let e = r
            .verify_identity(dev, &wwn, "", "region-1/pve2/local-lvm/vm-9999-pvc-2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("names another volume"), "{e}");
        let other = Wwn::parse("0x1111111111111111").unwrap();
        let e = r
            .verify_identity(dev, &other, "", id)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("its wwid is naa.5000c500a1b2c3d4, expected naa.1111111111111111"),
            "{e}"
        );
        // A second disk with the same WWID: neither is used.
        std::fs::create_dir_all(dir.path().join("sdc/device")).unwrap();
        std::fs::write(dir.path().join("sdc/device/wwid"), "naa.5000c500a1b2c3d4\n").unwrap();
        let e = r
            .verify_identity(dev, &wwn, "", id)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 disks carry naa.5000c500a1b2c3d4"), "{e}");
        let e = String::from("its wwid is naa.5000c500a1b2c3d4, expected naa.1111111111111111");
        assert!(
            e.contains("its wwid is naa.5000c500a1b2c3d4, expected naa.1111111111111111"),
            "{e}"
        );
    }

    #[test]
    fn refuses_the_root_disk_and_non_devices() {
        let mounts = crate::mounts::table().unwrap();
        let root = mounts
            .iter()
            .find(|m| m.mount_point == Path::new("/"))
            .unwrap();
        // Find the block device of the root filesystem, if it is one.
        let dev = Path::new("/dev/block").join(&root.majmin);
        if let Ok(real) = dev.canonicalize() {
            let e = verify_unused(&real, &mounts, None).unwrap_err().to_string();
            assert!(
                e.contains("root filesystem") || e.contains("partition") || e.contains("in use"),
                "{e}"
            );
        }
        let e = verify_unused(Path::new("/etc/hostname"), &mounts, None).unwrap_err();
        assert!(e.to_string().contains("not a block device"), "{e}");
    }
}
