//! DeleteVolume: idempotent, and never for a disk still attached to a VM.

use super::Controller;
use crate::error::CtlError;
use crate::pve::api::VolumeInfo;
use crate::pve::{Client, Deadline, PveError};
use crate::volume::VolumeId;

/// How long one node of a shared storage may take to answer while others
/// could answer instead.
const NODE_TRY: std::time::Duration = std::time::Duration::from_secs(3);

impl Controller {
    /// Before a VM that owns the volume is destroyed (a Go driver's holder,
    /// a clone's copy VM): it holds no disk but the volume's, so nothing
    /// else goes with it.
    async fn holds_only(
        &self,
        client: &Client,
        holder: &crate::pve::api::VmResource,
        id: &VolumeId,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let cfg = client.vm_config(&holder.node, holder.vmid, d).await?;
        let others: Vec<String> = cfg
            .values
            .iter()
            .filter(|(k, v)| {
                crate::drive::is_disk_key(k)
                    && crate::drive::DriveLine::parse(v).volume != id.volid()
            })
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        if others.is_empty() {
            return Ok(());
        }
        Err(CtlError::FailedPrecondition(format!(
            "VM {} ({}) holds volume {id} and other disks ({}); it is not destroyed with the volume: \
             detach them first",
            holder.vmid,
            holder.name.as_deref().unwrap_or_default(),
            others.join("; ")
        )))
    }

    /// The node to reach a volume through: its zone, or for shared storage
    /// any node where the storage is available.
    pub async fn node_for(
        &self,
        client: &Client,
        id: &VolumeId,
        d: Deadline,
    ) -> Result<Option<String>, CtlError> {
        if let Some(z) = &id.zone {
            return Ok(Some(z.clone()));
        }
        if let Some(holder) = self.replica_holder(client, id, d).await? {
            return Ok(Some(holder.node));
        }
        Ok(self
            .storage_rows(client, &id.storage, d)
            .await?
            .into_iter()
            .find(|r| r.status == "available")
            .map(|r| r.node))
    }

