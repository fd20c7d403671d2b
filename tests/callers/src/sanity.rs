//! kubernetes-csi/csi-test (pkg/sanity/controller.go, the suite CSI drivers
//! run in CI): the only sender of ValidateVolumeCapabilities and
//! GetSnapshot, of ListVolumes and ListSnapshots with filters and small
//! pages (the external-attacher pages ListVolumes only by its
//! `--max-entries`, unset by default), of an empty GetCapacity, and of
//! volume and snapshot names other than the sidecars' `pvc-<uid>` and
//! `snapshot-<uid>` (MakeCreateVolumeReq, MakeCreateSnapshotReq).

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

/// GetCapacityRequest ("should return capacity (no optional values
/// added)"): no capabilities, parameters or topology.
pub fn get_capacity() -> csi::GetCapacityRequest {
    csi::GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters: HashMap::new(),
        accessible_topology: None,
    }
}

/// CreateVolumeRequest as MakeCreateVolumeReq builds it: `name` as given,
/// one SINGLE_NODE_WRITER mount capability without a fsType,
/// `required_bytes` and no limit, the `--csi.testvolumeparameters`, no
/// topology requirement, no content source.
pub fn create_volume(
    name: &str,
    parameters: &[(&str, &str)],
    required_bytes: i64,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(
            csi::volume_capability::access_mode::Mode::SingleNodeWriter,
            crate::VolumeMode::Filesystem,
            "",
            &[],
        )],
        parameters: parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        secrets: HashMap::new(),
        volume_content_source: None,
        accessibility_requirements: None,
        mutable_parameters: HashMap::new(),
    }
}

/// CreateSnapshotRequest as MakeCreateSnapshotReq builds it: `name` as
/// given, the source, no parameters (`--csi.testsnapshotparameters` unset).
pub fn create_snapshot(name: &str, source_volume_id: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: source_volume_id.into(),
        name: name.into(),
        secrets: HashMap::new(),
        parameters: HashMap::new(),
    }
}

/// The CSI spec's general size limit of a string field (128 bytes), the
/// length of the names the "maximum-length name" specs send.
pub const MAX_NAME_BYTES: usize = 128;

/// A name of exactly `MAX_NAME_BYTES` ASCII bytes: `prefix`, a dash, then
/// lowercase hex digits (the suite's UniqueStringWithLength makes its names
/// this long, with a unique part).
pub fn max_length_name(prefix: &str) -> String {
    let mut name = format!("{prefix}-");
    let digits = b"0123456789abcdef";
    let mut i = 0;
    while name.len() < MAX_NAME_BYTES {
        name.push(char::from(digits[i % digits.len()]));
        i += 1;
    }
    name.truncate(MAX_NAME_BYTES);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_length_names_are_128_bytes() {
        let n = max_length_name("sanity-controller-create-maxlen");
        assert_eq!(n.len(), MAX_NAME_BYTES);
        assert!(n.starts_with("sanity-controller-create-maxlen-0123"));
    }
}
