//! `rename` and `swap`: a PersistentVolume's claim is replaced by one of
//! another name (or two volumes trade claims), without touching Proxmox.
//!
//! The Go tool's semantics, made safe to interrupt: before anything
//! changes, the plan (the claims as they were, each volume's reclaim
//! policy, the nodes cordoned) is recorded in an annotation on every volume
//! involved. Every step checks the state before acting, so a run that
//! stopped half-way continues with `--resume` or is undone with
//! `--rollback`; the nodes this run cordoned are uncordoned on every exit
//! path.
//!
//! A volume's reclaim policy is put back only once the volume reads `Bound`
//! to its new claim (by uid). The PersistentVolume controller writes that
//! phase after pvecsictl re-points claimRef; until then the volume is still
//! `Released`, and `Released` with `Delete` is all the external-provisioner
//! needs to delete the disk (sig-storage-lib-external-provisioner
//! `shouldDelete`). If it is not Bound in time, the policy stays `Retain`
//! and the plan stays recorded for `--resume`.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use crate::kube_ops::Kube;
use crate::kube_ops::{bound_to, held_by};

/// The annotation that records an operation in progress.
pub const OPERATION: &str = "pvecsictl.proxmox.sinextra.dev/operation";

/// How long a run waits for a volume to be Bound to its new claim before it
/// stops, leaving the policy `Retain` and the plan recorded. The
/// PersistentVolume controller binds within seconds, and resyncs every 15 s.
pub const BIND_WAIT: Duration = Duration::from_secs(300);

/// One claim replaced: `from` goes, `to` is bound to `volume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub volume: String,
    pub from: String,
    pub to: String,
    /// The reclaim policy to put back.
    pub reclaim: String,
    /// The old claim as it was (spec, labels, annotations), to make the new
    /// one from and to restore it on rollback.
    pub claim: serde_json::Value,
}

/// What is recorded on each volume before anything changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub op: String,
    pub namespace: String,
    pub moves: Vec<Move>,
    pub cordoned: Vec<String>,
}

/// What the caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub force: bool,
    pub dry_run: bool,
    pub resume: bool,
    pub rollback: bool,
    /// How long to wait for a volume to be Bound to its new claim
    /// ([`BIND_WAIT`] when `None`).
    pub bind_wait: Option<Duration>,
}

fn annotation(pv: &PersistentVolume) -> Option<Plan> {
    pv.metadata
        .annotations
        .as_ref()?
        .get(OPERATION)
        .and_then(|a| serde_json::from_str(a).ok())
}

/// The claim to create in place of `m.from`: its spec, labels and
/// annotations, minus what binding wrote, bound to `m.volume`.
fn new_claim(namespace: &str, name: &str, m: &Move) -> Result<PersistentVolumeClaim> {
    let mut c: PersistentVolumeClaim =
        serde_json::from_value(m.claim.clone()).context("recorded claim")?;
    c.metadata = kube::api::ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        labels: c.metadata.labels.take(),
        annotations: c.metadata.annotations.take().map(|mut a| {
            a.retain(|k, _| {
                !k.starts_with("pv.kubernetes.io/")
                    && !k.starts_with("volume.kubernetes.io/")
                    && k != OPERATION
            });
            a
        }),
        ..Default::default()
    };
    if let Some(spec) = c.spec.as_mut() {
        spec.volume_name = Some(m.volume.clone());
    }
    c.status = None;
    Ok(c)
}

