//! What the controller and the node agree on about a disk: the publish
//! context ControllerPublishVolume writes (`PublishContext`), and the WWN
//! and serial the controller derives from a volume's handle, which hostd
//! checks again on the node before it touches the disk.

use sha2::{Digest, Sha256};

/// The driver's name by default: the Go driver's, which this driver
/// replaces in place (its CSIDriver, StorageClasses and PersistentVolumes
/// name it).
pub const DRIVER_NAME: &str = "csi.proxmox.sinextra.dev";

/// The topology keys: a volume's and a node's Proxmox cluster (region) and
/// Proxmox node (zone), as the Go driver and the cloud provider write them.
pub const TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
pub const TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";

/// Publish context: the disk's WWN (`0x` + 16 hex digits).
pub const CTX_WWN: &str = "wwn";
/// Publish context: the disk's SCSI serial, when the controller set one.
pub const CTX_SERIAL: &str = "serial";
/// Publish context: the disk's SCSI LUN as the guest sees it (the slot
/// number `N` of `scsiN` on virtio-scsi and megasas; 0 on lsi and pvscsi,
/// which address a disk by its target).
pub const CTX_LUN: &str = "lun";
/// Publish context: the disk's SCSI target as the guest sees it.
pub const CTX_TARGET: &str = "target";
/// Publish context the Go driver's node plugin reads: `/dev/disk/by-id/wwn-<wwn>`.
pub const CTX_GO_DEVICE_PATH: &str = "DevicePath";
/// Volume and publish context of the Go driver's restore larger than its
/// snapshot: its CreateVolume copies the snapshot as it is and records the
/// size asked for (`resizeSizeBytes`), its ControllerPublishVolume grows
/// the disk to it and tells the node plugin (`resizeRequired`) to grow the
/// filesystem at stage (proxmox-csi-plugin pkg/csi/controller.go
/// CreateVolume and ControllerPublishVolume, pkg/csi/node.go
/// NodeStageVolume).
pub const CTX_GO_RESIZE_REQUIRED: &str = "resizeRequired";
pub const CTX_GO_RESIZE_SIZE_BYTES: &str = "resizeSizeBytes";

/// What ControllerPublishVolume tells the node about the disk it attached,
/// as the publish context carries it (`to_map`, `from_map`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishContext {
    /// The disk's WWN (`0x` + 16 hex digits), by which the node finds it.
    pub wwn: String,
    /// The disk's SCSI serial (`serial_for`), which hostd checks against
    /// the handle; `None` from a Go driver's controller.
    pub serial: Option<String>,
    /// The SCSI address as the guest sees it; `None` from a Go driver's
    /// controller.
    pub address: Option<ScsiAddress>,
    /// The Go driver's `resizeRequired`: for a Go node plugin still staging
    /// during a switch of drivers, which grows the filesystem at stage.
    pub go_resize_required: bool,
}

/// A disk's SCSI target and LUN, as the guest sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScsiAddress {
    pub target: u32,
    pub lun: u32,
}

/// A publish context the node cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    #[error("is required: ControllerPublishVolume sets it when it attaches the disk")]
    NoWwn,
    #[error("{0:?} does not name a disk by WWN (/dev/disk/by-id/wwn-0x…)")]
    NotAWwnPath(String),
    #[error("{value:?} is not a number")]
    NotANumber { key: &'static str, value: String },
}

impl ContextError {
    /// The request field at fault.
    pub fn field(&self) -> String {
        let key = match self {
            Self::NoWwn => CTX_WWN,
            Self::NotAWwnPath(_) => CTX_GO_DEVICE_PATH,
            Self::NotANumber { key, .. } => key,
        };
        format!("publish_context.{key}")
    }
}

/// The Go driver's device path of a WWN (what its node plugin reads).
const GO_WWN_PATH: &str = "/dev/disk/by-id/wwn-";

