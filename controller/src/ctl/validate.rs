//! ValidateVolumeCapabilities: whether a volume supports the capabilities
//! asked, by the same rules CreateVolume applies.

use proxmox_csi_proto::csi::v1 as csi;

use super::{Controller, check_capabilities};
use crate::error::CtlError;
use crate::pve::Deadline;

impl Controller {
    pub async fn validate(
        &self,
        r: &csi::ValidateVolumeCapabilitiesRequest,
        d: Deadline,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, CtlError> {
        if r.volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        if r.volume_capabilities.is_empty() {
            return Err(CtlError::invalid("volume_capabilities", "is required"));
        }
        let id = super::volume_ref("volume_id", &r.volume_id)?;
        let client = self.client_of("volume", &r.volume_id, &id.region)?;
        let exists = match self.node_for(&client, &id, d).await? {
            Some(node) => client
                .volume_info(&node, &id.storage, &id.disk, d)
                .await?
                .is_some(),
            None => false,
        };
        if !exists {
            return Err(CtlError::NotFound(format!(
                "volume {} does not exist",
                r.volume_id
            )));
        }
        Ok(
            match check_capabilities("volume_capabilities", &r.volume_capabilities) {
                Ok(()) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                        volume_context: r.volume_context.clone(),
                        volume_capabilities: r.volume_capabilities.clone(),
                        parameters: r.parameters.clone(),
                        mutable_parameters: r.mutable_parameters.clone(),
                    }),
                    message: String::new(),
                },
                Err(why) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: why,
                },
            },
        )
    }
}
