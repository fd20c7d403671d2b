//! The end of a copy VM: destroyed with the volume it owns, when its
//! snapshot or volume is deleted, or when the claim it was made for is gone.

use super::description::described;
use crate::ctl::Controller;
use crate::error::CtlError;
use crate::naming::described::CLAIM_UID;
use crate::progress::{ClaimRead, CopyJob};
use crate::pve::api::VmResource;
use crate::pve::{Client, Deadline};

impl Controller {
    /// Gives up the copy VM `name` (tagged `kind`) of a claim that is gone
    /// (`read`: what the claim read as): destroys it, only if its
    /// description records the UID of the claim it was made for and `read`
    /// says that claim is gone, and no PersistentVolume took the volume. The
    /// answer is always an error: FailedPrecondition once nothing is left to
    /// do, so the provisioner stops; Unavailable while the VM could not be
    /// destroyed (its import still holds its lock), so it calls again.
    pub async fn abandon_copy(
        &self,
        client: &Client,
        name: &str,
        kind: &str,
        job: &CopyJob<'_>,
        read: &ClaimRead,
        d: Deadline,
    ) -> CtlError {
        let claim = job
            .claim
            .as_ref()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .unwrap_or_default();
        let gone = |what: String| {
            CtlError::FailedPrecondition(format!(
                "volume {}: its claim {claim} is not in the Kubernetes API the controller reads \
                 (deleted, or replaced by a claim of the same name): {what}",
                job.volume
            ))
        };
        let again = |e: CtlError| CtlError::CopyNotDestroyed {
            volume: job.volume.to_string(),
            claim: claim.clone(),
            source: Box::new(e),
        };
        if let Some(kube) = self.kube.as_ref() {
            match kube.pv_exists(job.volume).await {
                Ok(true) => {
                    return gone(format!(
                        "the copy is kept, as PersistentVolume {} holds it",
                        job.volume
                    ));
                }
                Ok(false) => {}
                Err(e) => return again(e),
            }
        }
        // Read now, not from the index: a VMID Proxmox handed out again
        // since the index was filled is someone else's VM.
        self.vms.invalidate(client.region()).await;
        let vm = match self.copy_vm(client, name, kind, d).await {
            Ok(Some(vm)) => vm,
            Ok(None) => return gone("nothing was copied".into()),
            Err(e) => return again(e),
        };
        let cfg = match client.vm_config(&vm.node, vm.vmid, d).await {
            Ok(cfg) => cfg,
            Err(e) => return again(e.into()),
        };
        let made_for = described(&cfg.values, CLAIM_UID);
        let Some(made_for) = made_for.filter(|u| read.gone(Some(u))) else {
            return gone(format!(
                "its copy VM {} does not record the claim it was made for as gone, and is kept \
                 (pvecsictl doctor lists such copies)",
                vm.vmid
            ));
        };
        if let Err(e) = self.destroy_copy(client, &vm, d).await {
            return again(e);
        }
        self.progress.abandoned(job).await;
        tracing::info!(
            volume = job.volume,
            vmid = vm.vmid,
            claim_uid = made_for,
            "the claim is gone: its copy VM is destroyed"
        );
        gone(format!("its copy VM {} is destroyed", vm.vmid))
    }

    /// Destroys a copy VM and the volume it owns: the only place its
    /// protection is lifted for good.
    pub async fn destroy_copy(
        &self,
        client: &Client,
        vm: &VmResource,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let cfg = client.vm_config(&vm.node, vm.vmid, d).await?;
        // Read now, not from a cached list: a VM made under the VMID since
        // the driver's was destroyed is someone else's, or another of the
        // driver's (another name). (A Go driver's replication holder carries
        // no tag: its caller proved it by shape.)
        let renamed = vm
            .name
            .as_deref()
            .is_some_and(|n| cfg.values.get("name").map(String::as_str) != Some(n));
        if renamed || (!crate::vms::is_own(&cfg.values) && vm.has_tag(crate::vms::OWN_TAG)) {
            tracing::info!(
                vmid = vm.vmid,
                "the VMID holds another VM now (not this driver's, or of another name): nothing to destroy"
            );
            return Ok(());
        }
        self.retire_vmid(vm.vmid);
        let lifted = self.unprotect(client, &vm.node, vm.vmid, &cfg, d).await?;
        let destroyed = client.destroy_vm(&vm.node, vm.vmid, d).await;
        if destroyed.is_err() {
            // The destroy may have gone through after all: the VMID must be
            // looked up afresh.
            self.vms.invalidate(client.region()).await;
        }
        if destroyed.is_err() && lifted {
            // Still there (a backup's lock, a refusal): protected again,
            // unless the answer was lost and the VM may be gone.
            if client.vm_config(&vm.node, vm.vmid, d).await.is_ok() {
                self.protect_again(client, &vm.node, vm.vmid, d).await;
            }
        }
        destroyed.map_err(|e| match e.status().map(|s| s.as_u16()) {
            Some(403) => CtlError::refused(
                format!(
                    "destroying VM {} ({})",
                    vm.vmid,
                    vm.name.as_deref().unwrap_or_default()
                ),
                "grant VM.Allocate to the CSI role",
                e,
            ),
            _ => CtlError::from(e),
        })?;
        self.imports
            .0
            .lock()
            .await
            .remove(&(client.region().to_string(), vm.vmid));
        self.vms.invalidate(client.region()).await;
        Ok(())
    }
}