impl PublishContext {
    /// The publish context's entries, the Go driver's `DevicePath` among
    /// them so that its node plugin stages during a switch of drivers.
    pub fn to_map(&self) -> std::collections::HashMap<String, String> {
        let mut ctx = std::collections::HashMap::from([
            (CTX_WWN.to_string(), self.wwn.clone()),
            (
                CTX_GO_DEVICE_PATH.to_string(),
                format!("{GO_WWN_PATH}{}", self.wwn),
            ),
        ]);
        if let Some(serial) = self.serial.as_ref().filter(|s| !s.is_empty()) {
            ctx.insert(CTX_SERIAL.into(), serial.clone());
        }
        if let Some(a) = self.address {
            ctx.insert(CTX_LUN.into(), a.lun.to_string());
            ctx.insert(CTX_TARGET.into(), a.target.to_string());
        }
        if self.go_resize_required {
            ctx.insert(CTX_GO_RESIZE_REQUIRED.into(), "true".into());
        }
        ctx
    }

    /// Reads a publish context: this driver's (`wwn`, `serial`, `lun`,
    /// `target`), or a Go driver's (`DevicePath` =
    /// `/dev/disk/by-id/wwn-0x…`), so that volumes attached before a switch
    /// of drivers keep staging. Keys it does not know are ignored, as the
    /// spec lets a CO pass the context through unchanged.
    pub fn from_map(ctx: &std::collections::HashMap<String, String>) -> Result<Self, ContextError> {
        let wwn = match (ctx.get(CTX_WWN), ctx.get(CTX_GO_DEVICE_PATH)) {
            (Some(w), _) if !w.is_empty() => w.clone(),
            (_, Some(p)) => p
                .strip_prefix(GO_WWN_PATH)
                .map(str::to_string)
                .ok_or_else(|| ContextError::NotAWwnPath(p.clone()))?,
            _ => return Err(ContextError::NoWwn),
        };
        let number = |key: &'static str| -> Result<Option<u32>, ContextError> {
            ctx.get(key)
                .map(|v| {
                    v.parse().map_err(|_| ContextError::NotANumber {
                        key,
                        value: v.clone(),
                    })
                })
                .transpose()
        };
        let address = match (number(CTX_TARGET)?, number(CTX_LUN)?) {
            (Some(target), Some(lun)) => Some(ScsiAddress { target, lun }),
            _ => None,
        };
        Ok(Self {
            wwn,
            serial: ctx.get(CTX_SERIAL).filter(|s| !s.is_empty()).cloned(),
            address,
            go_resize_required: ctx.get(CTX_GO_RESIZE_REQUIRED).map(String::as_str) == Some("true"),
        })
    }
}

/// The filesystems a volume may be formatted with, the default first: ext4
/// and xfs, and ext2 and ext3, which the Go driver formats too (it hands any
/// type to mkfs.<type>, and its image has e2fsprogs and xfsprogs only). The
/// controller, the node plugin and hostd accept exactly these.
pub const FS_TYPES: [&str; 4] = ["ext4", "xfs", "ext3", "ext2"];

/// `FS_TYPES` as an error message lists them.
pub fn fs_types_allowed() -> String {
    FS_TYPES.join(", ")
}

/// Prefix of every serial [`serial_for`] makes: a disk whose serial starts
/// with it was attached by this driver, and belongs to exactly one handle.
pub const SERIAL_PREFIX: &str = "csi-";

/// The WWN of a volume: NAA type 5, from a hash of the handle; `salt`
/// changes it when the VM already has a drive with that WWN.
pub fn wwn_for(handle: &str, salt: u32) -> String {
    let h = Sha256::digest(format!("{handle}#{salt}").as_bytes());
    let mut v = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
    v = (v & 0x0FFF_FFFF_FFFF_FFFF) | 0x5000_0000_0000_0000;
    format!("0x{v:016x}")
}

/// A drive serial (≤ 20 characters of Proxmox's allowed set) from the handle.
pub fn serial_for(handle: &str) -> String {
    let h = Sha256::digest(handle.as_bytes());
    let hex: String = h.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{SERIAL_PREFIX}{hex}")
}

