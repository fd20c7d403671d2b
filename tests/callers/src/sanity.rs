//! csi-sanity (kubernetes-csi/csi-test pkg/sanity/controller.go): the only
//! sender of ValidateVolumeCapabilities and GetSnapshot, and of ListVolumes
//! and ListSnapshots with filters and small pages (the external-attacher
//! pages ListVolumes only by its `--max-entries`, unset by default).

use std::collections::HashMap;

use crate::{PersistentVolume, capability, csi, csi_access_mode};

/// ValidateVolumeCapabilitiesRequest ("should return appropriate values
/// (no optional values added)"): the volume and one capability, no context.
pub fn validate_volume_capabilities(
    pv: &PersistentVolume,
) -> csi::ValidateVolumeCapabilitiesRequest {
    csi::ValidateVolumeCapabilitiesRequest {
        volume_id: pv.handle.clone(),
        volume_context: HashMap::new(),
        volume_capabilities: vec![capability(
            csi_access_mode(&pv.access_modes, crate::SNMW),
            pv.volume_mode,
            &pv.fs_type,
            &pv.mount_options,
        )],
        parameters: HashMap::new(),
        mutable_parameters: HashMap::new(),
        secrets: HashMap::new(),
    }
}

/// ListVolumesRequest ("pagination should detect volumes added between
/// pages and accept tokens when the last volume from a page is deleted"):
/// `max_entries` per page and the previous page's token.
pub fn list_volumes(max_entries: i32, starting_token: &str) -> csi::ListVolumesRequest {
    csi::ListVolumesRequest {
        max_entries,
        starting_token: starting_token.into(),
    }
}

/// ListSnapshotsRequest with paging and filters, as the suite's
/// ListSnapshots specs send them.
pub fn list_snapshots(
    max_entries: i32,
    starting_token: &str,
    source_volume_id: &str,
    snapshot_id: &str,
) -> csi::ListSnapshotsRequest {
    csi::ListSnapshotsRequest {
        max_entries,
        starting_token: starting_token.into(),
        source_volume_id: source_volume_id.into(),
        snapshot_id: snapshot_id.into(),
        secrets: HashMap::new(),
    }
}

/// GetSnapshotRequest (the suite's GetSnapshot specs): the snapshot id.
pub fn get_snapshot(snapshot_id: &str) -> csi::GetSnapshotRequest {
    csi::GetSnapshotRequest {
        snapshot_id: snapshot_id.into(),
        secrets: HashMap::new(),
    }
}
