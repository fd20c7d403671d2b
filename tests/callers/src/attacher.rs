//! The external-attacher (kubernetes-csi/external-attacher
//! pkg/controller/csi_handler.go csiAttach/csiDetach, pkg/attacher/attacher.go
//! Attach/Detach, pkg/controller/util.go GetVolumeCapabilities).

use std::collections::HashMap;

use crate::{PersistentVolume, capability, csi, csi_access_mode};

/// ControllerPublishVolumeRequest for a VolumeAttachment of `pv` to the
/// node whose CSINode lists `node_id` for this driver: the PV's
/// volumeAttributes as they are (the provisioner's identity key included),
/// `readonly` false whatever `spec.csi.readOnly` says, because the driver
/// does not advertise PUBLISH_READONLY (csiAttach: "CO MUST set this field
/// to false if SP does not have the PUBLISH_READONLY controller
/// capability"), as the Go driver does not; kubelet's read-only bind mount
/// keeps such a pod from writing. One capability from all the PV's access modes, fsType from the PV
/// (`--default-fstype` is empty).
pub fn controller_publish(
    pv: &PersistentVolume,
    node_id: &str,
) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: pv.handle.clone(),
        node_id: node_id.to_string(),
        volume_capability: Some(capability(
            csi_access_mode(&pv.access_modes, crate::SNMW),
            pv.volume_mode,
            &pv.fs_type,
            &pv.mount_options,
        )),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: pv.attributes.clone(),
    }
}

/// ControllerUnpublishVolumeRequest (csiDetach): handle and node id.
pub fn controller_unpublish(
    pv: &PersistentVolume,
    node_id: &str,
) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: pv.handle.clone(),
        node_id: node_id.to_string(),
        secrets: HashMap::new(),
    }
}

/// The first page of the reconcile's ListVolumes (`--max-entries` 0).
pub fn list_volumes(starting_token: &str) -> csi::ListVolumesRequest {
    csi::ListVolumesRequest {
        max_entries: 0,
        starting_token: starting_token.to_string(),
    }
}

/// ReconcileVA's verdict for one VolumeAttachment: is `node_id` among the
/// volume's published nodes, compared as exact strings? When this differs
/// from the attachment's `status.attached`, the attacher publishes (or
/// unpublishes) again.
pub fn published(
    entries: &[csi::list_volumes_response::Entry],
    handle: &str,
    node_id: &str,
) -> bool {
    entries.iter().any(|e| {
        e.volume.as_ref().is_some_and(|v| v.volume_id == handle)
            && e.status
                .as_ref()
                .is_some_and(|s| s.published_node_ids.iter().any(|n| n == node_id))
    })
}