/// What a volume this driver's CreateVolume made from nothing was made for,
/// written into its disk name as `<name><mark><cluster id>`. Copies,
/// restores and the Go driver's disks carry no mark. hostd reads the mark
/// from the handle a disk's serial proves (`serial_for`), so the node plugin
/// cannot claim it for a disk that lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlankFor {
    /// Created for a filesystem only: its first stage formats it whatever
    /// stale bytes the storage left in it (thick LVM keeps a removed
    /// volume's extents as they were).
    Filesystem,
    /// Created with block access among its capabilities: a raw disk's
    /// every byte may be data, so no stage ever formats over bytes.
    Block,
    /// `.csi-`: written before what a volume was made for was recorded (the
    /// Go node plugin may have formatted such a disk during a switch of
    /// drivers): the cluster id alone, no first-stage rule.
    Unrecorded,
}

impl BlankFor {
    pub const ALL: [Self; 3] = [Self::Filesystem, Self::Block, Self::Unrecorded];

    /// The mark between a disk's name and its cluster id. The Go driver
    /// reads the PV name as what follows `vm-<vmid>-` up to the first `.`
    /// (pkg/utils/volume volume.go `PV`), so a suffix keeps it.
    pub fn mark(self) -> &'static str {
        match self {
            Self::Filesystem => ".csf-",
            Self::Block => ".csb-",
            Self::Unrecorded => ".csi-",
        }
    }
}

/// Longest cluster id a mark carries: 1 to 16 of `[a-z0-9]`, valid in a
/// disk name on every storage.
pub const CLUSTER_ID_MAX: usize = 16;

