//! What the controller writes into Proxmox and reads back as its own: the
//! tags of its VMs and the keys of its copy VMs' descriptions. Changing one
//! orphans every VM an earlier release made (docs/versioning.md).

/// Every VM the controller creates carries this tag.
pub const OWN_TAG: &str = "proxmox-csi";
/// The kind tag of a node's holder VM (offline changes, a resize).
pub const HOLDER_TAG: &str = "csi-holder";
/// The kind tag of a snapshot's copy VM.
pub const SNAPSHOT_TAG: &str = "csi-snapshot";
/// The kind tag of a clone's or restore's copy VM.
pub const VOLUME_TAG: &str = "csi-volume";
/// The kind tag of a replicated volume's holder VM.
pub const REPLICATED_TAG: &str = "csi-replicated";

/// Every tag the driver sets on its VMs: a cluster's tag policy must admit
/// them all (`pvecsictl doctor` checks).
pub const DRIVER_TAGS: [&str; 5] = [
    OWN_TAG,
    HOLDER_TAG,
    SNAPSHOT_TAG,
    VOLUME_TAG,
    REPLICATED_TAG,
];

/// The kind tags of the VMs that hold volumes for the controller (copies
/// and replicated volumes' holders): their disks are not attachments.
pub const COPY_TAGS: [&str; 3] = [SNAPSHOT_TAG, VOLUME_TAG, REPLICATED_TAG];

/// The close of every description the controller writes: who owns the VM
/// and what destroying it costs, for whoever finds it in the UI. A VM whose
/// description holds it is the driver's even without its tags.
pub const OWNED: &str = "Owned by the Proxmox CSI driver: destroying this VM destroys the volume data it holds. \
It is kept stopped and protected (protection: 1); the driver removes it when its Kubernetes object is deleted. \
Delete that object, not this VM.\n";

/// Keys of a copy VM's description (`key=value` lines).
pub mod described {
    /// The CSI handle of the copy's source.
    pub const SOURCE: &str = "csi-source";
    /// The storage the copy is kept on.
    pub const STORAGE: &str = "csi-storage";
    /// Unix seconds of the copy's creation.
    pub const CREATED: &str = "csi-created";
    /// Random, written once: a snapshot id names its copy VM by VMID and mark.
    pub const MARK: &str = "csi-mark";
    /// The UID of the claim a clone or restore is made for.
    pub const CLAIM_UID: &str = "csi-claim-uid";
}
