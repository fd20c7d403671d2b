//! The external-snapshotter's sidecar (kubernetes-csi/external-snapshotter
//! pkg/sidecar-controller/csi_handler.go CreateSnapshot and makeSnapshotName,
//! pkg/utils/util.go RemovePrefixedParameters).

use std::collections::HashMap;

use crate::{PersistentVolume, csi};

/// The class keys the snapshotter consumes and strips.
const STRIPPED: &[&str] = &[
    "csi.storage.k8s.io/snapshotter-secret-name",
    "csi.storage.k8s.io/snapshotter-secret-namespace",
    "csi.storage.k8s.io/snapshotter-list-secret-name",
    "csi.storage.k8s.io/snapshotter-list-secret-namespace",
];

/// CreateSnapshotRequest for a VolumeSnapshot with uid `snapshot_uid` of
/// `pv`: name `snapshot-<VolumeSnapshot uid>`, the class's parameters minus
/// its secret keys, plus the extra-create-metadata keys. The sidecar calls
/// it again, unchanged, until `ready_to_use`.
pub fn create_snapshot(
    snapshot_uid: &str,
    snapshot_name: &str,
    pv: &PersistentVolume,
    class_parameters: &[(&str, &str)],
) -> csi::CreateSnapshotRequest {
    let mut parameters: HashMap<String, String> = class_parameters
        .iter()
        .filter(|(k, _)| !STRIPPED.contains(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parameters.insert(
        "csi.storage.k8s.io/volumesnapshot/name".into(),
        snapshot_name.into(),
    );
    parameters.insert(
        "csi.storage.k8s.io/volumesnapshot/namespace".into(),
        "default".into(),
    );
    parameters.insert(
        "csi.storage.k8s.io/volumesnapshotcontent/name".into(),
        format!("snapcontent-{snapshot_uid}"),
    );
    csi::CreateSnapshotRequest {
        source_volume_id: pv.handle.clone(),
        name: format!("snapshot-{snapshot_uid}"),
        secrets: HashMap::new(),
        parameters,
    }
}

/// DeleteSnapshotRequest: the content's `status.snapshotHandle`.
pub fn delete_snapshot(snapshot_handle: &str) -> csi::DeleteSnapshotRequest {
    csi::DeleteSnapshotRequest {
        snapshot_id: snapshot_handle.into(),
        secrets: HashMap::new(),
    }
}

/// ListSnapshotsRequest of a pre-provisioned VolumeSnapshotContent
/// (pkg/snapshotter/snapshotter.go GetSnapshotStatus): only its handle.
pub fn list_snapshot(snapshot_handle: &str) -> csi::ListSnapshotsRequest {
    csi::ListSnapshotsRequest {
        max_entries: 0,
        starting_token: String::new(),
        source_volume_id: String::new(),
        snapshot_id: snapshot_handle.into(),
        secrets: HashMap::new(),
    }
}