/// Whether `raw` is a cluster id as marks carry them.
pub fn is_cluster_id(raw: &str) -> bool {
    !raw.is_empty()
        && raw.len() <= CLUSTER_ID_MAX
        && raw
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// The mark and cluster id at the end of a disk name, a volid or a handle
/// (`<storage>:`, `<vmid>/` and the handle's other parts may precede it, a
/// format extension may follow); `None` for a disk without one.
pub fn disk_mark(disk: &str) -> Option<(BlankFor, &str)> {
    let base = disk.rsplit(['/', ':']).next().unwrap_or(disk);
    let base = [".raw", ".qcow2", ".vmdk"]
        .iter()
        .find_map(|ext| base.strip_suffix(ext))
        .unwrap_or(base);
    BlankFor::ALL.into_iter().find_map(|kind| {
        let (_, id) = base.rsplit_once(kind.mark())?;
        is_cluster_id(id).then_some((kind, id))
    })
}

/// Whether a name holds a mark anywhere (a volume name that does would read
/// as a marked disk's).
pub fn holds_mark(name: &str) -> bool {
    BlankFor::ALL.iter().any(|k| name.contains(k.mark()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wwns_are_naa5_and_stable() {
        let a = wwn_for("r/pve2/local-lvm/vm-9999-pvc-a", 0);
        assert_eq!(a, wwn_for("r/pve2/local-lvm/vm-9999-pvc-a", 0));
        assert_ne!(a, wwn_for("r/pve2/local-lvm/vm-9999-pvc-a", 1));
        assert!(a.starts_with("0x5") && a.len() == 18, "{a}");
    }

    #[test]
    fn serials_fit_proxmox_and_name_their_handle() {
        // Fixed values: a change here breaks every attached disk's identity check.
        assert_eq!(serial_for("r/pve2/local-lvm/vm-9999-pvc-a").len(), 20);
        assert_eq!(serial_for("a"), "csi-ca978112ca1bbdca");
        assert_ne!(
            serial_for("r/pve2/local-lvm/vm-9999-pvc-a"),
            serial_for("r/pve2/local-lvm/vm-9999-pvc-b")
        );
    }
    proptest::proptest! {
        /// Whatever the controller writes, the node reads back as written,
        /// and the Go node plugin finds the same disk.
        #[test]
        fn a_publish_context_reads_back_as_written(
            wwn in "0x5[0-9a-f]{15}",
            serial in proptest::option::of("csi-[0-9a-f]{16}"),
            address in proptest::option::of((0u32..16, 0u32..31)),
            go_resize_required: bool,
        ) {
            let written = PublishContext {
                wwn: wwn.clone(),
                serial,
                address: address.map(|(target, lun)| ScsiAddress { target, lun }),
                go_resize_required,
            };
            let map = written.to_map();
            proptest::prop_assert_eq!(PublishContext::from_map(&map), Ok(written));
            proptest::prop_assert_eq!(
                map.get(CTX_GO_DEVICE_PATH).cloned(),
                Some(format!("/dev/disk/by-id/wwn-{wwn}"))
            );
        }

        /// A Go controller's context (DevicePath only) names the same disk.
        #[test]
        fn a_go_publish_context_names_its_disk(wwn in "0x5[0-9a-f]{15}") {
            let go = std::collections::HashMap::from([(
                CTX_GO_DEVICE_PATH.to_string(),
                format!("/dev/disk/by-id/wwn-{wwn}"),
            )]);
            let read = PublishContext::from_map(&go);
            proptest::prop_assert_eq!(read.map(|c| (c.wwn, c.serial, c.address)), Ok((wwn, None, None)));
        }
    }

    #[test]
    fn a_publish_context_without_a_disk_names_the_key_at_fault() {
        let err = PublishContext::from_map(&Default::default()).unwrap_err();
        assert_eq!(err.field(), "publish_context.wwn");
        let sdb = std::collections::HashMap::from([(
            CTX_GO_DEVICE_PATH.to_string(),
            "/dev/sdb".to_string(),
        )]);
        let err = PublishContext::from_map(&sdb).unwrap_err();
        assert_eq!(
            format!("{}: {err}", err.field()),
            "publish_context.DevicePath: \"/dev/sdb\" does not name a disk by WWN (/dev/disk/by-id/wwn-0x…)"
        );
        let lun = std::collections::HashMap::from([
            (CTX_WWN.to_string(), "0x5000000000000001".to_string()),
            (CTX_LUN.to_string(), "x".to_string()),
        ]);
        assert_eq!(
            PublishContext::from_map(&lun).unwrap_err().field(),
            "publish_context.lun"
        );
    }

    #[test]
    fn marks_read_back_from_names_volids_and_handles() {
        for name in [
            "vm-9999-pvc-a.csf-5bc58ec71c2d",
            "local-lvm:vm-9999-pvc-a.csf-5bc58ec71c2d",
            "r/z/local-lvm/vm-9999-pvc-a.csf-5bc58ec71c2d",
            "r//nfs/9999/vm-9999-pvc-a.csf-5bc58ec71c2d.qcow2",
        ] {
            assert_eq!(
                disk_mark(name),
                Some((BlankFor::Filesystem, "5bc58ec71c2d")),
                "{name}"
            );
        }
        assert_eq!(
            disk_mark("r/z/s/vm-9999-pvc-a.csb-prod1"),
            Some((BlankFor::Block, "prod1"))
        );
        assert_eq!(
            disk_mark("r/z/s/vm-9999-pvc-a.csi-prod1"),
            Some((BlankFor::Unrecorded, "prod1"))
        );
        for unmarked in [
            "vm-9999-pvc-a",
            "r/z/s/vm-9999-pvc-a",
            "vm-9999-a.csf-UPPER",
            "vm-9999-a.csf-",
            "vm-9999-a.csf-x.y",
            "vm-9999-a.csf-01234567890123456",
        ] {
            assert_eq!(disk_mark(unmarked), None, "{unmarked}");
        }
        assert!(
            holds_mark("x.csb-1")
                && holds_mark("x.csi-")
                && holds_mark("x.csf-")
                && !holds_mark("csi-x")
        );
    }
}
