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

/// Where an answer came from: a call (its method and endpoint template,
/// `metrics::template`) or a task (its type, from the UPID: `qmconfig`,
/// `resize`, `qmcreate`, `imgdel`, …), whose exit status is the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin<'a> {
    Call { method: &'a str, endpoint: &'a str },
    Task(&'a str),
}

impl Origin<'_> {
    /// A call to an endpoint starting with `prefix`, or any task.
    fn under(&self, prefix: &str) -> bool {
        match self {
            Self::Call { endpoint, .. } => endpoint.starts_with(prefix),
            Self::Task(_) => true,
        }
    }

    fn is_call(&self, m: &str, e: &str) -> bool {
        matches!(self, Self::Call { method, endpoint } if *method == m && *endpoint == e)
    }

    fn is_task(&self, kinds: &[&str]) -> bool {
        matches!(self, Self::Task(t) if kinds.contains(t))
    }
}

/// The type of the task a UPID names (`UPID:node:pid:pstart:start:type:id:user:`,
/// pve-common src/PVE/UPID.pm create).
pub fn task_type(upid: &str) -> &str {
    upid.split(':').nth(5).unwrap_or_default()
}

/// One known Proxmox text: its literal parts (each present, in order), the
/// calls and tasks it is read from, its kind, where it comes from. A text is
/// believed only where it is known to come from: "No such file or directory"
/// is a missing RBD image on a volume's info, not anything else's errno.
#[derive(Debug)]
pub struct Known {
    pub parts: &'static [&'static str],
    pub on: fn(&Origin) -> bool,
    pub kind: ErrorKind,
    pub source: &'static str,
}

impl Known {
    /// Whether `message` at `origin` is this text: the entry believes it
    /// there, and it holds the parts in order.
    pub fn matches(&self, message: &str, origin: &Origin) -> bool {
        (self.on)(origin) && holds(message, self.parts)
    }
}

const fn known(
    parts: &'static [&'static str],
    on: fn(&Origin) -> bool,
    kind: ErrorKind,
    source: &'static str,
) -> Known {
    Known {
        parts,
        on,
        kind,
        source,
    }
}

use ErrorKind::*;

const VOLUME: &str = "/nodes/{node}/storage/{storage}/content/{volume}";

fn anywhere(_: &Origin) -> bool {
    true
}
/// The tasks that run on a VM's config (qemu-server API2/Qemu.pm
/// fork_worker types).
const VM_TASKS: &[&str] = &[
    "qmconfig",
    "qmcreate",
    "qmdestroy",
    "resize",
    "qmigrate",
    "qmmove",
];
/// The tasks that act on a volume: resize, an import (`qmconfig`), a move,
/// a delete (pve-storage API2/Storage/Content.pm `imgdel`).
const VOLUME_TASKS: &[&str] = &["resize", "qmconfig", "qmmove", "imgdel"];

/// A VM's endpoints, or a task on a VM's config.
fn vm(o: &Origin) -> bool {
    match o {
        Origin::Call { endpoint, .. } => endpoint.starts_with("/nodes/{node}/qemu/{vmid}"),
        Origin::Task(_) => o.is_task(VM_TASKS),
    }
}
/// A volume's info, or a task acting on a volume.
fn volume(o: &Origin) -> bool {
    o.is_call("GET", VOLUME) || o.is_task(VOLUME_TASKS)
}
/// A storage's own config or status, where the storage is the object asked for.
fn storage(o: &Origin) -> bool {
    o.under("/storage/{storage}") || o.is_call("GET", "/nodes/{node}/storage/{storage}/status")
}
fn allocation(o: &Origin) -> bool {
    o.is_call("POST", "/nodes/{node}/storage/{storage}/content")
}
fn vm_creation(o: &Origin) -> bool {
    o.is_call("POST", "/nodes/{node}/qemu") || o.is_task(&["qmcreate"])
}
fn config_update(o: &Origin) -> bool {
    o.under("/nodes/{node}/qemu/{vmid}/config") || o.is_task(&["qmconfig"])
}

