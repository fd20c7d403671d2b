//! `migrate <pvc> <proxmox-node>`: a volume on local storage moves to
//! another Proxmox node, with the API token (the Go tool needs root@pam for
//! its storage copy).
//!
//! Proxmox moves local disks only with their VM, and only disks the VM
//! owns. So the disk visits the source node's holder VM, is handed to a
//! stopped *carrier* VM of its own (`move_disk` with `target-vmid`, which
//! renames it `vm-<carrier>-disk-0`), the carrier migrates offline to the
//! target node, and there keeps the disk as `unused0`: the shape of the
//! controller's clones, which it publishes and deletes as any volume.
//! The PersistentVolume is then made again with the new handle and zone
//! (a handle cannot change), and its claim bound to it.
//!
//! Like rename, the plan is recorded on the volume first; every step checks
//! the state, so an interrupted run continues with `--resume`. Reclaim
//! policies are restored and cordons undone on every exit path.

use proxmox_csi_common::contract::{TOPOLOGY_REGION, TOPOLOGY_ZONE};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use proxmox_csi_controller::attach::Op;
use proxmox_csi_controller::config::VmIds;
use proxmox_csi_controller::ctl::{CSI_TAG, Controller, NewVm, VOLUME_TAG, drive_size};
use proxmox_csi_controller::drive::{DriveLine, is_disk_key};
use proxmox_csi_controller::pve::tasks::TaskState;
use proxmox_csi_controller::pve::{Client, Deadline};
use proxmox_csi_controller::volume::VolumeId;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::kube_ops::{Kube, held_by};
use crate::rebind::{OPERATION, Options};

/// What is recorded on the volume before anything changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub op: String,
    pub namespace: String,
    pub claim_name: String,
    pub from: String,
    pub to: String,
    pub reclaim: String,
    /// The volume and its claim as they were.
    pub volume: serde_json::Value,
    pub claim: serde_json::Value,
    pub cordoned: Vec<String>,
}

fn carrier_name(pv: &str) -> String {
    proxmox_csi_controller::ctl::vm_name(&format!("{pv}-moved"))
}

/// The steps, for `--dry-run`.
pub fn describe(p: &Plan, handle: &str) -> Vec<String> {
    let pv = p.volume["metadata"]["name"].as_str().unwrap_or_default();
    vec![
        format!("record the plan in the annotation {OPERATION} of {pv}"),
        format!("set {pv} reclaimPolicy Retain (was {})", p.reclaim),
        format!("wait until the disk of {handle} is detached from every VM"),
        format!(
            "attach it to the holder VM on {} and hand it to a new carrier VM {}",
            p.from,
            carrier_name(pv)
        ),
        format!(
            "migrate the carrier VM offline from {} to {} (the disk is copied)",
            p.from, p.to
        ),
        format!("keep the disk as unused0 of the carrier on {}", p.to),
        format!(
            "delete claim {}/{} and volume {pv}; create {pv} with the new handle and zone {}, and the claim bound to it",
            p.namespace, p.claim_name, p.to
        ),
        format!("restore {pv} reclaimPolicy {}", p.reclaim),
    ]
}

