//! The CSI node ids ListVolumes and ControllerGetVolume report as a
//! volume's published nodes. The external-attacher compares them, as exact
//! strings, with the node id of each VolumeAttachment (its CSINode's), and
//! publishes again on a mismatch (external-attacher pkg/controller/
//! csi_handler.go ReconcileVA): they must be the ids NodeGetInfo gave.

use std::collections::HashMap;

use proxmox_csi_common::NodeId;

use super::Controller;

/// The node id each VM was last published to, as the caller gave it.
#[derive(Debug, Default)]
pub struct Published(std::sync::Mutex<HashMap<(String, u32), String>>);

impl Controller {
    pub fn remember_node_id(&self, region: &str, vmid: u32, node_id: &str) {
        if let Ok(mut m) = self.node_ids.0.lock() {
            m.insert((region.to_string(), vmid), node_id.to_string());
        }
    }

    /// The node id of VM `vm` for published_node_ids: the one it was
    /// published with; else the CSINode id (`registered`, from
    /// `registered_node_ids`) naming its VM id, or its name; else
    /// `<VM name>/<vmid>` (the node plugin's form when the Kubernetes node
    /// is named like its VM).
    pub fn published_node_id(
        &self,
        region: &str,
        vm: &crate::pve::api::VmResource,
        registered: &[(NodeId, Option<u32>)],
    ) -> String {
        let known = self
            .node_ids
            .0
            .lock()
            .ok()
            .and_then(|m| m.get(&(region.to_string(), vm.vmid)).cloned());
        let name = vm.name.clone().unwrap_or_default();
        known
            .or_else(|| {
                registered
                    .iter()
                    .find(|(_, v)| *v == Some(vm.vmid))
                    .map(|(n, _)| n.to_string())
            })
            .or_else(|| {
                registered
                    .iter()
                    .find(|(n, v)| v.is_none() && n.name == name)
                    .map(|(n, _)| n.to_string())
            })
            .unwrap_or_else(|| format!("{name}/{}", vm.vmid))
    }

    /// The node ids in CSINode objects, when the Kubernetes API is there,
    /// each with its VM id: the one in the id, else the one its Node names
    /// (providerID, instance-id annotation). A failure to read them is
    /// logged: the ids fall back as above.
    pub async fn registered_node_ids(&self) -> Vec<(NodeId, Option<u32>)> {
        let Some(k) = &self.kube else {
            return Vec::new();
        };
        let ids = match k.csi_node_ids(&self.driver_name).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, "reading CSINodes for published node ids");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for id in ids.iter().filter_map(|i| NodeId::parse(i).ok()) {
            let vmid = match id.vmid {
                Some(v) => Some(v),
                None => match k.node_vm(&id.name).await {
                    Ok(Some(crate::kube::NodeVm::Id(v))) => Some(v),
                    _ => None,
                },
            };
            out.push((id, vmid));
        }
        out
    }
}
