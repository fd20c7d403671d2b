//! ControllerExpandVolume: through the resize task of the VM the disk is
//! attached to, or, for a detached disk, of the node's holder VM (see
//! `holder`); skipped when the disk is already large enough.

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::volume_capability::AccessType;

use super::Controller;
use super::create::size_for;
use crate::attach::Op;
use crate::drive;
use crate::error::CtlError;
use crate::pve::Deadline;

impl Controller {
    pub async fn expand(
        &self,
        r: &csi::ControllerExpandVolumeRequest,
        d: Deadline,
    ) -> Result<(u64, bool), CtlError> {
        if r.volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        let range = r
            .capacity_range
            .as_ref()
            .ok_or_else(|| CtlError::invalid("capacity_range", "is required"))?;
        let size = size_for(Some(range))?;
        let id = super::volume_ref("volume_id", &r.volume_id)?;
        let client = self.client_of("volume", &r.volume_id, &id.region)?;
        let (node, info) = self.existing(&client, &id, d).await?;
        // A filesystem must grow on the node; a raw block volume needs nothing more.
        let fs = !matches!(
            r.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(AccessType::Block(_))
        );
        // An approximate size (an inactive LV's) may hide a disk still too
        // small: Proxmox's resize to the size it has is a no-op.
        if !info.approximate && info.size >= size {
            return Ok((info.size, fs));
        }
        let attached = self
            .attachments
            .certain(&client, &self.vms, &id.volid(), id.zone.as_deref(), d)
            .await?;
        if attached.is_none()
            && let Some(holder) = self.replica_holder(&client, &id, d).await?
        {
            // A replicated volume is a disk of its own holder.
            let slot = self.holder_slot(&client, &holder, &id, d).await?;
            client
                .resize(&holder.node, holder.vmid, &slot, size, d)
                .await?;
            return Ok((size, fs));
        }
        let Some(vmid) = attached else {
            // Offline: Proxmox resizes disks only through a VM, so the disk
            // visits the node's (stopped) holder VM for the resize.
            let holder = self.holder(&client, &node, d).await?;
            let attach = Op::Attach {
                volid: id.volid(),
                handle: r.volume_id.clone(),
                opts: Default::default(),
                limit: None,
            };
            let slot = self
                .attacher
                .submit(client.clone(), &node, holder, attach, d)
                .await?
                .ok_or_else(|| {
                    CtlError::Unavailable("holder attach returned no slot; retry".into())
                })?
                .slot;
            let resized = client.resize(&node, holder, &slot, size, d).await;
            self.attacher
                .submit(
                    client.clone(),
                    &node,
                    holder,
                    Op::Detach { volid: id.volid() },
                    d,
                )
                .await?;
            resized?;
            tracing::info!(
                volume_id = r.volume_id,
                holder,
                bytes = size,
                "volume expanded offline"
            );
            return Ok((size, fs));
        };
        let vm = self.vms.node_of(&client, vmid, d).await?.ok_or_else(|| {
            CtlError::NotFound(format!("VM {vmid} holding volume {} is gone", r.volume_id))
        })?;
        let cfg = client.vm_config(&vm.node, vmid, d).await?;
        let slot = drive::slots_with(&cfg.values, &id.volid())
            .into_iter()
            .next()
            .ok_or_else(|| {
                CtlError::Unavailable(format!(
                    "volume {} left VM {vmid} meanwhile; retry",
                    r.volume_id
                ))
            })?;
        client.resize(&vm.node, vmid, &slot, size, d).await?;
        Ok((size, fs))
    }
}
