//! The external-resizer (kubernetes-csi/external-resizer pkg/csi/client.go
//! Expand and Modify, pkg/resizer/csi_resizer.go Resize).

use std::collections::HashMap;

use crate::{PersistentVolume, capability, csi, csi_access_mode};

/// ControllerExpandVolumeRequest: the new request as `required_bytes`
/// (no limit), and always a capability built from the PV (no default fsType).
pub fn controller_expand(
    pv: &PersistentVolume,
    new_bytes: i64,
) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: pv.handle.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: new_bytes,
            limit_bytes: 0,
        }),
        secrets: HashMap::new(),
        volume_capability: Some(capability(
            csi_access_mode(&pv.access_modes, crate::SNMW),
            pv.volume_mode,
            &pv.fs_type,
            &pv.mount_options,
        )),
    }
}

/// ControllerModifyVolumeRequest: the VolumeAttributesClass's parameters
/// as they are (`--extra-modify-metadata` off, its default).
pub fn controller_modify(
    pv: &PersistentVolume,
    class_parameters: &[(&str, &str)],
) -> csi::ControllerModifyVolumeRequest {
    csi::ControllerModifyVolumeRequest {
        volume_id: pv.handle.clone(),
        secrets: HashMap::new(),
        mutable_parameters: class_parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}
