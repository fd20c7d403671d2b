//! ControllerPublishVolume / ControllerUnpublishVolume: the node's VM gets
//! the disk in its lowest free SCSI slot, with a WWN and serial the node
//! waits for; the publish context carries them as read back from the config.

use std::collections::HashMap;

use proxmox_csi_common::NodeId;
use proxmox_csi_common::contract::{CTX_GO_RESIZE_SIZE_BYTES, PublishContext};
use proxmox_csi_proto::csi::v1 as csi;

use super::{Controller, check_capabilities};
use crate::attach::Op;
use crate::error::CtlError;
use crate::kube::{NodeFacts, NodeVm};
use crate::params::StorageParams;
use crate::pve::api::VmResource;
use crate::pve::{Client, Deadline};
use crate::volume::VolumeId;

impl Controller {
    /// The VM of a CSI node: the VM id in the node id, else the Node's
    /// providerID or instance-id annotation, else the VM whose SMBIOS uuid
    /// is the Node's system UUID, else the one VM named like the node.
    /// `node` is the Kubernetes Node, when the API is there.
    ///
    /// The node id comes from the node plugin, which the controller does not
    /// trust: when the Node object names a VM too (its providerID, or its
    /// system UUID, which kubelet reads from the VM's SMBIOS), the two must
    /// agree, so a node plugin cannot have another node's VM attached to.
    async fn vm_of_node(
        &self,
        client: &Client,
        node_id: &NodeId,
        node: Option<&NodeFacts>,
        d: Deadline,
    ) -> Result<Option<VmResource>, CtlError> {
        let from_node = node.and_then(|n| n.vm.clone());
        if let Some(claimed) = node_id.vmid {
            let vouched = match &from_node {
                Some(NodeVm::Id(v)) => Some(*v),
                Some(NodeVm::SystemUuid(uuid)) => self
                    .vms
                    .by_smbios_uuid(client, &node_id.name, uuid, d)
                    .await?
                    .map(|vm| vm.vmid),
                None => None,
            };
            if let Some(vouched) = vouched.filter(|v| *v != claimed) {
                return Err(CtlError::FailedPrecondition(format!(
                    "node id {node_id} names VM {claimed}, but Kubernetes Node {} belongs to VM {vouched} (its providerID or system UUID)",
                    node_id.name
                )));
            }
            return Ok(self.vms.node_of(client, claimed, d).await?);
        }
        Ok(match from_node {
            Some(NodeVm::Id(vmid)) => self.vms.node_of(client, vmid, d).await?,
            Some(NodeVm::SystemUuid(uuid)) => match self
                .vms
                .by_smbios_uuid(client, &node_id.name, &uuid, d)
                .await?
            {
                Some(vm) => Some(vm),
                None => self.one_named(client, &node_id.name, d).await?,
            },
            None => self.one_named(client, &node_id.name, d).await?,
        })
    }

    /// The VM named like a node, if exactly one is.
    async fn one_named(
        &self,
        client: &Client,
        name: &str,
        d: Deadline,
    ) -> Result<Option<VmResource>, CtlError> {
        let mut found = self.vms.by_name(client, name, d).await?;
        if found.len() > 1 {
            let ids: Vec<String> = found.iter().map(|v| v.vmid.to_string()).collect();
            return Err(CtlError::FailedPrecondition(format!(
                "{} VMs are named {name} ({}): set the Node's providerID (proxmox://<region>/<vmid>) or give the node plugin --vmid",
                found.len(),
                ids.join(", ")
            )));
        }
        Ok(found.pop())
    }

    /// The Kubernetes Node of `node_id`, read once per call (its VM and its
    /// volume limit), when the API is there.
    async fn node_facts(&self, node_id: &NodeId) -> Result<Option<NodeFacts>, CtlError> {
        match &self.kube {
            Some(k) => k.node(&node_id.name).await,
            None => Ok(None),
        }
    }