/// Moves the volume of claim `claim` to Proxmox node `to`; the Proxmox copy
/// may take `timeout`. `rollback` brings an interrupted run back.
pub async fn run(
    k: &Kube,
    clients: &[Arc<Client>],
    vmids: VmIds,
    claim: &str,
    to: &str,
    opts: Options,
    timeout: Duration,
) -> Result<Vec<String>> {
    let mut needs = vec![
        ("get", "persistentvolumeclaims", true),
        ("create", "persistentvolumeclaims", true),
        ("delete", "persistentvolumeclaims", true),
        ("create", "persistentvolumes", false),
        ("delete", "persistentvolumes", false),
        ("patch", "persistentvolumes", false),
        ("list", "pods", true),
    ];
    if opts.force {
        needs.extend([("delete", "pods", true), ("patch", "nodes", false)]);
    }
    k.check_rbac(&needs).await?;
    let pvc = k.pvcs().get_opt(claim).await?;
    let pv_name = match pvc
        .as_ref()
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.volume_name.clone())
    {
        Some(v) => v,
        None => bail!("claim {}/{claim} is not bound to a volume", k.namespace),
    };
    let pv = k.pvs().get(&pv_name).await?;
    let recorded: Option<Plan> = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPERATION))
        .and_then(|a| serde_json::from_str(a).ok());
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .context("the volume is not a CSI volume")?;
    let id = VolumeId::parse(&handle).map_err(anyhow::Error::msg)?;
    let mut plan = match (recorded, opts.resume || opts.rollback) {
        // Rolling back is migrating back: the same steps, the nodes swapped.
        (Some(p), true) if opts.rollback => Plan {
            from: p.to.clone(),
            to: p.from.clone(),
            op: "migrate back".into(),
            ..p
        },
        (Some(p), true) => p,
        (Some(p), false) => bail!(
            "an interrupted {} of {}/{} to {} is recorded on {pv_name}: run again with --resume to finish it or --rollback to bring it back",
            p.op,
            p.namespace,
            p.claim_name,
            p.to
        ),
        (None, true) => {
            bail!("nothing to resume or roll back: {pv_name} records no interrupted operation")
        }
        (None, false) => {
            let from = id.zone.clone().with_context(|| {
                format!(
                    "{handle} is on shared storage: every node reaches it, there is nothing to move"
                )
            })?;
            if from == to {
                bail!("{handle} is on {to} already");
            }
            Plan {
                op: "migrate".into(),
                namespace: k.namespace.clone(),
                claim_name: claim.to_string(),
                from,
                to: to.to_string(),
                reclaim: pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.persistent_volume_reclaim_policy.clone())
                    .unwrap_or_else(|| "Delete".into()),
                volume: serde_json::to_value(&pv)?,
                claim: serde_json::to_value(&pvc)?,
                cordoned: Vec::new(),
            }
        }
    };
    if opts.dry_run {
        return Ok(describe(&plan, &handle));
    }
    let client = clients
        .iter()
        .find(|c| c.region() == id.region)
        .cloned()
        .with_context(|| format!("region {} is not in the cloud config", id.region))?;
    if opts.rollback {
        let ctl = Controller::new(
            vec![client.clone()],
            vmids.controller,
            Duration::from_secs(60),
        );
        let d = Deadline::after(Duration::from_secs(60));
        if ctl
            .vms
            .own(&client, &carrier_name(&pv_name), VOLUME_TAG, d)
            .await?
            .is_none()
        {
            // Nothing moved in Proxmox yet: only the record and the policy to undo.
            k.pvs()
                .patch(&pv_name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": plan.reclaim}, "metadata": {"annotations": {OPERATION: null}}})))
                .await?;
            for n in &plan.cordoned {
                let _ = k.set_unschedulable(n, false).await;
            }
            return Ok(vec![format!(
                "nothing had moved; restored {pv_name} reclaimPolicy {}",
                plan.reclaim
            )]);
        }
    }
    let result = forward(k, client, vmids, &mut plan, &pv_name, &id, opts, timeout).await;
    for n in &plan.cordoned {
        let _ = k.set_unschedulable(n, false).await;
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    k: &Kube,
    client: Arc<Client>,
    vmids: VmIds,
    plan: &mut Plan,
    pv_name: &str,
    id: &VolumeId,
    opts: Options,
    timeout: Duration,
) -> Result<Vec<String>> {
    let mut steps = Vec::new();
    let d = || Deadline::after(timeout);
    let claims = vec![plan.claim_name.clone()];
    let users = k
        .cordon_users(&claims, opts.force, &mut plan.cordoned, &mut steps)
        .await?;
    let record = serde_json::to_string(plan)?;
    let annotate = async |v: serde_json::Value| {
        k.pvs()
            .patch(pv_name, &PatchParams::default(), &Patch::Merge(v))
            .await
    };
    if k.pvs().get_opt(pv_name).await?.is_some() {
        annotate(json!({"metadata": {"annotations": {OPERATION: record}}, "spec": {"persistentVolumeReclaimPolicy": "Retain"}})).await?;
    }
    k.remove_users(&users, &claims, &mut steps).await?;

    let mut ctl = Controller::new(
        vec![client.clone()],
        vmids.controller,
        Duration::from_secs(120),
    );
    ctl.vmid_range = vmids.range;
    let new_volid = move_disk(&ctl, &client, plan, pv_name, id, d, &mut steps).await?;

    // The volume again, with its new handle and zone; then its claim.
    let new_handle = VolumeId {
        region: id.region.clone(),
        zone: Some(plan.to.clone()),
        storage: id.storage.clone(),
        disk: new_volid
            .split_once(':')
            .map(|(_, n)| n.to_string())
            .unwrap_or_default(),
    };
    if let Some(c) = k.pvcs().get_opt(&plan.claim_name).await?
        && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(pv_name)
        && k.pvs().get_opt(pv_name).await?.is_some_and(|p| {
            p.spec
                .and_then(|s| s.csi)
                .is_some_and(|c| c.volume_handle != new_handle.to_string())
        })
    {
        k.pvcs()
            .delete(&plan.claim_name, &DeleteParams::foreground())
            .await?;
        k.wait_gone(
            &format!("the claim {}/{}", plan.namespace, plan.claim_name),
            async || {
                Ok(k.pvcs()
                    .get_opt(&plan.claim_name)
                    .await?
                    .map(|c| held_by(&c.metadata)))
            },
        )
        .await?;
        steps.push(format!(
            "deleted claim {}/{}",
            plan.namespace, plan.claim_name
        ));
    }
    if k.pvs().get_opt(pv_name).await?.is_some_and(|p| {
        p.spec
            .and_then(|s| s.csi)
            .is_some_and(|c| c.volume_handle != new_handle.to_string())
    }) {
        k.pvs().delete(pv_name, &DeleteParams::default()).await?;
        // pv-protection holds it until it is not Bound (the claim is gone, so
        // the PersistentVolume controller makes it Released), the attacher's
        // finalizer until no VolumeAttachment names it; its name is reused
        // only once it is really gone.
        k.wait_gone(&format!("the volume {pv_name}"), async || {
            Ok(k.pvs()
                .get_opt(pv_name)
                .await?
                .map(|p| held_by(&p.metadata)))
        })
        .await?;
        steps.push(format!("deleted volume {pv_name} (Retain: the disk stays)"));
    }
    if k.pvs().get_opt(pv_name).await?.is_none() {
        let mut v: PersistentVolume = serde_json::from_value(plan.volume.clone())?;
        v.metadata = kube::api::ObjectMeta {
            name: Some(pv_name.to_string()),
            labels: v.metadata.labels.take(),
            annotations: v.metadata.annotations.take(),
            ..Default::default()
        };
        if let Some(a) = v.metadata.annotations.as_mut() {
            a.remove(OPERATION);
        }
        v.status = None;
        let mut spec = v.spec.take().unwrap_or_default();
        if let Some(c) = spec.csi.as_mut() {
            c.volume_handle = new_handle.to_string();
        }
        spec.persistent_volume_reclaim_policy = Some("Retain".into());
        spec.claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(plan.namespace.clone()),
            name: Some(plan.claim_name.clone()),
            ..Default::default()
        });
        spec.node_affinity = Some(serde_json::from_value(
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": TOPOLOGY_REGION, "operator": "In", "values": [id.region]},
            {"key": TOPOLOGY_ZONE, "operator": "In", "values": [plan.to]}]}]}}),
        )?);
        v.spec = Some(spec);
        k.pvs().create(&PostParams::default(), &v).await?;
        steps.push(format!("created volume {pv_name} with handle {new_handle}"));
    }
    if k.pvcs().get_opt(&plan.claim_name).await?.is_none() {
        let mut c: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            serde_json::from_value(plan.claim.clone())?;
        c.metadata = kube::api::ObjectMeta {
            name: Some(plan.claim_name.clone()),
            namespace: Some(plan.namespace.clone()),
            labels: c.metadata.labels.take(),
            annotations: c.metadata.annotations.take().map(|mut a| {
                a.retain(|k, _| {
                    !k.starts_with("pv.kubernetes.io/") && !k.starts_with("volume.kubernetes.io/")
                });
                a
            }),
            ..Default::default()
        };
        c.status = None;
        k.pvcs().create(&PostParams::default(), &c).await?;
        steps.push(format!(
            "created claim {}/{} bound to {pv_name}",
            plan.namespace, plan.claim_name
        ));
    }
    annotate(json!({"spec": {"persistentVolumeReclaimPolicy": plan.reclaim}, "metadata": {"annotations": {OPERATION: null}}})).await?;
    steps.push(format!("restored {pv_name} reclaimPolicy {}", plan.reclaim));
    Ok(steps)
}

