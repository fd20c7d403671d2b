//! Holder VMs: a stopped VM per Proxmox node that a detached disk can be
//! attached to when Proxmox can only act on it through a VM (resizing it
//! offline). Creating one needs `VM.Allocate`, beyond the minimal role; the
//! error says so.

use reqwest::Method;

use super::Controller;
use crate::error::CtlError;
use crate::pve::{Client, Deadline, PveError};

pub fn holder_name(node: &str) -> String {
    format!("proxmox-csi-holder-{node}")
}

impl Controller {
    /// The holder VM on `node`, created (stopped, no disks) if missing.
    pub async fn holder(&self, client: &Client, node: &str, d: Deadline) -> Result<u32, CtlError> {
        let name = holder_name(node);
        if let Some(vm) = self.vms.by_name(client, &name, d).await?
            && vm.node == node
        {
            return Ok(vm.vmid);
        }
        let denied = |e: PveError| match e.status().map(|s| s.as_u16()) {
            Some(403) => CtlError::FailedPrecondition(format!(
                "a holder VM is needed on {node} and the API token may not create one ({}); \
                 grant VM.Allocate to the CSI role, or expand the volume while it is attached",
                e.message()
            )),
            _ => CtlError::from(e),
        };
        let vmid: String = client.call(Method::GET, "/cluster/nextid", &[], d).await?;
        let form = [
            ("vmid", vmid.clone()),
            ("name", name.clone()),
            ("memory", "128".to_string()),
            ("cores", "1".to_string()),
            ("scsihw", "virtio-scsi-single".to_string()),
            ("description", "Holds Proxmox CSI disks while they are changed offline. Keep it stopped.".to_string()),
        ];
        let upid: String = client
            .call(Method::POST, &format!("/nodes/{node}/qemu"), &form, d)
            .await
            .map_err(denied)?;
        client.wait_task(&upid, d).await?;
        self.vms.invalidate(client.region()).await;
        tracing::info!(node, vmid, "holder VM created");
        vmid.parse().map_err(|_| CtlError::Unavailable(format!("nextid answered {vmid:?}")))
    }
}
