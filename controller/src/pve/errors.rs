//! Proxmox's error answers, classified once into a kind the rest of the
//! controller decides on. A structural signal wins over wording: the HTTP
//! status (403, the proxy's 595/596, 5xx of the HTTP stack) first; only then
//! the text, matched against `CORPUS`, in which every pattern is a literal
//! Proxmox string with the place it comes from. A text the corpus does not
//! know is `Other`: callers settle such answers structurally (existence by
//! the storage's listing), never by guessing.

/// What an error means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object (VM, config, storage, volume) is not there.
    NotFound,
    /// A lock is held or timed out: the same call may pass later.
    Busy,
    /// The config changed between read and write (`digest`).
    DigestMismatch,
    /// A config change was written but could not be applied live.
    HotplugFailed,
    /// 403: the token lacks a privilege (the message names it).
    PermissionDenied,
    AlreadyExists,
    /// Proxmox or the way to it is in trouble (quorum, an offline node).
    Transient,
    Other,
}

/// One known Proxmox text: a literal fragment, its kind, where it comes from.
#[derive(Debug)]
pub struct Known {
    pub fragment: &'static str,
    pub kind: ErrorKind,
    pub source: &'static str,
}

const fn known(fragment: &'static str, kind: ErrorKind, source: &'static str) -> Known {
    Known {
        fragment,
        kind,
        source,
    }
}

use ErrorKind::*;

/// The texts the controller reacts to. The fragment is the literal part of
/// Proxmox's format string; examples of whole messages are in the tests.
pub const CORPUS: &[Known] = &[
    // Missing objects.
    known(
        "does not exist",
        NotFound,
        "pve-guest-common src/PVE/AbstractConfig.pm load_config: \"Configuration file '$cfspath' does not exist\"; pve-storage src/PVE/Storage/Plugin.pm / PVE/Storage.pm storage_config: \"storage '$storeid' does not exist\"",
    ),
    known(
        "Failed to find logical volume",
        NotFound,
        "pve-storage src/PVE/Storage/LVMPlugin.pm volume_size_info: lvs with errmsg \"can't get size of '$path'\"; pve-common src/PVE/Tools.pm run_command appends lvs' last stderr line (LvmThinPlugin inherits it)",
    ),
    known(
        "no such logical volume",
        NotFound,
        "pve-storage src/PVE/Storage/LvmThinPlugin.pm activate_volume: \"no such logical volume $vg/$lv\"",
    ),
    known(
        "dataset does not exist",
        NotFound,
        "pve-storage src/PVE/Storage/ZFSPoolPlugin.pm zfs_request: zfs's \"cannot open '$dataset': dataset does not exist\"",
    ),
    known(
        "No such file or directory",
        NotFound,
        "pve-storage src/PVE/Storage/RBDPlugin.pm volume_size_info: rbd's \"error opening image $name: (2) No such file or directory\"",
    ),
    known(
        "failed - no format",
        NotFound,
        "pve-storage src/PVE/API2/Storage/Content.pm info: \"volume_size_info on '$volid' failed - no format\" (a file that is not there has no format)",
    ),
    // Locks.
    known(
        "can't lock file",
        Busy,
        "pve-common src/PVE/Tools.pm lock_file_full: \"can't lock file '$filename' - got timeout\"",
    ),
    known(
        "got lock request timeout",
        Busy,
        "pve-cluster src/PVE/Cluster.pm cfs_lock: \"cfs-lock '$lockid' error: got lock request timeout\"",
    ),
    known(
        "is locked (",
        Busy,
        "pve-guest-common src/PVE/AbstractConfig.pm check_lock: \"VM is locked ($lock)\"",
    ),
    // Races on the config.
    known(
        "checksum mismatch (file change by other user?)",
        DigestMismatch,
        "qemu-server src/PVE/API2/Qemu.pm update_vm_api, $load_and_check_config: \"checksum mismatch (file change by other user?)\"",
    ),
    known(
        "file changed by other user",
        DigestMismatch,
        "pve-common src/PVE/Tools.pm assert_if_modified: \"detected modified configuration - file changed by other user? Try again.\"",
    ),
    known(
        "hotplug problem",
        HotplugFailed,
        "qemu-server PVE/QemuServer.pm vmconfig_hotplug_pending: \"hotplug problem - $msg\" per key",
    ),
    known(
        "already exists",
        AlreadyExists,
        "pve-storage src/PVE/Storage/Plugin.pm alloc_image: \"disk image '$path' already exists\"; qemu-server PVE/API2/Qemu.pm create_vm: \"VM $vmid already exists\"",
    ),
    // The cluster itself.
    known(
        "no quorum",
        Transient,
        "pve-cluster src/PVE/Cluster.pm check_cfs_quorum: \"cluster not ready - no quorum?\"; cfs_lock: \"cfs-lock '$lockid' error: no quorum!\"",
    ),
    known(
        "unable to open file '/etc/pve/",
        Transient,
        "pve-common src/PVE/File.pm file_set_contents: \"unable to open file '$tmpname' - $!\", a config write to pmxcfs (/etc/pve), which is read-only while the cluster has no quorum",
    ),
];