    pub async fn publish(
        &self,
        r: &csi::ControllerPublishVolumeRequest,
        d: Deadline,
    ) -> Result<HashMap<String, String>, CtlError> {
        if r.volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        if r.node_id.is_empty() {
            return Err(CtlError::invalid("node_id", "is required"));
        }
        let cap = r
            .volume_capability
            .clone()
            .ok_or_else(|| CtlError::invalid("volume_capability", "is required"))?;
        check_capabilities("volume_capability", &[cap])
            .map_err(|e| CtlError::invalid("volume_capability", e))?;
        let id = super::volume_ref("volume_id", &r.volume_id)?;
        let node_id = NodeId::parse(&r.node_id).map_err(|source| CtlError::UnknownNode {
            raw: r.node_id.clone(),
            source,
        })?;
        let client = self.client_of("volume", &r.volume_id, &id.region)?;
        // A static volume may have no context: its storage is in the handle.
        let mut ctx = r.volume_context.clone();
        ctx.entry("storage".into())
            .or_insert_with(|| id.storage.clone());
        let mut params = StorageParams::from_context(&ctx)
            .map_err(|e| CtlError::invalid(format!("volume_context.{}", e.key), e.reason))?;
        // A VolumeAttributesClass set after creation applies at every attach.
        if let Some(k) = &self.kube
            && let Some(pv) = k.pv_for_handle(&self.driver_name, &r.volume_id).await?
            && let Some(vac) = &pv.attributes_class
        {
            // Its warnings were logged at create or modify; not again per
            // attach. A key no driver reads is no reason to fail the attach.
            for key in params.apply_mutable_at_attach(&k.attributes_class(vac).await?)? {
                tracing::warn!(class = %vac, key, "VolumeAttributesClass key no driver reads: ignored");
            }
        }

        let facts = self.node_facts(&node_id).await?;
        let vm = self
            .vm_of_node(&client, &node_id, facts.as_ref(), d)
            .await?
            .ok_or_else(|| {
                CtlError::NotFound(format!(
                    "node {node_id}: no VM found in region {}",
                    id.region
                ))
            })?;
        // On shared storage the handle's zone is where the volume was
        // made, a hint: the VM reaches it from any node (static PVs written
        // as the Go driver's FAQ shows, a VM moved since). Go compares it
        // with no VM's node either (pkg/csi/controller.go checkVolume).
        let mut zone = id.zone.as_deref();
        if let Some(z) = zone
            && z != vm.node
            && self
                .storage_rows(&client, &id.storage, d)
                .await?
                .iter()
                .any(|r| r.shared == 1)
        {
            tracing::debug!(zone = z, node = %vm.node, "shared storage: the handle's zone is a hint");
            zone = None;
        }
        if let Some(zone) = zone
            && zone != vm.node
        {
            return Err(CtlError::FailedPrecondition(format!(
                "volume {} is on local storage of Proxmox node {zone}, but VM {} ({node_id}) runs on {}; \
                 move the volume with `pvecsictl migrate <pvc> {}` or schedule the pod on a node of {zone}",
                r.volume_id, vm.vmid, vm.node, vm.node
            )));
        }
        // Attached elsewhere? Asked before anything moves: a replicated
        // volume's holder migrates offline, which leaves the source as the
        // replica, so the writes of a VM still using it would be lost.
        if let Some(other) = self
            .attachments
            .confirmed(&client, &self.vms, &id.volid(), zone, d)
            .await?
            && other != vm.vmid
        {
            return Err(CtlError::FailedPrecondition(format!(
                "volume {} is attached to VM {other}; it can be attached to one VM at a time",
                r.volume_id
            )));
        }
        self.follow_replica(&client, &id, &vm.node, d).await?;
        let Some(info) = client
            .volume_info(&vm.node, &id.storage, &id.disk, d)
            .await?
        else {
            return Err(CtlError::NotFound(format!(
                "volume {} does not exist",
                r.volume_id
            )));
        };
        let limit = facts
            .and_then(|f| f.max_volumes)
            .unwrap_or(proxmox_csi_common::DEFAULT_MAX_VOLUMES);
        let mut opts = params.drive_options(r.readonly);
        if self.unsafe_mount {
            opts.remove("backup");
        }
        let op = Op::Attach {
            volid: id.volid(),
            handle: r.volume_id.clone(),
            opts,
            limit: u32::try_from(limit).ok(),
        };
        let attached = self
            .attacher
            .submit(client.clone(), &vm.node, vm.vmid, op, d)
            .await?
            .ok_or_else(|| CtlError::Unavailable("attach returned no slot; retry".into()))?;
        self.held_on(client.region(), &id.volid(), &vm.node);
        let go_resize = go_resize_bytes(&r.volume_context);
        if let Some(want) = go_resize
            && info.size < want
        {
            // The Go driver's restore, not yet published: grown where its
            // own ControllerPublishVolume would have grown it, after the
            // attach, through the VM that now holds it.
            client
                .resize(&vm.node, vm.vmid, &attached.slot, want, d)
                .await?;
            tracing::info!(
                volume_id = r.volume_id,
                from = info.size,
                to = want,
                "grew the Go driver's restore to the size it was asked for"
            );
        }
        self.remember_node_id(&id.region, vm.vmid, &r.node_id);
        Ok(PublishContext {
            wwn: attached.wwn.clone(),
            serial: Some(attached.serial.clone()).filter(|s| !s.is_empty()),
            address: Some(attached.address),
            go_resize_required: go_resize.is_some(),
        }
        .to_map())
    }

