//! Storage-plugin texts that more than one endpoint family answers: why a
//! missing volume does not activate, or has no size, as qemu-server's config
//! and resize, pve-storage's content endpoints and the disk moves report it.

use crate::state::StorageType;

/// The volume group of pvesim's LVM storages.
pub fn vgname(kind: StorageType) -> &'static str {
    if kind == StorageType::Lvm {
        "san"
    } else {
        "pve"
    }
}

/// Why `activate_volumes` (pve-storage src/PVE/Storage.pm) fails for a
/// volume that is not there, per plugin; `None` where activation does not
/// look (the size probe after it fails instead). `in_worker`: inside a
/// task, where the zvol wait is 300 s instead of 10 s.
/// - lvmthin: LvmThinPlugin.pm $activate_lv, "no such logical volume $vg/$lv";
/// - lvm, raw: LVMPlugin.pm activate_volume, lvchange with errmsg
///   "can't activate LV '$path'" and lvm2's indented last line appended
///   (pve-common src/PVE/Cmd.pm run); with volume chains, a `--select`
///   that matches nothing: no error;
/// - zfspool: ZFSPoolPlugin.pm zfs_wait_for_zvol_link,
///   "timeout: no zvol device link for '$volname' found after $timeout sec.";
/// - rbd without krbd: activate_volume does nothing;
/// - dir/nfs: Plugin.pm activate_volume, "volume '$storeid:$volname' does not exist".
pub fn activation_error(
    kind: StorageType,
    storage: &str,
    volname: &str,
    in_worker: bool,
) -> Option<String> {
    match kind {
        StorageType::Lvmthin => Some(format!("no such logical volume {}/{volname}", vgname(kind))),
        StorageType::Lvm if volname.ends_with(".qcow2") => None,
        StorageType::Lvm => {
            let vg = vgname(kind);
            Some(format!(
                "can't activate LV '/dev/{vg}/{volname}':   Failed to find logical volume \"{vg}/{volname}\""
            ))
        }
        StorageType::Zfspool => Some(format!(
            "timeout: no zvol device link for '{volname}' found after {} sec.",
            if in_worker { 300 } else { 10 }
        )),
        StorageType::Rbd => None,
        StorageType::Dir | StorageType::Nfs => {
            Some(format!("volume '{storage}:{volname}' does not exist"))
        }
    }
}

/// What the size probe after a silent activation answers for a missing
/// volume: rbd's `rbd info` error (RBDPlugin.pm volume_size_info); a file
/// (a chain's qcow2 LV included) has size 0, which qemu-server's
/// create_disks turns into "volume $volid does not exist" (Qemu.pm).
pub fn size_probe_error(kind: StorageType, storage: &str, volname: &str) -> String {
    match kind {
        StorageType::Rbd => {
            format!("rbd error: rbd: error opening image {volname}: (2) No such file or directory")
        }
        _ => format!("volume {storage}:{volname} does not exist"),
    }
}