/// HTTP statuses that are transient whatever the text: the HTTP stack's
/// 502/503/504 and pve-http-server's 595 (connection to a node failed) and
/// 596 (its answer timed out) when it proxies to another node. A read is
/// asked again; a write answered 502/503/504/596/597 may have been applied
/// and is not sent again blindly (`client::MAYBE_APPLIED`).
const TRANSIENT_STATUS: &[u16] = &[502, 503, 504, 595, 596];

/// The kind of an API answer (`status` the HTTP code, `message` its text).
pub fn classify(status: Option<u16>, message: &str) -> ErrorKind {
    match status {
        Some(403) => return PermissionDenied,
        Some(s) if TRANSIENT_STATUS.contains(&s) => return Transient,
        _ => {}
    }
    CORPUS
        .iter()
        .find(|k| message.contains(k.fragment))
        .map_or(Other, |k| k.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole messages as Proxmox renders them.
    #[test]
    fn real_texts_get_their_kind() {
        let cases: &[(Option<u16>, &str, ErrorKind)] = &[
            (
                Some(500),
                "can't get size of '/dev/pve/vm-9999-pvc-1':   Failed to find logical volume \"pve/vm-9999-pvc-1\"",
                NotFound,
            ),
            (
                Some(500),
                "no such logical volume pve/vm-9999-pvc-1",
                NotFound,
            ),
            (
                Some(500),
                "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist",
                NotFound,
            ),
            (Some(500), "storage 'nope' does not exist", NotFound),
            (
                Some(500),
                "zfs error: cannot open 'rpool/data/vm-9999-x': dataset does not exist",
                NotFound,
            ),
            (
                Some(500),
                "rbd error: rbd: error opening image vm-9999-x: (2) No such file or directory",
                NotFound,
            ),
            (
                Some(500),
                "volume_size_info on 'local:9999/vm-9999-x.raw' failed - no format",
                NotFound,
            ),
            (
                Some(500),
                "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout",
                Busy,
            ),
            (
                Some(500),
                "cfs-lock 'file-replication_cfg' error: got lock request timeout",
                Busy,
            ),
            (Some(500), "VM is locked (backup)", Busy),
            (
                Some(500),
                "checksum mismatch (file change by other user?)",
                DigestMismatch,
            ),
            (
                Some(500),
                "detected modified configuration - file changed by other user? Try again.",
                DigestMismatch,
            ),
            (
                Some(500),
                "hotplug problem - scsi3: unable to hotplug scsi3",
                HotplugFailed,
            ),
            (Some(500), "cluster not ready - no quorum?", Transient),
            (
                Some(500),
                "cfs-lock 'storage-nfs' error: no quorum!",
                Transient,
            ),
            (
                None,
                "unable to open file '/etc/pve/nodes/pve2/qemu-server/112.conf.tmp.4711' - Permission denied",
                Transient,
            ),
            (
                Some(403),
                "Permission check failed (/vms/100, VM.Config.Disk)",
                PermissionDenied,
            ),
            (Some(595), "Connection refused", Transient),
            (Some(596), "Connection timed out", Transient),
            (
                Some(500),
                "disk image '/var/lib/vz/images/9999/vm-9999-x.raw' already exists",
                AlreadyExists,
            ),
            (Some(500), "illegal name 'x' - should be 'vm-9999-*'", Other),
            (Some(500), "Internal Server Error", Other),
        ];
        for (status, text, kind) in cases {
            assert_eq!(classify(*status, text), *kind, "{text}");
        }
    }

    #[test]
    fn every_pattern_is_cited() {
        for k in CORPUS {
            assert!(k.source.contains(".pm") && !k.fragment.is_empty(), "{k:?}");
        }
    }
}