    /// The volume's size, read through `node_for`'s node; for a shared
    /// storage another node where it is available is asked when that one
    /// does not answer (down, with its storage's RRD row still `available`
    /// for a few minutes). The node that answered, and the size (`None`:
    /// the volume does not exist); `Ok(None)`: the storage is on no node.
    pub async fn reach(
        &self,
        client: &Client,
        id: &VolumeId,
        d: Deadline,
    ) -> Result<Option<(String, Option<VolumeInfo>)>, CtlError> {
        let Some(first) = self.node_for(client, id, d).await? else {
            return Ok(None);
        };
        let others: Vec<String> = if id.zone.is_none() {
            self.storage_rows(client, &id.storage, d)
                .await?
                .into_iter()
                .filter(|r| r.status == "available" && r.node != first)
                .map(|r| r.node)
                .collect()
        } else {
            Vec::new()
        };
        let mut last = None;
        let tries = 1 + others.len();
        for (i, node) in std::iter::once(first).chain(others).enumerate() {
            // A node that does not answer keeps the others waiting only
            // briefly: the storage rows may still call a node up that has
            // gone down since they were read.
            let d = if i + 1 < tries {
                Deadline(d.0.min(std::time::Instant::now() + NODE_TRY))
            } else {
                d
            };
            match client.volume_info(&node, &id.storage, &id.disk, d).await {
                Ok(info) => return Ok(Some((node, info))),
                Err(e) if e.is_transient() && id.zone.is_none() => {
                    tracing::info!(node, storage = id.storage, error = %e, "node does not answer; asking another with the shared storage");
                    last = Some(e);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map(CtlError::from).unwrap_or_else(|| {
            CtlError::Unavailable(format!(
                "volume {id}: no node answers for storage {}",
                id.storage
            ))
        }))
    }

    /// The node of the VM that owns `disk` (`vm-<vmid>-…`), if that VM
    /// exists: an `import-from` copy of the disk must run there
    /// (qemu-server API2/Qemu.pm $import_from_volid: "owner VM N not on
    /// local node"). The placeholder VMID normally has no VM.
    pub async fn owner_node(
        &self,
        client: &Client,
        disk: &str,
        d: Deadline,
    ) -> Result<Option<String>, CtlError> {
        let Some(owner) = crate::volume::owner_of(disk) else {
            return Ok(None);
        };
        if owner == self.controller_vmid {
            // Normally no VM: the cached list settles it without a refresh.
            return Ok(self
                .vms
                .all(client, d)
                .await?
                .into_iter()
                .find(|v| v.vmid == owner)
                .map(|vm| vm.node));
        }
        Ok(self.vms.node_of(client, owner, d).await?.map(|vm| vm.node))
    }

    /// The node to reach an existing volume through, and its size; NotFound
    /// (naming the volume) when it does not exist.
    pub async fn existing(
        &self,
        client: &Client,
        id: &VolumeId,
        d: Deadline,
    ) -> Result<(String, VolumeInfo), CtlError> {
        let (node, info) = self.reach(client, id, d).await?.ok_or_else(|| {
            CtlError::NotFound(format!("volume {id}: storage {} is on no node", id.storage))
        })?;
        let info = info.ok_or_else(|| CtlError::NotFound(format!("volume {id} does not exist")))?;
        Ok((node, info))
    }

    /// Where to delete a volume of a shared storage: the node that last held
    /// it when its storage is available there (a krbd image is mapped there,
    /// see `delete_elsewhere`), else `found`, where it was found.
    async fn delete_node(
        &self,
        client: &Client,
        id: &VolumeId,
        found: String,
        d: Deadline,
    ) -> String {
        let Some(last) = self.last_held(client.region(), &id.volid()) else {
            return found;
        };
        if id.zone.is_some() || last == found {
            return found;
        }
        match self.storage_rows(client, &id.storage, d).await {
            Ok(rows)
                if rows
                    .iter()
                    .any(|r| r.node == last && r.status == "available") =>
            {
                last
            }
            _ => found,
        }
    }

    /// An RBD image that a node still maps (krbd) cannot be removed from
    /// another: Proxmox unmaps an image only where a VM stops or where the
    /// image is freed, never on a hot-unplug (qemu-server QemuServer.pm
    /// vm_deviceunplug, vm_stop_cleanup; pve-storage RBDPlugin.pm
    /// free_image deactivates on the local node, then `rbd rm` fails while
    /// another node watches the image). So a failed delete on shared RBD is
    /// run on the node that last held the disk, then on each other node with
    /// the storage: every failed free unmaps it there. A failed free has
    /// already purged the image's RBD snapshots (free_image runs `rbd snap
    /// purge` before `rbd rm`), as the first attempt did; the image itself
    /// stays until one succeeds. The first error is kept if none does.
    async fn delete_elsewhere(
        &self,
        client: &Client,
        id: &VolumeId,
        tried: &str,
        first: PveError,
        d: Deadline,
    ) -> Result<(), PveError> {
        if !matches!(first, PveError::Task { .. }) || id.zone.is_some() {
            return Err(first);
        }
        let Ok(rows) = self.storage_rows(client, &id.storage, d).await else {
            return Err(first);
        };
        if !rows.iter().any(|r| r.plugintype == "rbd") {
            return Err(first);
        }
        let last = self.last_held(client.region(), &id.volid());
        let mut nodes: Vec<String> = rows
            .into_iter()
            .filter(|r| r.status == "available" && r.node != tried)
            .map(|r| r.node)
            .collect();
        nodes.sort_by_key(|n| Some(n) != last.as_ref());
        for node in nodes {
            match client.delete_volume(&node, &id.storage, &id.disk, d).await {
                Ok(()) => {
                    tracing::info!(volume = %id, node, first_error = %first, "deleted through another node of the RBD storage");
                    return Ok(());
                }
                Err(e @ PveError::Task { .. }) => {
                    tracing::info!(volume = %id, node, error = %e, "delete refused on this node too");
                }
                Err(e) => {
                    tracing::info!(volume = %id, node, error = %e, "delete failed on this node");
                    break;
                }
            }
        }
        Err(first)
    }

    /// A volume whose owner VMID has a VM: a clone's copy VM of this
    /// volume is destroyed with it; any other VM keeps its disk.
    async fn delete_owned(
        &self,
        client: &Client,
        id: &VolumeId,
        volume_id: &str,
        vm: &crate::pve::api::VmResource,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let ours = vm.has_tag(crate::vms::OWN_TAG);
        if ours && vm.has_tag(super::clone::VOLUME_TAG) {
            // The VMID may have been handed to another clone since this
            // volume's VM was destroyed (a retried delete whose first
            // answer was lost): the VM is this volume's only when it is
            // named for the PV being deleted (Released).
            if let Some(k) = &self.kube {
                let cfg = client.vm_config(&vm.node, vm.vmid, d).await?;
                let name = cfg.values.get("name").cloned().unwrap_or_default();
                let pvs = k.pvs_with_handle(&self.driver_name, volume_id).await?;
                // The PV a copy VM was made for: named as CreateVolume names
                // it (`vm_name` of the PV), or as pvecsictl migrate names
                // its carrier (`<pv>-moved`).
                let made_for = |pv: &str| {
                    super::copy::vm_name(pv) == name
                        || super::copy::vm_name(&format!("{pv}-moved")) == name
                };
                match pvs
                    .iter()
                    .find(|(pv, _)| made_for(pv))
                    .map(|(_, phase)| phase.as_str())
                {
                    Some("Released" | "Failed") => {}
                    Some(phase) => {
                        tracing::info!(
                            volume_id,
                            vmid = vm.vmid,
                            name,
                            phase,
                            "the VM holds another PV's volume of the same handle: this one is gone"
                        );
                        return Ok(());
                    }
                    None => {
                        return Err(CtlError::Unavailable(format!(
                            "volume {volume_id}: VM {} ({name}) holds a volume of this handle, and no PersistentVolume of \
                             this handle is named for it (a claim still being provisioned, or a renamed VM); it is not destroyed",
                            vm.vmid
                        )));
                    }
                }
            }
            self.holds_only(client, vm, id, d).await?;
            self.destroy_copy(client, vm, d).await?;
            // destroy_vm only warns when it cannot free a disk (a krbd image
            // another node still maps: qemu-server QemuServer.pm destroy_vm,
            // "Could not remove disk …, check manually"): a disk left is
            // deleted as a volume without owner.
            if let Some((node, Some(_))) = self.reach(client, id, d).await? {
                tracing::info!(
                    volume_id,
                    node,
                    "the copy VM is gone and its disk is not: deleting the disk"
                );
                let node = self.delete_node(client, id, node, d).await;
                if let Err(e) = client.delete_volume(&node, &id.storage, &id.disk, d).await {
                    self.delete_elsewhere(client, id, &node, e, d).await?;
                }
            }
            return Ok(());
        }
        if ours {
            // Another VM of this driver (a snapshot's, a holder) under the
            // VMID this volume's copy VM had: the volume is gone.
            tracing::info!(
                volume_id,
                vmid = vm.vmid,
                "the VMID holds another VM of the driver: the volume is gone"
            );
            return Ok(());
        }
        Err(CtlError::FailedPrecondition(format!(
            "volume {volume_id} is owned by VM {} ({}), which exists and is not this driver's: its disk is not freed. \
             If the volume was this driver's, its VMID has been taken since; check that VM's disks in Proxmox, \
             then keep this PV's disk out of the deletion with the PV annotation lifecycle: keep",
            vm.vmid,
            vm.name.as_deref().unwrap_or_default()
        )))
    }

    pub async fn delete_volume(&self, volume_id: &str, d: Deadline) -> Result<(), CtlError> {
        if volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        // An id this driver could never have issued, or of a region it does
        // not serve, names nothing to delete: done (the spec's idempotence).
        let Ok(id) = VolumeId::parse(volume_id) else {
            return Ok(());
        };
        let Some(client) = self.clients.get(&id.region).cloned() else {
            return Ok(());
        };
        let Some((node, Some(_))) = self.reach(&client, &id, d).await? else {
            return Ok(());
        };
        if let Some(k) = &self.kube
            && let Some(pv) = k.pv_for_handle_now(&self.driver_name, volume_id).await?
            && pv.keep
        {
            tracing::info!(
                volume_id,
                pv = pv.name,
                "PV is annotated lifecycle: keep; the disk is kept"
            );
            return Ok(());
        }
        if let Some(vmid) = self
            .attachments
            .certain(&client, &self.vms, &id.volid(), id.zone.as_deref(), d)
            .await?
        {
            return Err(CtlError::FailedPrecondition(format!(
                "volume {volume_id} is still attached to VM {vmid}; unpublish it first"
            )));
        }
        // A replicated volume is owned by its holder, ours or the Go
        // driver's: destroying it frees the disk and the replication jobs.
        if let Some(holder) = self.replica_holder(&client, &id, d).await? {
            if !holder.has_tag(super::replicate::REPLICATED_TAG) {
                self.holds_only(&client, &holder, &id, d).await?;
            }
            self.remove_replication(&client, &holder, d).await?;
            return self.destroy_copy(&client, &holder, d).await;
        }
        // A clone or restore is owned by a VM of ours: destroying it frees
        // the disk and leaves no stale reference behind.
        if let Some(owner) = id.owner().filter(|o| *o != self.controller_vmid)
            && let Some(vm) = self.vms.node_of(&client, owner, d).await?
        {
            return self.delete_owned(&client, &id, volume_id, &vm, d).await;
        }
        let node = self.delete_node(&client, &id, node, d).await;
        let Err(e) = client.delete_volume(&node, &id.storage, &id.disk, d).await else {
            return Ok(());
        };
        let e = match self.delete_elsewhere(&client, &id, &node, e, d).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        // A failed task may still have freed the disk (a worker that died
        // after its work): the storage says whether it is gone. Otherwise
        // the error maps as any other (an unknown task failure: Unavailable).
        if matches!(e, PveError::Task { .. })
            && matches!(
                client.volume_info(&node, &id.storage, &id.disk, d).await,
                Ok(None)
            )
        {
            tracing::info!(volume_id, error = %e, "the delete task failed, but the disk is gone");
            return Ok(());
        }
        Err(e.into())
    }
}
