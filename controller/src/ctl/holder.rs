//! The controller's own VMs, all stopped and tagged `proxmox-csi`:
//! - a holder per Proxmox node, which a detached disk visits when Proxmox
//!   can only act on it through a VM (resizing it offline);
//! - a copy VM per snapshot or cloned volume (see `copy`).
//!
//! Creating one needs `NEW_VM_PRIVILEGES` beyond the minimal role; the
//! error says so.

use reqwest::Method;
use serde_json::Value;

use super::Controller;
use crate::error::CtlError;
use crate::pve::api::VmResource;
use crate::pve::{Client, Deadline, ErrorKind, PveError};
use crate::vms::name_tag;

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
        if let Some(vm) = self.vms.own(client, &name, "csi-holder", d).await?
            && vm.node == node
        {
            return Ok(vm.vmid);
        }
        let vm = NewVm {
            name: &name,
            kind: "csi-holder",
            description: "Holds Proxmox CSI disks while they are changed offline. Keep it stopped."
                .into(),
        };
        let vmid = self.new_vm(client, node, &vm, d).await?.vmid;
        tracing::info!(node, vmid, "holder VM created");
        Ok(vmid)
    }

    /// Creates a stopped VM without disks on `node` under the next free
    /// VMID (another VMID is tried when a concurrent create took it).
    pub async fn new_vm(
        &self,
        client: &Client,
        node: &str,
        vm: &NewVm<'_>,
        d: Deadline,
    ) -> Result<VmResource, CtlError> {
        let denied = |e: PveError| match e.kind() {
            ErrorKind::PermissionDenied => CtlError::FailedPrecondition(format!(
                "the controller needs a VM of its own on {node} ({}) and the API token may not create one ({}); \
                 grant {} to the CSI role",
                vm.name,
                e.message(),
                NEW_VM_PRIVILEGES.join(", ")
            )),
            _ => CtlError::from(e),
        };
        let tags = format!("{TAG};{};{}", vm.kind, name_tag(vm.name));
        let mut last = String::new();
        for _ in 0..5 {
            let vmid = self.next_vmid(client, d).await?;
            let form = [
                ("vmid", vmid.to_string()),
                ("name", vm.name.to_string()),
                ("tags", tags.clone()),
                ("memory", "128".to_string()),
                ("cores", "1".to_string()),
                ("scsihw", "virtio-scsi-single".to_string()),
                ("description", vm.description.clone()),
            ];
            match client.create_vm(node, &form, d).await {
                Ok(()) => {
                    self.vms.invalidate(client.region()).await;
                    return Ok(VmResource {
                        vmid,
                        node: node.to_string(),
                        name: Some(vm.name.to_string()),
                        kind: "qemu".into(),
                        template: None,
                        tags: Some(tags),
                    });
                }
                // A concurrent create took the VMID (qemu-server create_vm:
                // "unable to create VM N - VM N already exists on node 'x'").
                Err(e) if e.kind() == ErrorKind::AlreadyExists => last = e.message(),
                Err(e) => return Err(denied(e)),
            }
        }
        Err(CtlError::Unavailable(format!(
            "creating VM {} on {node}: every VMID tried was taken meanwhile ({last})",
            vm.name
        )))
    }

    /// The next free VMID, never the placeholder's: `/cluster/nextid`
    /// picks the lowest free id of the datacenter's next-id range
    /// (pve-manager PVE/API2/Cluster.pm nextid), and the placeholder VMID
    /// usually has no VM, so it may well be that one. A VM under it would
    /// own every CSI disk, and destroying it would free them all. Proxmox
    /// answers the id as a JSON string; a number is taken too.
    async fn next_vmid(&self, client: &Client, d: Deadline) -> Result<u32, CtlError> {
        let parse = |v: &Value| match v {
            Value::String(s) => s.parse::<u32>().ok(),
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        };
        let first: Value = client.call(Method::GET, "/cluster/nextid", &[], d).await?;
        let id = parse(&first)
            .ok_or_else(|| CtlError::Unavailable(format!("/cluster/nextid answered {first}")))?;
        if id != self.controller_vmid {
            return Ok(id);
        }
        // The placeholder's id is free: ask for the ids after it, one by one
        // (`vmid` makes nextid check that id: 400 "VM N already exists").
        for candidate in (id + 1..).take(100) {
            match client
                .call::<Value>(
                    Method::GET,
                    "/cluster/nextid",
                    &[("vmid", candidate.to_string())],
                    d,
                )
                .await
            {
                Ok(v) => {
                    return parse(&v).ok_or_else(|| {
                        CtlError::Unavailable(format!("/cluster/nextid answered {v}"))
                    });
                }
                Err(e) if e.status().is_some_and(|s| s.as_u16() == 400) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CtlError::ResourceExhausted(format!(
            "no free VMID after the placeholder VMID {}: the next 100 are taken",
            self.controller_vmid
        )))
    }
}

/// What creating one of the controller's VMs needs beyond `VM.Allocate`:
/// each parameter it sets is checked (qemu-server src/PVE/API2/Qemu.pm
/// create_vm and $check_vm_modify_config_perm: memory → VM.Config.Memory,
/// cores → VM.Config.CPU, scsihw → VM.Config.HWType, name and description →
/// VM.Config.Options; tags → VM.Config.Options, pve-guest-common
/// src/PVE/GuestHelpers.pm assert_tag_permissions).
pub const NEW_VM_PRIVILEGES: &[&str] = &[
    "VM.Allocate",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.HWType",
    "VM.Config.Options",
];
