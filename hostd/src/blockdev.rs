//! Small block-device facts and actions: flush, size, rescan, holders.

use std::path::Path;

nix::ioctl_none!(blkflsbuf, 0x12, 97);

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

/// Whether the LUKS mapping `name` still has its disk underneath. The
/// mapping is found in sysfs: with `DM_DISABLE_UDEV` its `/dev/mapper` entry
/// is a device node, not a link to `dm-N`.
pub fn backing_present(mapping: &str) -> bool {
    let Some(dm) = crate::luks::active(mapping) else {
        return false;
    };
    // An unplugged disk leaves sysfs even while the mapping still holds it.
    let under = slaves(&dm);
    !under.is_empty()
        && under
            .iter()
            .all(|s| Path::new("/sys/class/block").join(s).exists())
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