/// The steps, for `--dry-run` and the log.
pub fn describe(plan: &Plan) -> Vec<String> {
    let mut steps = vec![format!(
        "record the plan in the annotation {OPERATION} of {}",
        plan.moves
            .iter()
            .map(|m| m.volume.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )];
    for m in &plan.moves {
        steps.push(format!(
            "set {} reclaimPolicy Retain (was {})",
            m.volume, m.reclaim
        ));
    }
    for m in &plan.moves {
        steps.push(format!("delete claim {}/{}", plan.namespace, m.from));
    }
    for m in &plan.moves {
        steps.push(format!(
            "create claim {}/{} bound to {}",
            plan.namespace, m.to, m.volume
        ));
        steps.push(format!(
            "point {} claimRef at {}/{}",
            m.volume, plan.namespace, m.to
        ));
    }
    for m in &plan.moves {
        steps.push(format!(
            "wait until {} is Bound to {}/{}",
            m.volume, plan.namespace, m.to
        ));
    }
    for m in &plan.moves {
        steps.push(format!("restore {} reclaimPolicy {}", m.volume, m.reclaim));
    }
    if !plan.cordoned.is_empty() {
        steps.push(format!("uncordon {}", plan.cordoned.join(", ")));
    }
    steps
}

/// Runs (or resumes, or rolls back) the moves `pairs` of (claim, new name)
/// as operation `op`; returns the steps taken (or planned, with dry_run).
pub async fn run(
    k: &Kube,
    op: &str,
    pairs: &[(String, String)],
    opts: Options,
) -> Result<Vec<String>> {
    let mut needs = vec![
        ("get", "persistentvolumeclaims", true),
        ("create", "persistentvolumeclaims", true),
        ("delete", "persistentvolumeclaims", true),
        ("patch", "persistentvolumes", false),
        ("list", "pods", true),
    ];
    if opts.force {
        needs.extend([("delete", "pods", true), ("patch", "nodes", false)]);
    }
    k.check_rbac(&needs).await?;

    // The volumes involved, and an interrupted run if one is recorded.
    let mut volumes = Vec::new();
    for (from, to) in pairs {
        let claim = k.pvcs().get_opt(from).await?;
        let recorded = match &claim {
            Some(c) => c.spec.as_ref().and_then(|s| s.volume_name.clone()),
            None => None,
        };
        let pv_name = match recorded {
            Some(v) => v,
            // The claim may be gone in an interrupted run: find its volume by the record.
            None => k
                .pvs()
                .list(&ListParams::default())
                .await?
                .into_iter()
                .find(|pv| {
                    annotation(pv)
                        .is_some_and(|p| p.moves.iter().any(|m| &m.from == from && &m.to == to))
                })
                .and_then(|pv| pv.metadata.name)
                .with_context(|| {
                    format!(
                        "claim {}/{from} does not exist (and no interrupted {op} records it)",
                        k.namespace
                    )
                })?,
        };
        volumes.push((from.clone(), to.clone(), pv_name));
    }
    let mut pvs = Vec::new();
    for (_, _, name) in &volumes {
        pvs.push(
            k.pvs()
                .get(name)
                .await
                .with_context(|| format!("PersistentVolume {name}"))?,
        );
    }
    let recorded = pvs.iter().find_map(annotation);
    let plan = match (recorded, opts.resume || opts.rollback) {
        (Some(p), true) => p,
        (Some(p), false) => bail!(
            "an interrupted {} of {} is recorded on its volumes: run again with --resume to finish it or --rollback to undo it",
            p.op,
            p.moves
                .iter()
                .map(|m| format!("{} → {}", m.from, m.to))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (None, true) => {
            bail!("nothing to resume or roll back: no volume records an interrupted operation")
        }
        (None, false) => {
            let mut moves = Vec::new();
            for ((from, to, volume), pv) in volumes.iter().zip(&pvs) {
                let claim = k.pvcs().get(from).await?;
                if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
                    bail!("claim {}/{from} is not Bound", k.namespace);
                }
                if !pairs.iter().any(|(f, _)| f == to) && k.pvcs().get_opt(to).await?.is_some() {
                    bail!("claim {}/{to} exists already", k.namespace);
                }
                moves.push(Move {
                    volume: volume.clone(),
                    from: from.clone(),
                    to: to.clone(),
                    reclaim: pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.persistent_volume_reclaim_policy.clone())
                        .unwrap_or_else(|| "Delete".into()),
                    claim: serde_json::to_value(&claim)?,
                });
            }
            Plan {
                op: op.to_string(),
                namespace: k.namespace.clone(),
                moves,
                cordoned: Vec::new(),
            }
        }
    };
    if opts.dry_run {
        return Ok(describe(&plan));
    }
    let mut plan = plan;
    let wait = opts.bind_wait.unwrap_or(BIND_WAIT);
    let result = if opts.rollback {
        roll_back(k, &plan, wait).await
    } else {
        forward(k, &mut plan, opts.force, wait).await
    };
    // Whatever happened, the nodes this run cordoned are uncordoned.
    let mut uncordon_errors = Vec::new();
    for n in &plan.cordoned {
        if let Err(e) = k.set_unschedulable(n, false).await {
            uncordon_errors.push(format!("{n}: {e}"));
        }
    }
    let mut steps = result?;
    if !uncordon_errors.is_empty() {
        bail!(
            "done, but uncordoning failed: {}",
            uncordon_errors.join("; ")
        );
    }
    if !plan.cordoned.is_empty() {
        steps.push(format!("uncordoned {}", plan.cordoned.join(", ")));
    }
    Ok(steps)
}

async fn record(k: &Kube, plan: &Plan) -> Result<()> {
    let text = serde_json::to_string(plan)?;
    for m in &plan.moves {
        k.pvs()
            .patch(
                &m.volume,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {OPERATION: text}}})),
            )
            .await?;
    }
    Ok(())
}