    pub async fn unpublish(
        &self,
        r: &csi::ControllerUnpublishVolumeRequest,
        d: Deadline,
    ) -> Result<(), CtlError> {
        if r.volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        // A volume id or node id that names nothing has nothing attached.
        let Ok(id) = VolumeId::parse(&r.volume_id) else {
            return Ok(());
        };
        let Some(client) = self.clients.get(&id.region).cloned() else {
            return Ok(());
        };
        let vm = if r.node_id.is_empty() {
            // From every node: the VM the volume is attached to, if any.
            match self
                .attachments
                .confirmed(&client, &self.vms, &id.volid(), id.zone.as_deref(), d)
                .await?
            {
                Some(vmid) => self.vms.node_of(&client, vmid, d).await?,
                None => None,
            }
        } else {
            let Ok(node_id) = NodeId::parse(&r.node_id) else {
                return Ok(());
            };
            // Only a node id without a VM id needs its Node here.
            let facts = if node_id.vmid.is_none() {
                self.node_facts(&node_id).await?
            } else {
                None
            };
            self.vm_of_node(&client, &node_id, facts.as_ref(), d)
                .await?
        };
        // A VM (or node) that is gone counts as detached.
        let Some(vm) = vm else { return Ok(()) };
        self.attacher
            .submit(
                client.clone(),
                &vm.node,
                vm.vmid,
                Op::Detach { volid: id.volid() },
                d,
            )
            .await?;
        self.held_on(client.region(), &id.volid(), &vm.node);
        Ok(())
    }
}

/// The size a Go driver's restore was asked for, in bytes rounded up to a
/// MiB (the Go driver grows it in MiB), from its volume context; the Go
/// driver's publish compares it with the disk's size alone, whatever
/// `resizeRequired` says. A value that is not a size is warned about and
/// ignored: the volume attaches at the size it has.
fn go_resize_bytes(ctx: &HashMap<String, String>) -> Option<u64> {
    let raw = ctx.get(CTX_GO_RESIZE_SIZE_BYTES)?;
    match raw.parse::<u64>() {
        Ok(bytes) if bytes > 0 => Some(bytes.div_ceil(1 << 20) << 20),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(key = CTX_GO_RESIZE_SIZE_BYTES, value = raw, error = %e, "not a size in bytes: ignored");
            None
        }
    }
}