/// The Proxmox half: holder, carrier, offline migration, `unused0`.
/// Returns the disk's new volid. Each step is skipped when done already.
async fn move_disk(
    ctl: &Controller,
    client: &Arc<Client>,
    plan: &Plan,
    pv_name: &str,
    id: &VolumeId,
    d: impl Fn() -> Deadline,
    steps: &mut Vec<String>,
) -> Result<String> {
    let name = carrier_name(pv_name);
    let carrier = match ctl.vms.own(client, &name, VOLUME_TAG, d()).await? {
        Some(vm) => vm,
        None => {
            // Detached from every worker first (the attacher does it once the pods are gone).
            let started = Instant::now();
            while let Some(vmid) = attached(ctl, client, &id.volid(), d()).await? {
                if started.elapsed() > Duration::from_secs(600) {
                    bail!(
                        "{} is still attached to VM {vmid} after 10 minutes",
                        id.volid()
                    );
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let description = format!(
                "Proxmox CSI volume {pv_name}, moved from {} to {} by pvecsictl, held as this VM's unused0.\n{}",
                plan.from,
                plan.to,
                proxmox_csi_controller::ctl::OWNED_VM_NOTE
            );
            let vm = ctl
                .new_vm(
                    client,
                    &plan.from,
                    &NewVm {
                        name: &name,
                        kind: VOLUME_TAG,
                        description,
                    },
                    d(),
                )
                .await?;
            steps.push(format!("created carrier VM {} on {}", vm.vmid, plan.from));
            vm
        }
    };
    let cfg = client
        .vm_config(&carrier.node, carrier.vmid, d())
        .await?
        .values;
    if !cfg.contains_key("scsi0") && !cfg.contains_key("unused0") {
        let holder = ctl.holder(client, &plan.from, d()).await?;
        let attach = Op::Attach {
            volid: id.volid(),
            handle: id.to_string(),
            opts: BTreeMap::new(),
            limit: None,
        };
        let slot = ctl
            .attacher
            .submit(client.clone(), &plan.from, holder, attach, d())
            .await?
            .context("holder attach gave no slot")?
            .slot;
        let form = [
            ("disk", slot.clone()),
            ("target-vmid", carrier.vmid.to_string()),
            ("target-disk", "scsi0".to_string()),
        ];
        let upid: String = client
            .call(
                Method::POST,
                &format!("/nodes/{}/qemu/{holder}/move_disk", plan.from),
                &form,
                d(),
            )
            .await?;
        client.wait_task(&upid, d()).await?;
        steps.push(format!(
            "handed {} from holder VM {holder} to carrier VM {}",
            id.volid(),
            carrier.vmid
        ));
    }
    if carrier.node != plan.to {
        // The disk's size, for the progress of dd's byte counts.
        let cfg = client
            .vm_config(&carrier.node, carrier.vmid, d())
            .await?
            .values;
        let plan_bytes = ["scsi0", "unused0"]
            .iter()
            .find_map(|k| cfg.get(*k))
            .and_then(|line| drive_size(&DriveLine::parse(line)))
            .unwrap_or(0);
        let form = [
            ("target", plan.to.clone()),
            ("online", "0".to_string()),
            ("with-local-disks", "1".to_string()),
        ];
        let upid: String = client
            .call(
                Method::POST,
                &format!("/nodes/{}/qemu/{}/migrate", carrier.node, carrier.vmid),
                &form,
                d(),
            )
            .await?;
        let started = Instant::now();
        loop {
            match client.task_state(&upid, d()).await? {
                TaskState::Running(progress) => {
                    eprintln!(
                        "  migrating VM {} to {}: {} {} s",
                        carrier.vmid,
                        plan.to,
                        bar(progress.as_deref(), plan_bytes),
                        started.elapsed().as_secs()
                    );
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                TaskState::Done => break,
                TaskState::Failed(e) => {
                    bail!("migrating carrier VM {} to {}: {e}", carrier.vmid, plan.to)
                }
            }
        }
        ctl.vms.invalidate(client.region()).await;
        steps.push(format!(
            "migrated carrier VM {} to {}",
            carrier.vmid, plan.to
        ));
    }
    let cfg = client.vm_config(&plan.to, carrier.vmid, d()).await?;
    if cfg.values.contains_key("scsi0") {
        ctl.remove_own_drives(client, &plan.to, carrier.vmid, cfg, &["scsi0"], d())
            .await?;
    }
    let cfg = client.vm_config(&plan.to, carrier.vmid, d()).await?.values;
    let volid = cfg
        .get("unused0")
        .map(|v| v.split(',').next().unwrap_or_default().to_string())
        .context("the carrier holds no unused0")?;
    steps.push(format!("the disk is now {volid} on {}", plan.to));
    Ok(volid)
}

/// A progress bar from the task's latest progress line (see
/// `tasks::is_progress`): a percentage where the line has one, else the
/// bytes dd copied against the disk's `total` bytes.
fn bar(progress: Option<&str>, total: u64) -> String {
    let percent = |p: &str| -> Option<f64> {
        if let Some((before, _)) = p.split_once("% complete") {
            return before.rsplit(' ').next()?.parse().ok();
        }
        if let Some((_, after)) = p.rsplit_once('(')
            && let Some((n, _)) = after.split_once('%')
        {
            return n.trim().parse().ok();
        }
        // `[timestamp ]N bytes (…) copied, …`
        let (head, _) = p.split_once(" bytes (")?;
        let bytes: f64 = head.rsplit(' ').next()?.parse().ok()?;
        (total > 0).then(|| bytes * 100.0 / total as f64)
    };
    let pct = progress.and_then(percent).map(|p| p.clamp(0.0, 100.0));
    match pct {
        Some(p) => {
            let filled = (p / 5.0).round() as usize;
            format!(
                "[{}{}] {p:5.1}%",
                "#".repeat(filled),
                "-".repeat(20 - filled)
            )
        }
        None => "[copying]".to_string(),
    }
}

async fn attached(
    ctl: &Controller,
    client: &Client,
    volid: &str,
    d: Deadline,
) -> Result<Option<u32>> {
    for vm in ctl.vms.all(client, d).await? {
        if vm.has_tag(CSI_TAG) {
            continue;
        }
        let cfg = client.vm_config(&vm.node, vm.vmid, d).await?.values;
        if cfg
            .iter()
            .any(|(k, v)| is_disk_key(k) && v.split(',').next() == Some(volid))
        {
            return Ok(Some(vm.vmid));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #[test]
    fn progress_bars() {
        assert_eq!(
            super::bar(Some("transferred 512.0 MiB of 1.0 GiB (50.00%)"), 0),
            "[##########----------]  50.0%"
        );
        assert_eq!(
            super::bar(
                Some("drive-scsi0: transferred 1.0 GiB of 1.0 GiB (100.00%) in 3s"),
                0
            ),
            "[####################] 100.0%"
        );
        assert_eq!(super::bar(None, 0), "[copying]");
        // An offline migration's dd line (pve-storage Storage.pm storage_migrate), against the disk's size.
        assert_eq!(
            super::bar(
                Some("2026-11-30 14:00:05 536870912 bytes (537 MB, 512 MiB) copied, 4 s, 134 MB/s"),
                1 << 30
            ),
            "[##########----------]  50.0%"
        );
        assert_eq!(
            super::bar(Some("Exporting image: 25% complete..."), 0),
            "[#####---------------]  25.0%"
        );
    }
}