async fn forward(k: &Kube, plan: &mut Plan, force: bool, wait: Duration) -> Result<Vec<String>> {
    let mut steps = Vec::new();
    let olds: Vec<String> = plan.moves.iter().map(|m| m.from.clone()).collect();
    let users = k
        .cordon_users(&olds, force, &mut plan.cordoned, &mut steps)
        .await?;
    record(k, plan).await?;
    k.remove_users(&users, &olds, &mut steps).await?;

    for m in &plan.moves {
        k.pvs()
            .patch(
                &m.volume,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
            )
            .await?;
        steps.push(format!("set {} reclaimPolicy Retain", m.volume));
    }
    for m in &plan.moves {
        // In a resumed run the old claim may already be gone, or (swap) be
        // the new claim of the other volume.
        drop_claim(k, &m.from, &m.volume, "old", &mut steps).await?;
    }
    let mut bindings = Vec::new();
    for m in &plan.moves {
        let uid = bind_claim(k, &m.to, m, Binding::New, &mut steps).await?;
        bindings.push((m.clone(), m.to.clone(), uid));
    }
    finish(k, plan, &bindings, wait, &mut steps).await?;
    Ok(steps)
}

/// Once every volume is Bound to its claim (`bindings`: the move, the claim
/// and its uid), the reclaim policies back and the record removed. If one
/// is not Bound in time, nothing is restored: the policies stay `Retain` and
/// the plan stays recorded on every volume.
async fn finish(
    k: &Kube,
    plan: &Plan,
    bindings: &[(Move, String, String)],
    wait: Duration,
    steps: &mut Vec<String>,
) -> Result<()> {
    for (m, claim, uid) in bindings {
        k.wait_bound(&m.volume, claim, uid, wait).await?;
        steps.push(format!("{} is Bound to {}/{claim}", m.volume, k.namespace));
    }
    for m in &plan.moves {
        k.pvs()
            .patch(
                &m.volume,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": m.reclaim}, "metadata": {"annotations": {OPERATION: null}}})),
            )
            .await?;
        steps.push(format!("restored {} reclaimPolicy {}", m.volume, m.reclaim));
    }
    Ok(())
}

/// Undoes an interrupted run: the new claims go, the old ones come back
/// bound to their volumes.
async fn roll_back(k: &Kube, plan: &Plan, wait: Duration) -> Result<Vec<String>> {
    let mut steps = Vec::new();
    let mut bindings = Vec::new();
    for m in &plan.moves {
        k.pvs()
            .patch(
                &m.volume,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
            )
            .await?;
    }
    for m in &plan.moves {
        drop_claim(k, &m.to, &m.volume, "new", &mut steps).await?;
    }
    for m in &plan.moves {
        let uid = bind_claim(k, &m.from, m, Binding::Restored, &mut steps).await?;
        bindings.push((m.clone(), m.from.clone(), uid));
    }
    finish(k, plan, &bindings, wait, &mut steps).await?;
    Ok(steps)
}

/// Deletes claim `name` if it is bound to `volume`, and waits until it is
/// gone (`which`: "old" or "new", for the messages).
async fn drop_claim(
    k: &Kube,
    name: &str,
    volume: &str,
    which: &str,
    steps: &mut Vec<String>,
) -> Result<()> {
    let Some(c) = k.pvcs().get_opt(name).await? else {
        return Ok(());
    };
    if !bound_to(&c, volume) {
        return Ok(());
    }
    k.pvcs().delete(name, &DeleteParams::foreground()).await?;
    steps.push(format!("deleted claim {}/{name}", k.namespace));
    k.wait_gone(
        &format!("the {which} claim {}/{name}", k.namespace),
        async || {
            Ok(k.pvcs()
                .get_opt(name)
                .await?
                .filter(|c| bound_to(c, volume))
                .map(|c| held_by(&c.metadata)))
        },
    )
    .await
}

/// Whether a claim is made for a run going forward or for its rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    New,
    Restored,
}

/// Binds claim `name` to `m.volume`: made from the recorded claim when it
/// is absent, refused when it is bound to another volume; the volume's
/// claimRef is then pointed at it. Its uid.
async fn bind_claim(
    k: &Kube,
    name: &str,
    m: &Move,
    how: Binding,
    steps: &mut Vec<String>,
) -> Result<String> {
    let claim = match k.pvcs().get_opt(name).await? {
        Some(c) if bound_to(&c, &m.volume) => c,
        Some(_) => match how {
            Binding::New => bail!("claim {}/{name} exists and is bound elsewhere", k.namespace),
            Binding::Restored => bail!(
                "claim {}/{name} exists and is bound elsewhere; nothing more was undone",
                k.namespace
            ),
        },
        None => {
            let c = k
                .pvcs()
                .create(&PostParams::default(), &new_claim(&k.namespace, name, m)?)
                .await?;
            let made = match how {
                Binding::New => "created",
                Binding::Restored => "recreated",
            };
            steps.push(format!(
                "{made} claim {}/{name} bound to {}",
                k.namespace, m.volume
            ));
            c
        }
    };
    let uid = claim
        .metadata
        .uid
        .clone()
        .with_context(|| format!("claim {}/{name} has no uid", k.namespace))?;
    let claim_ref = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": k.namespace, "name": name, "uid": uid});
    k.pvs()
        .patch(
            &m.volume,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"claimRef": claim_ref}})),
        )
        .await?;
    Ok(uid)
}
