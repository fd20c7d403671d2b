//! Growing a mounted filesystem: at expand, up to the claim or the whole
//! device; at the stage of a volume without a claim whose disk is larger
//! than its filesystem (a clone or restore asked for more than its source,
//! a Go driver's restore grown at publish), up to its device, as the Go
//! node plugin grows one at stage (proxmox-csi-plugin pkg/csi/node.go
//! NodeStageVolume, `resizeRequired`).

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::process::Command;

use crate::blockdev;
use crate::error::HostdError;
use crate::probe;

/// What a filesystem may be short of its device without a stage growing
/// it: the MiB a claimed source's filesystem leaves for its claim, and the
/// tail xfs_growfs leaves when it is too small for an allocation group
/// (XFS_AG_MIN_BYTES, 16 MiB), are not worth a grow at every stage.
pub const SLACK: u64 = 16 << 20;

/// LUKS2's default data offset (cryptsetup's and the Go driver's
/// luksFormat): a mapping shorter than its disk by more than this and the
/// slack was opened before the disk grew.
pub const LUKS_OFFSET: u64 = 16 << 20;

/// The mounted filesystem's and its device's sizes in bytes, when the
/// filesystem is short of the device by more than `SLACK`. `root` is the
/// filesystem's root directory, opened.
pub fn short_of_device(
    fs_type: &str,
    fs_device: &Path,
    root: &impl AsFd,
) -> Result<Option<(u64, u64)>, HostdError> {
    let Some(fs) = mounted_bytes(fs_type, fs_device, root)? else {
        return Ok(None);
    };
    let device = blockdev::kernel_name(fs_device)
        .and_then(|n| blockdev::size_of(&n))
        .unwrap_or(0);
    Ok((device > fs.saturating_add(SLACK)).then_some((fs, device)))
}

/// The size of the filesystem of type `fs_type` mounted from `fs_device`,
/// `root` its root directory, opened; `None` for a type hostd does not
/// read. XFS keeps its superblock in its own buffers: the one on the device
/// trails a grow until the log is written back, so the kernel is asked.
/// ext4's superblock is the device's.
pub fn mounted_bytes(
    fs_type: &str,
    fs_device: &Path,
    root: &impl AsFd,
) -> Result<Option<u64>, HostdError> {
    if fs_type == "xfs" {
        Ok(Some(xfs_data_bytes(root, fs_device)?))
    } else {
        probe::fs_bytes(fs_device)
    }
}

/// Grows the filesystem of type `fs_type` mounted at `mount_point` from the
/// device `node` to `size` bytes, or to its whole device.
pub fn mounted(
    fs_type: &str,
    node: &Path,
    mount_point: &Path,
    size: Option<u64>,
) -> Result<(), HostdError> {
    let (tool, arg) = match fs_type {
        "ext4" | "ext3" | "ext2" => ("resize2fs", node.display().to_string()),
        "xfs" => ("xfs_growfs", mount_point.display().to_string()),
        other => {
            return Err(HostdError::Unsupported(format!(
                "growing a {other} filesystem is not supported"
            )));
        }
    };
    let mut cmd = Command::new(tool);
    match (tool, size) {
        ("resize2fs", Some(bytes)) => {
            cmd.arg(&arg).arg(format!("{}K", bytes / 1024));
        }
        // xfs_growfs counts the new size in the filesystem's blocks.
        (_, Some(bytes)) => {
            let block = nix::sys::statvfs::statvfs(mount_point)
                .map_err(|e| HostdError::sys("inspecting", mount_point.display(), e))?
                .fragment_size()
                .max(512);
            cmd.arg("-D").arg((bytes / block).to_string()).arg(&arg);
        }
        (_, None) => {
            cmd.arg(&arg);
        }
    }
    let out = crate::tool::run(cmd, tool)?;
    if !out.status.success() {
        return Err(HostdError::failed(
            "growing the filesystem on",
            &arg,
            format!(
                "{tool}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

/// `struct xfs_fsop_geom_v1` (linux fs/xfs/libxfs/xfs_fs.h), which the
/// kernel fills for XFS_IOC_FSGEOMETRY_V1.
#[repr(C)]
#[derive(Default)]
struct XfsGeometryV1 {
    blocksize: u32,
    rtextsize: u32,
    agblocks: u32,
    agcount: u32,
    logblocks: u32,
    sectsize: u32,
    inodesize: u32,
    imaxpct: u32,
    datablocks: u64,
    rtblocks: u64,
    rtextents: u64,
    logstart: u64,
    uuid: [u8; 16],
    sunit: u32,
    swidth: u32,
    version: i32,
    flags: u32,
    logsectsize: u32,
    rtsectsize: u32,
    dirblocksize: u32,
}

// XFS_IOC_FSGEOMETRY_V1: _IOR('X', 100, struct xfs_fsop_geom_v1).
nix::ioctl_read!(xfs_geometry_v1, b'X', 100, XfsGeometryV1);

/// The size of the data section of the XFS filesystem whose root is
/// `root`, as the kernel has it.
fn xfs_data_bytes(root: &impl AsFd, fs_device: &Path) -> Result<u64, HostdError> {
    let mut g = XfsGeometryV1::default();
    // SAFETY: the kernel writes at most size_of::<XfsGeometryV1>() bytes
    // (the ioctl number encodes it) into `g`, which lives through the call.
    unsafe { xfs_geometry_v1(root.as_fd().as_raw_fd(), &mut g) }
        .map_err(|e| HostdError::sys("reading the XFS geometry of", fs_device.display(), e))?;
    Ok(g.datablocks.saturating_mul(u64::from(g.blocksize)))
}
