//! The controller's own VMs, all stopped and tagged `proxmox-csi`:
//! - a holder per Proxmox node, which a detached disk visits when Proxmox
//!   can only act on it through a VM (resizing it offline);
//! - a copy VM per snapshot or cloned volume (see `copy`).
//!
//! Creating one needs `VM.Allocate`, beyond the minimal role; the error
//! says so.

use reqwest::Method;

use super::Controller;
use crate::error::CtlError;
use crate::pve::api::VmResource;
use crate::pve::{Client, Deadline, PveError};

/// Every VM the controller creates carries this tag.
pub const TAG: &str = "proxmox-csi";

pub fn holder_name(node: &str) -> String {
    format!("proxmox-csi-holder-{node}")
}

/// A new VM's identity and notes.
#[derive(Debug)]
pub struct NewVm<'a> {
    pub name: &'a str,
    /// Its kind, tagged beside `proxmox-csi`: `csi-holder`, `csi-snapshot`, `csi-volume`.
    pub kind: &'a str,
    pub description: String,
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
        let vm = NewVm {
            name: &name,
            kind: "csi-holder",
            description: "Holds Proxmox CSI disks while they are changed offline. Keep it stopped.".into(),
        };
        let vmid = self.new_vm(client, node, &vm, d).await?.vmid;
        tracing::info!(node, vmid, "holder VM created");
        Ok(vmid)
    }

    /// Creates a stopped VM without disks on `node` under the next free
    /// VMID (another VMID is tried when a concurrent create took it).
    pub async fn new_vm(&self, client: &Client, node: &str, vm: &NewVm<'_>, d: Deadline) -> Result<VmResource, CtlError> {
        let denied = |e: PveError| match e.status().map(|s| s.as_u16()) {
            Some(403) => CtlError::FailedPrecondition(format!(
                "the controller needs a VM of its own on {node} ({}) and the API token may not create one ({}); \
                 grant VM.Allocate to the CSI role",
                vm.name,
                e.message()
            )),
            _ => CtlError::from(e),
        };
        let mut last = String::new();
        for _ in 0..5 {
            let vmid: String = client.call(Method::GET, "/cluster/nextid", &[], d).await?;
            let form = [
                ("vmid", vmid.clone()),
                ("name", vm.name.to_string()),
                ("tags", format!("{TAG};{}", vm.kind)),
                ("memory", "128".to_string()),
                ("cores", "1".to_string()),
                ("scsihw", "virtio-scsi-single".to_string()),
                ("description", vm.description.clone()),
            ];
            let id: u32 = vmid.parse().map_err(|_| CtlError::Unavailable(format!("nextid answered {vmid:?}")))?;
            match client.create_vm(node, &form, d).await {
                Ok(()) => {
                    self.vms.invalidate(client.region()).await;
                    return Ok(VmResource {
                        vmid: id,
                        node: node.to_string(),
                        name: Some(vm.name.to_string()),
                        kind: "qemu".into(),
                        template: None,
                        tags: Some(format!("{TAG};{}", vm.kind)),
                    });
                }
                Err(e) if e.message().contains("already exists") => last = e.message(),
                Err(e) => return Err(denied(e)),
            }
        }
        Err(CtlError::Unavailable(format!("creating VM {} on {node}: every VMID tried was taken meanwhile ({last})", vm.name)))
    }
}
