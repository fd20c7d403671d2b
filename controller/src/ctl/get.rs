//! ControllerGetVolume: one volume, where it is published, and its condition.

use std::collections::HashMap;

use proxmox_csi_proto::csi::v1 as csi;

use super::Controller;
use crate::drive;
use crate::error::CtlError;
use crate::pve::Deadline;

impl Controller {
    pub async fn get_volume(
        &self,
        volume_id: &str,
        d: Deadline,
    ) -> Result<csi::ControllerGetVolumeResponse, CtlError> {
        if volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        let id = super::volume_ref("volume_id", volume_id)?;
        let client = self.client_of("volume", volume_id, &id.region)?;
        let node = self.node_for(&client, &id, d).await?;
        let info = match &node {
            Some(n) => client.volume_info(n, &id.storage, &id.disk, d).await?,
            None => None,
        };
        let Some(info) = info else {
            return Err(CtlError::NotFound(format!(
                "volume {volume_id} does not exist"
            )));
        };
        let mut problems = Vec::new();
        let mut published = Vec::new();
        if let Some(vmid) = self
            .attachments
            .vm_of(&client, &self.vms, &id.volid(), id.zone.as_deref(), d)
            .await?
            && let Some(vm) = self.vms.node_of(&client, vmid, d).await?
        {
            let cfg = client.vm_config(&vm.node, vmid, d).await?;
            if let Some(lock) = cfg.values.get("lock") {
                problems.push(format!("VM {vmid} is locked ({lock})"));
            }
            let pending = client.vm_pending(&vm.node, vmid, d).await?;
            let slots = drive::slots_with(&cfg.values, &id.volid());
            // The index may be a minute behind: published only if the VM says so.
            if !slots.is_empty() {
                published.push(self.published_node_id(
                    &id.region,
                    &vm,
                    &self.registered_node_ids().await,
                ));
            }
            if pending
                .iter()
                .any(|p| slots.contains(&p.key) && (p.pending.is_some() || p.delete.is_some()))
            {
                problems.push(format!("VM {vmid} has a change of this disk pending"));
            }
        }
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: info.size as i64,
                volume_id: volume_id.to_string(),
                volume_context: HashMap::new(),
                content_source: None,
                accessible_topology: Vec::new(),
            }),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: published,
                volume_condition: Some(csi::VolumeCondition {
                    abnormal: !problems.is_empty(),
                    message: if problems.is_empty() {
                        "volume is healthy".into()
                    } else {
                        problems.join("; ")
                    },
                }),
            }),
        })
    }
}
