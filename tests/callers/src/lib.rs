//! The only way the driver's tests build CSI requests: as the Kubernetes
//! component that sends each one builds it. Every builder names the source
//! it follows (repository, file, function); facts were read from those
//! sources, none of their code is here.
//!
//! - `provisioner`: kubernetes-csi/external-provisioner (CreateVolume,
//!   DeleteVolume, and the PersistentVolume it writes);
//! - `attacher`: kubernetes-csi/external-attacher (ControllerPublish and
//!   Unpublish from that PV, the ListVolumes reconcile);
//! - `resizer`: kubernetes-csi/external-resizer (ControllerExpand, Modify);
//! - `snapshotter`: kubernetes-csi/external-snapshotter (CreateSnapshot,
//!   DeleteSnapshot, ListSnapshots of a pre-provisioned snapshot);
//! - `health`: kubernetes-csi/external-health-monitor (ControllerGetVolume,
//!   its ListVolumes sweep);
//! - `identity`: the requests without fields (capabilities, Probe,
//!   NodeGetInfo) and their senders;
//! - `sanity`: kubernetes-csi/csi-test pkg/sanity, the only sender of
//!   ValidateVolumeCapabilities, GetSnapshot, paged and filtered
//!   ListVolumes/ListSnapshots, an empty GetCapacity, and names other than
//!   the sidecars' (the 128-byte names of its maximum-length specs);
//! - `kubelet`: kubernetes/kubernetes pkg/volume/csi (NodeStage, NodePublish,
//!   NodeExpand, NodeGetVolumeStats, NodeUnpublish, NodeUnstage and their
//!   directory layouts).
//!
//! A test of a malformed request builds it here and then breaks the one
//! field it is about, so that everything else is as the caller sends it.

pub mod attacher;
pub mod health;
pub mod identity;
pub mod kubelet;
pub mod provisioner;
pub mod resizer;
pub mod sanity;
pub mod snapshotter;

pub use proxmox_csi_proto::csi::v1 as csi;

/// A Kubernetes access mode, as a PVC or PV lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    ReadWriteOnce,
    ReadWriteOncePod,
    ReadOnlyMany,
    ReadWriteMany,
}

/// What the PersistentVolume's `spec.volumeMode` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VolumeMode {
    #[default]
    Filesystem,
    Block,
}

/// The PersistentVolume the external-provisioner writes for a volume: what
/// the attacher, resizer and kubelet build their requests from.
#[derive(Debug, Clone, PartialEq)]
pub struct PersistentVolume {
    /// `metadata.name`: the CreateVolume name, `pvc-<claim uid>`.
    pub name: String,
    pub driver: String,
    /// `spec.csi.volumeHandle`: CreateVolume's `volume_id`, unchanged.
    pub handle: String,
    /// `spec.csi.fsType` (empty for block volumes, or when none was given).
    pub fs_type: String,
    /// `spec.csi.volumeAttributes`.
    pub attributes: std::collections::HashMap<String, String>,
    /// `spec.csi.readOnly`.
    pub read_only: bool,
    pub access_modes: Vec<AccessMode>,
    /// `spec.mountOptions` (the StorageClass's `mountOptions`).
    pub mount_options: Vec<String>,
    pub volume_mode: VolumeMode,
    pub capacity_bytes: i64,
}

impl PersistentVolume {
    /// A PersistentVolume as the Kubernetes API returns it (JSON), for
    /// requests about a PV this driver's tools wrote (pvecsictl).
    pub fn from_json(pv: &serde_json::Value) -> Self {
        let spec = &pv["spec"];
        let csi = &spec["csi"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let access_modes = spec["accessModes"]
            .as_array()
            .map(|modes| {
                modes
                    .iter()
                    .filter_map(|m| match m.as_str() {
                        Some("ReadWriteOnce") => Some(AccessMode::ReadWriteOnce),
                        Some("ReadWriteOncePod") => Some(AccessMode::ReadWriteOncePod),
                        Some("ReadOnlyMany") => Some(AccessMode::ReadOnlyMany),
                        Some("ReadWriteMany") => Some(AccessMode::ReadWriteMany),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            name: text(&pv["metadata"]["name"]),
            driver: text(&csi["driver"]),
            handle: text(&csi["volumeHandle"]),
            fs_type: text(&csi["fsType"]),
            attributes: csi["volumeAttributes"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), text(v))).collect())
                .unwrap_or_default(),
            read_only: csi["readOnly"].as_bool().unwrap_or(false),
            access_modes,
            mount_options: spec["mountOptions"]
                .as_array()
                .map(|o| o.iter().map(text).collect())
                .unwrap_or_default(),
            volume_mode: if spec["volumeMode"] == "Block" {
                VolumeMode::Block
            } else {
                VolumeMode::Filesystem
            },
            capacity_bytes: 0,
        }
    }
}

/// kubernetes-csi/csi-lib-utils accessmodes/access_modes.go ToCSIAccessMode,
/// vendored by the sidecars: `modes` taken together; `snmw` is whether the
/// plugin advertises SINGLE_NODE_MULTI_WRITER.
pub fn csi_access_mode(
    modes: &[AccessMode],
    snmw: bool,
) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    if modes.contains(&AccessMode::ReadWriteMany) {
        return Mode::MultiNodeMultiWriter;
    }
    if modes.contains(&AccessMode::ReadOnlyMany) {
        return Mode::MultiNodeReaderOnly;
    }
    match (modes.contains(&AccessMode::ReadWriteOncePod), snmw) {
        (true, true) => Mode::SingleNodeSingleWriter,
        (true, false) => Mode::SingleNodeWriter,
        (false, true) => Mode::SingleNodeMultiWriter,
        (false, false) => Mode::SingleNodeWriter,
    }
}

/// A volume capability: block, or mount with `fs_type` and `mount_flags`.
pub fn capability(
    mode: csi::volume_capability::access_mode::Mode,
    volume_mode: VolumeMode,
    fs_type: &str,
    mount_flags: &[String],
) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode as CsiMode, AccessType, BlockVolume, MountVolume};
    let access_type = match volume_mode {
        VolumeMode::Block => AccessType::Block(BlockVolume {}),
        VolumeMode::Filesystem => AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            mount_flags: mount_flags.to_vec(),
            volume_mount_group: String::new(),
        }),
    };
    csi::VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(CsiMode { mode: mode as i32 }),
    }
}

/// This driver's name, which the sidecars learn from GetPluginInfo.
pub const DRIVER: &str = "csi.proxmox.sinextra.dev";

/// Whether this driver advertises SINGLE_NODE_MULTI_WRITER (controller and
/// node): it does, so RWO maps to SINGLE_NODE_MULTI_WRITER.
pub const SNMW: bool = true;
