//! Small block-device facts and actions: flush, size, rescan, holders.

use std::path::Path;

nix::ioctl_none!(blkflsbuf, 0x12, 97);

/// The block-device facts a decision reads, from sysfs on a host
/// ([`crate::host::System`]), from a table in unit tests.
pub trait BlockDevices {
    /// See [`kernel_name`].
    fn kernel_name(&self, node: &Path) -> Option<String>;
    /// `major:minor` of a device node (see `device::majmin`).
    fn majmin(&self, node: &Path) -> Result<String, crate::error::HostdError>;
    /// See [`majmin_of`].
    fn majmin_of(&self, name: &str) -> Option<String>;
    /// See [`active`].
    fn active(&self, mapping: &str) -> Option<String>;
    /// See [`slaves`].
    fn slaves(&self, name: &str) -> Vec<String>;
    /// See [`held`].
    fn held(&self, name: &str) -> bool;
    /// See [`backing_present`].
    fn backing_present(&self, mapping: &str) -> bool;
    /// The SCSI serial of the disk called `name` (see `device::serial_of`).
    fn serial(&self, name: &str) -> Option<String>;
}

/// The kernel name (`sdb`, `dm-0`) of `major:minor`, from sysfs (which,
/// unlike `/dev/block`, exists without udev).
pub fn name_of(majmin: &str) -> Option<String> {
    let real = Path::new("/sys/dev/block")
        .join(majmin)
        .canonicalize()
        .ok()?;
    real.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// `major:minor` of the block device called `name` in sysfs.
pub fn majmin_of(name: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/sys/class/block").join(name).join("dev"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Flushes the device's buffers (`blockdev --flushbufs`). Best effort: the
/// device may already be gone after a surprise unplug.
pub fn flush(majmin: &str) {
    let Some(name) = name_of(majmin) else { return };
    let path = Path::new("/dev").join(name);
    let Ok(f) = std::fs::File::open(&path) else {
        return;
    };
    // SAFETY: BLKFLSBUF takes no argument; the fd is open for the call's duration.
    if let Err(e) = unsafe { blkflsbuf(std::os::fd::AsRawFd::as_raw_fd(&f)) } {
        tracing::debug!(device = %path.display(), error = %e, "flushing buffers failed");
    }
}

/// Size in bytes of the block device called `name` in sysfs (e.g. `sdb`).
pub fn size_of(name: &str) -> Option<u64> {
    std::fs::read_to_string(Path::new("/sys/class/block").join(name).join("size"))
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|sectors| sectors * 512)
}

/// The kernel name (`sdb`, `dm-0`) behind a device node.
pub fn kernel_name(node: &Path) -> Option<String> {
    let real = node.canonicalize().ok()?;
    real.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// For a device-mapper device, the kernel names of the devices under it.
pub fn slaves(name: &str) -> Vec<String> {
    std::fs::read_dir(Path::new("/sys/class/block").join(name).join("slaves"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The kernel name (`dm-N`) of the device-mapper device called `name`, if
/// the kernel has one, whether or not its `/dev/mapper` node exists. Here,
/// not in `luks`: it is a sysfs fact, and `luks` builds on this module.
pub fn active(name: &str) -> Option<String> {
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries.flatten().find_map(|e| {
        let dm = std::fs::read_to_string(e.path().join("dm/name")).ok()?;
        (dm.trim() == name).then(|| e.file_name().to_string_lossy().into_owned())
    })
}

/// Whether the LUKS mapping `name` still has its disk underneath. The
/// mapping is found in sysfs: with `DM_DISABLE_UDEV` its `/dev/mapper` entry
/// is a device node, not a link to `dm-N`.
pub fn backing_present(mapping: &str) -> bool {
    let Some(dm) = active(mapping) else {
        return false;
    };
    // An unplugged disk leaves sysfs even while the mapping still holds it.
    let under = slaves(&dm);
    !under.is_empty()
        && under
            .iter()
            .all(|s| Path::new("/sys/class/block").join(s).exists())
}

/// Whether another device sits on the block device `name` (`holders/`).
pub fn held(name: &str) -> bool {
    std::fs::read_dir(Path::new("/sys/block").join(name).join("holders"))
        .map(|d| d.flatten().next().is_some())
        .unwrap_or(false)
}

/// Asks a SCSI disk to re-read its capacity (after a Proxmox resize).
pub fn rescan(name: &str) {
    let path = Path::new("/sys/class/block")
        .join(name)
        .join("device/rescan");
    if path.exists()
        && let Err(e) = std::fs::write(&path, "1")
    {
        tracing::debug!(path = %path.display(), error = %e, "device rescan failed");
    }
}
