//! The external-health-monitor's controller
//! (kubernetes-csi/external-health-monitor pkg/csi-handler/pv_handler.go
//! ControllerListVolumeConditions and ControllerGetVolumeCondition).

use crate::{PersistentVolume, csi};

/// ControllerGetVolumeRequest for a PV: its handle only.
pub fn controller_get_volume(pv: &PersistentVolume) -> csi::ControllerGetVolumeRequest {
    csi::ControllerGetVolumeRequest {
        volume_id: pv.handle.clone(),
    }
}

/// ListVolumesRequest of the condition sweep: no page size, the previous
/// answer's `next_token` until it is empty.
pub fn list_volumes(starting_token: &str) -> csi::ListVolumesRequest {
    csi::ListVolumesRequest {
        max_entries: 0,
        starting_token: starting_token.into(),
    }
}