/// The texts the controller reacts to. The parts are the literal pieces of
/// Proxmox's format string; examples of whole messages are in the tests.
pub const CORPUS: &[Known] = &[
    // Missing objects.
    known(
        &["Configuration file '", "' does not exist"],
        vm,
        NotFound,
        "pve-guest-common src/PVE/AbstractConfig.pm load_config: \"Configuration file '$cfspath' does not exist\"",
    ),
    known(
        &["storage '", "' does not exist"],
        storage,
        NotFound,
        "pve-storage src/PVE/Storage.pm storage_config: \"storage '$storeid' does not exist\"",
    ),
    known(
        &["Failed to find logical volume"],
        volume,
        NotFound,
        "pve-storage src/PVE/Storage/LVMPlugin.pm volume_size_info: lvs with errmsg \"can't get size of '$path'\"; pve-common src/PVE/Tools.pm run_command appends lvs' last stderr line (LvmThinPlugin inherits it)",
    ),
    known(
        &["no such logical volume "],
        volume,
        NotFound,
        "pve-storage src/PVE/Storage/LvmThinPlugin.pm activate_volume: \"no such logical volume $vg/$lv\"",
    ),
    known(
        &["cannot open '", "': dataset does not exist"],
        volume,
        NotFound,
        "pve-storage src/PVE/Storage/ZFSPoolPlugin.pm zfs_request: zfs's \"cannot open '$dataset': dataset does not exist\"",
    ),
    known(
        &["error opening image ", ": (2) No such file or directory"],
        volume,
        NotFound,
        "pve-storage src/PVE/Storage/RBDPlugin.pm volume_size_info: rbd's \"error opening image $name: (2) No such file or directory\"",
    ),
    // Locks.
    known(
        &["can't lock file '", "' - got timeout"],
        anywhere,
        Busy,
        "pve-common src/PVE/Tools.pm lock_file_full: \"can't lock file '$filename' - got timeout\"",
    ),
    known(
        &["cfs-lock '", "' error: got lock request timeout"],
        anywhere,
        Busy,
        "pve-cluster src/PVE/Cluster.pm cfs_lock: \"cfs-lock '$lockid' error: got lock request timeout\"",
    ),
    known(
        &["VM is locked ("],
        vm,
        Busy,
        "pve-guest-common src/PVE/AbstractConfig.pm check_lock: \"VM is locked ($lock)\"",
    ),
    // Races on the config.
    known(
        &["checksum mismatch (file change by other user?)"],
        vm,
        DigestMismatch,
        "qemu-server src/PVE/API2/Qemu.pm update_vm_api, $load_and_check_config: \"checksum mismatch (file change by other user?)\"",
    ),
    known(
        &["detected modified configuration - file changed by other user? Try again."],
        anywhere,
        DigestMismatch,
        "pve-common src/PVE/Tools.pm assert_if_modified: \"detected modified configuration - file changed by other user? Try again.\"",
    ),
    known(
        &["hotplug problem - "],
        config_update,
        HotplugFailed,
        "qemu-server PVE/QemuServer.pm vmconfig_hotplug_pending: \"hotplug problem - $msg\" per key",
    ),
    known(
        &["disk image '", "' already exists"],
        allocation,
        AlreadyExists,
        "pve-storage src/PVE/Storage/Plugin.pm alloc_image: \"disk image '$path' already exists\"",
    ),
    known(
        &["VM ", " already exists"],
        vm_creation,
        AlreadyExists,
        "qemu-server PVE/API2/Qemu.pm create_vm: \"unable to create VM $vmid - VM $vmid already exists on node '$node'\"",
    ),
    // Privileges: an HTTP 403 before the work, or a task's exit status when
    // the check runs in the worker (resize_vm's Datastore.AllocateSpace,
    // update_vm's per-drive VM.Config.Disk, create_vm's tags). A
    // PVE::Exception stringifies with its code: "403 Permission check failed (…)".
    known(
        &["Permission check failed"],
        anywhere,
        PermissionDenied,
        "pve-common src/PVE/Exception.pm raise_perm_exc: \"Permission check failed\" . \" ($what)\", stringify prefixes the code; pve-access-control src/PVE/RPCEnvironment.pm check: raise_perm_exc(\"$path, $priv\")",
    ),
    // The cluster itself.
    known(
        &["cluster not ready - no quorum?"],
        anywhere,
        Transient,
        "pve-cluster src/PVE/Cluster.pm check_cfs_quorum: \"cluster not ready - no quorum?\"",
    ),
    known(
        &["cfs-lock '", "' error: no quorum!"],
        anywhere,
        Transient,
        "pve-cluster src/PVE/Cluster.pm cfs_lock: \"cfs-lock '$lockid' error: no quorum!\"",
    ),
    known(
        &["unable to open file '/etc/pve/"],
        anywhere,
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

/// Whether `message` holds `parts`, each after the one before.
fn holds(message: &str, parts: &[&str]) -> bool {
    let mut rest = message;
    parts.iter().all(|p| match rest.find(p) {
        Some(i) => {
            rest = &rest[i + p.len()..];
            true
        }
        None => false,
    })
}

/// The kind of an answer: `status` its HTTP code (`None` for a task's exit
/// status), `message` its text, `origin` the call or task it came from.
pub fn classify(status: Option<u16>, message: &str, origin: Origin) -> ErrorKind {
    match status {
        Some(403) => return PermissionDenied,
        Some(s) if TRANSIENT_STATUS.contains(&s) => return Transient,
        _ => {}
    }
    CORPUS
        .iter()
        .find(|k| k.matches(message, &origin))
        .map_or(Other, |k| k.kind)
}

/// The path and privileges a permission failure names: `Permission check
/// failed (/storage/x, Datastore.AllocateSpace)` → (`/storage/x`,
/// `Datastore.AllocateSpace`). `None` for the bare text (create_vm without
/// VM.Allocate: raise_perm_exc()).
pub fn denied_privilege(message: &str) -> Option<(&str, &str)> {
    let inner = message.split("Permission check failed (").nth(1)?;
    let inner = inner.rsplit_once(')')?.0;
    let (path, privs) = inner.split_once(", ")?;
    Some((path.trim(), privs.trim()))
}

/// Whether a permission failure is the cluster's tag policy refusing a
/// tag, as opposed to another privilege (pve-guest-common
/// src/PVE/GuestHelpers.pm assert_tag_permissions: `Permission check failed
/// (/, Sys.Modify for modifying tag '…')`).
pub fn is_tag_refusal(message: &str) -> bool {
    denied_privilege(message).is_some_and(|(_, privs)| privs.contains("for modifying tag"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: Origin = Origin::Call {
        method: "GET",
        endpoint: VOLUME,
    };
    const CONFIG: Origin = Origin::Call {
        method: "GET",
        endpoint: "/nodes/{node}/qemu/{vmid}/config",
    };
    const SET: Origin = Origin::Call {
        method: "PUT",
        endpoint: "/nodes/{node}/qemu/{vmid}/config",
    };
    const ALLOC: Origin = Origin::Call {
        method: "POST",
        endpoint: "/nodes/{node}/storage/{storage}/content",
    };
    const STORAGE: Origin = Origin::Call {
        method: "GET",
        endpoint: "/storage/{storage}",
    };
    const LISTING: Origin = Origin::Call {
        method: "GET",
        endpoint: "/nodes/{node}/storage/{storage}/content",
    };
    const CREATE: Origin = Origin::Call {
        method: "POST",
        endpoint: "/nodes/{node}/qemu",
    };

    /// Whole messages as Proxmox renders them, where they come from.
    #[test]
    fn real_texts_get_their_kind() {
        let cases: &[(Option<u16>, &str, Origin, ErrorKind)] = &[
            (
                Some(500),
                "can't get size of '/dev/pve/vm-9999-pvc-1':   Failed to find logical volume \"pve/vm-9999-pvc-1\"",
                INFO,
                NotFound,
            ),
            (
                Some(500),
                "no such logical volume pve/vm-9999-pvc-1",
                INFO,
                NotFound,
            ),
            (
                Some(500),
                "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist",
                CONFIG,
                NotFound,
            ),
            (
                Some(500),
                "storage 'nope' does not exist",
                STORAGE,
                NotFound,
            ),
            (
                Some(500),
                "zfs error: cannot open 'rpool/data/vm-9999-x': dataset does not exist",
                INFO,
                NotFound,
            ),
            (
                Some(500),
                "rbd error: rbd: error opening image vm-9999-x: (2) No such file or directory",
                INFO,
                NotFound,
            ),
            (
                Some(500),
                "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout",
                SET,
                Busy,
            ),
            (
                Some(500),
                "cfs-lock 'file-replication_cfg' error: got lock request timeout",
                ALLOC,
                Busy,
            ),
            (Some(500), "VM is locked (backup)", SET, Busy),
            (
                Some(500),
                "checksum mismatch (file change by other user?)",
                SET,
                DigestMismatch,
            ),
            (
                Some(500),
                "detected modified configuration - file changed by other user? Try again.",
                SET,
                DigestMismatch,
            ),
            (
                Some(500),
                "hotplug problem - scsi3: unable to hotplug scsi3",
                SET,
                HotplugFailed,
            ),
            (Some(500), "cluster not ready - no quorum?", SET, Transient),
            (
                Some(500),
                "cfs-lock 'storage-nfs' error: no quorum!",
                ALLOC,
                Transient,
            ),
            (
                None,
                "unable to open file '/etc/pve/nodes/pve2/qemu-server/112.conf.tmp.4711' - Permission denied",
                Origin::Task("qmconfig"),
                Transient,
            ),
            (
                Some(403),
                "Permission check failed (/vms/100, VM.Config.Disk)",
                SET,
                PermissionDenied,
            ),
            (
                None,
                "403 Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)",
                Origin::Task("resize"),
                PermissionDenied,
            ),
            (
                None,
                "unable to create VM 105 - 403 Permission check failed (/, Sys.Modify for modifying tag 'csi-snapshot')",
                Origin::Task("qmcreate"),
                PermissionDenied,
            ),
            (Some(595), "Connection refused", CONFIG, Transient),
            (Some(596), "Connection timed out", SET, Transient),
            (
                Some(500),
                "disk image '/var/lib/vz/images/9999/vm-9999-x.raw' already exists",
                ALLOC,
                AlreadyExists,
            ),
            (
                Some(500),
                "unable to create VM 105 - VM 105 already exists on node 'pve2'",
                CREATE,
                AlreadyExists,
            ),
            (
                Some(500),
                "illegal name 'x' - should be 'vm-9999-*'",
                ALLOC,
                Other,
            ),
            (Some(500), "Internal Server Error", SET, Other),
        ];
        for (status, text, origin, kind) in cases {
            assert_eq!(classify(*status, text, *origin), *kind, "{text}");
        }
    }

    /// A broad text means its kind only where it is known to come from.
    #[test]
    fn texts_count_only_where_they_come_from() {
        let cases: &[(&str, Origin)] = &[
            // A volume's info naming a storage that is not configured: the
            // storage is missing, which says nothing of the volume.
            ("storage 'gone' does not exist", INFO),
            // An NFS storage that is not mounted: an errno, no missing image.
            (
                "unable to activate storage 'nfs' - directory '/mnt/pve/nfs' does not exist or is unreachable: No such file or directory",
                INFO,
            ),
            ("mkdir /mnt/pve/x: No such file or directory", LISTING),
            // A VM that exists, holding a disk that does: not a lost config.
            ("disk image '/dev/pve/vm-1-disk-0' already exists", CREATE),
            ("VM 105 already exists on node 'pve2'", ALLOC),
            ("hotplug problem - x", ALLOC),
            // Content.pm info without activating the storage: a file stat
            // could not read (an unmounted directory storage) or qemu-img
            // could not probe has "no format" too (Plugin.pm
            // file_size_info): the storage's listing settles it.
            (
                "volume_size_info on 'local:9999/vm-9999-x.raw' failed - no format",
                INFO,
            ),
        ];
        for (text, origin) in cases {
            assert_eq!(
                classify(Some(500), text, *origin),
                Other,
                "{text} at {origin:?}"
            );
        }
    }

    #[test]
    fn permission_failures_name_their_path_and_privilege() {
        assert_eq!(
            denied_privilege("403 Permission check failed (/storage/x, Datastore.AllocateSpace)"),
            Some(("/storage/x", "Datastore.AllocateSpace"))
        );
        assert_eq!(
            denied_privilege(
                "unable to create VM 1 - 403 Permission check failed (/, Sys.Modify for modifying tag 'a')"
            ),
            Some(("/", "Sys.Modify for modifying tag 'a'"))
        );
        assert_eq!(denied_privilege("Permission check failed"), None);
    }

    #[test]
    fn task_types_come_from_the_upid() {
        assert_eq!(
            task_type("UPID:pve2:0003A1F2:01B665C6:6B0C4CAF:qmconfig:112:root@pam:"),
            "qmconfig"
        );
        assert_eq!(task_type("nope"), "");
    }

    #[test]
    fn every_pattern_is_cited() {
        for k in CORPUS {
            assert!(
                k.source.contains(".pm") && k.parts.iter().all(|p| !p.is_empty()),
                "{k:?}"
            );
        }
    }
}
