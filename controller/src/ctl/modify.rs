//! ControllerModifyVolume (VolumeAttributesClass): throttles and `backup`
//! change on an attached disk at once; `cache` cannot change on a running
//! disk and applies at the next attach. The next attach always takes the
//! PersistentVolume's current class (see publish).

use proxmox_csi_proto::csi::v1 as csi;

use super::Controller;
use crate::drive::{self, DriveLine};
use crate::error::CtlError;
use crate::params::StorageParams;
use crate::pve::Deadline;
use crate::warnings::{self, ClassKind};

/// Drive options a class sets. As in the Go driver (ModifyVolumeParameters
/// MergeMap), an empty value or a limit of 0 or less keeps the disk's limit.
fn apply(line: &mut DriveLine, p: &std::collections::HashMap<String, String>) {
    let mut set = |keys: [&str; 2], v: &str| {
        // Checked by `apply_mutable` first; 0 or less sets no limit.
        if !crate::params::limit("", v).is_ok_and(|n| n.is_some()) {
            return;
        }
        for k in keys {
            line.opts.insert(k.to_string(), v.to_string());
        }
    };
    if let Some(v) = p.get("diskIOPS") {
        set(["iops_rd", "iops_wr"], v);
    }
    if let Some(v) = p.get("diskMBps") {
        set(["mbps_rd", "mbps_wr"], v);
    }
    if let Some(v) = p.get("backup") {
        let on = matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True");
        line.opts
            .insert("backup".into(), if on { "1" } else { "0" }.into());
    }
}

impl Controller {
    pub async fn modify(
        &self,
        r: &csi::ControllerModifyVolumeRequest,
        d: Deadline,
    ) -> Result<(), CtlError> {
        if r.volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        // As the StorageClass: what Go fails on is refused, the rest warned.
        let mut check = StorageParams {
            storage: "-".into(),
            ..Default::default()
        };
        let warnings = check.apply_mutable(&r.mutable_parameters)?;
        warnings::report(ClassKind::VolumeAttributesClass, &warnings);
        let id = super::volume_ref("volume_id", &r.volume_id)?;
        let client = self.client_of("volume", &r.volume_id, &id.region)?;
        self.existing(&client, &id, d).await?;
        let Some(vmid) = self
            .attachments
            .confirmed(&client, &self.vms, &id.volid(), id.zone.as_deref(), d)
            .await?
        else {
            // Not attached: the next publish reads the class from the PersistentVolume.
            return Ok(());
        };
        let vm = self.vms.node_of(&client, vmid, d).await?.ok_or_else(|| {
            CtlError::Unavailable(format!(
                "VM {vmid} holding volume {} is gone; retry",
                r.volume_id
            ))
        })?;
        let cfg = client.vm_config(&vm.node, vmid, d).await?;
        let Some(slot) = drive::slots_with(&cfg.values, &id.volid())
            .into_iter()
            .next()
        else {
            return Ok(());
        };
        let mut line = DriveLine::parse(&cfg.values[&slot]);
        let before = line.clone();
        apply(&mut line, &r.mutable_parameters);
        if line == before {
            return Ok(());
        }
        line.opts.remove("size");
        let form = [
            (slot.as_str(), line.render()),
            ("digest", cfg.digest.clone()),
        ];
        client.update_config(&vm.node, vmid, &form, d).await?;
        let pending = client.vm_pending(&vm.node, vmid, d).await?;
        if pending.iter().any(|p| p.key == slot && p.pending.is_some()) {
            let _ = client
                .update_config(&vm.node, vmid, &[("revert", slot.clone())], d)
                .await;
            return Err(CtlError::Unavailable(format!(
                "VM {vmid} did not take the new limits of {slot} live; reverted"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn limits_are_set_and_zero_keeps_them() {
        let mut l =
            DriveLine::parse("local-lvm:vm-9999-a,backup=0,iops_rd=100,iops_wr=100,size=1G");
        apply(
            &mut l,
            &HashMap::from([
                ("diskIOPS".into(), "0".into()),
                ("diskMBps".into(), "50".into()),
                ("backup".into(), "true".into()),
            ]),
        );
        assert_eq!(
            l.render(),
            "local-lvm:vm-9999-a,backup=1,iops_rd=100,iops_wr=100,mbps_rd=50,mbps_wr=50,size=1G"
        );
    }
}
