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

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The annotation that records an operation in progress.
pub const OPERATION: &str = "pvecsictl.proxmox.sinextra.dev/operation";

/// How long a run waits for a volume to be Bound to its new claim before it
/// stops, leaving the policy `Retain` and the plan recorded. The
/// PersistentVolume controller binds within seconds, and resyncs every 15 s.
pub const BIND_WAIT: Duration = Duration::from_secs(300);

fn human(d: Duration) -> String {
    match d.as_secs() {
        s if s >= 60 && s % 60 == 0 => format!("{} minutes", s / 60),
        s => format!("{s} s"),
    }
}

/// What holds an object that is being deleted: its finalizers, with what
/// each waits for.
pub(crate) fn held_by(meta: &ObjectMeta) -> String {
    let Some(f) = meta.finalizers.as_ref().filter(|f| !f.is_empty()) else {
        return String::new();
    };
    let why: Vec<String> = f
        .iter()
        .map(|f| match f.as_str() {
            // pvc-protection: a scheduled pod names the claim (podUsesPVC).
            "kubernetes.io/pvc-protection" => {
                format!("{f} (a pod on a node still names the claim)")
            }
            // pv-protection: the volume is still Bound.
            "kubernetes.io/pv-protection" => format!("{f} (the volume is still Bound)"),
            // external-attacher: a VolumeAttachment still names the volume.
            a if a.starts_with("external-attacher/") => {
                format!("{f} (a VolumeAttachment still names the volume)")
            }
            _ => f.clone(),
        })
        .collect();
    format!(", held by the finalizers {}", why.join(", "))
}

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

#[derive(Clone)]
pub struct Kube {
    pub client: kube::Client,
    pub namespace: String,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Kube {
    pub(crate) fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub(crate) fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Refuses before any change when the caller may not do what the plan needs.
    pub async fn check_rbac(&self, needs: &[(&str, &str, bool)]) -> Result<()> {
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let mut missing = Vec::new();
        for (verb, resource, namespaced) in needs {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some(verb.to_string()),
                        resource: Some(resource.to_string()),
                        namespace: namespaced.then(|| self.namespace.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let r = api
                .create(&PostParams::default(), &review)
                .await
                .context("SelfSubjectAccessReview")?;
            if !r.status.is_some_and(|s| s.allowed) {
                missing.push(format!("{verb} {resource}"));
            }
        }
        if !missing.is_empty() {
            bail!(
                "rbac: you are not allowed to {}; nothing was changed",
                missing.join(", ")
            );
        }
        Ok(())
    }

    /// Pods that mount one of `claims`: those not finished, and finished
    /// ones still on a node, which hold the claim as much (pvc-protection's
    /// `podUsesPVC` counts any pod with `spec.nodeName` that names it).
    async fn users(&self, claims: &[String]) -> Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(pods
            .list(&ListParams::default())
            .await?
            .into_iter()
            .filter(|p| !finished(p) || node_of(p).is_some())
            .filter(|p| {
                p.spec.as_ref().is_some_and(|s| {
                    s.volumes.iter().flatten().any(|v| {
                        v.persistent_volume_claim
                            .as_ref()
                            .is_some_and(|c| claims.contains(&c.claim_name))
                    })
                })
            })
            .collect())
    }

    /// The pods using `claims`, with their nodes cordoned (each one this
    /// run cordons is added to `cordoned`); refused without `force`.
    pub(crate) async fn cordon_users(
        &self,
        claims: &[String],
        force: bool,
        cordoned: &mut Vec<String>,
        steps: &mut Vec<String>,
    ) -> Result<Vec<Pod>> {
        let users = self.users(claims).await?;
        if users.is_empty() {
            return Ok(users);
        }
        let names: Vec<String> = users
            .iter()
            .filter_map(|p| {
                let name = p.metadata.name.clone()?;
                Some(if finished(p) {
                    format!("{name} (finished, but it holds the claim until deleted)")
                } else {
                    name
                })
            })
            .collect();
        if !force {
            bail!(
                "claims {} are used by pods {}: stop them or use --force (cordons their nodes and deletes them)",
                claims.join(", "),
                names.join(", ")
            );
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        // A finished pod is not started again: its node stays as it is.
        for node in users
            .iter()
            .filter(|p| !finished(p))
            .filter_map(|p| node_of(p).map(String::from))
        {
            let already = nodes
                .get(&node)
                .await?
                .spec
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            if !already && !cordoned.contains(&node) {
                self.set_unschedulable(&node, true).await?;
                cordoned.push(node.clone());
                steps.push(format!("cordoned {node}"));
            }
        }
        Ok(users)
    }

    /// Deletes `users` and waits until no pod uses `claims`.
    pub(crate) async fn remove_users(
        &self,
        users: &[Pod],
        claims: &[String],
        steps: &mut Vec<String>,
    ) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        for p in users {
            let name = p.metadata.name.clone().unwrap_or_default();
            pods.delete(&name, &DeleteParams::default()).await?;
            steps.push(format!("deleted pod {name}"));
        }
        self.wait_gone("pods using the claims", async || {
            let left: Vec<String> = self
                .users(claims)
                .await?
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            Ok((!left.is_empty()).then(|| format!(" ({})", left.join(", "))))
        })
        .await
    }

    pub(crate) async fn set_unschedulable(&self, node: &str, yes: bool) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": yes}})),
            )
            .await?;
        Ok(())
    }

    /// Waits until `exists` answers None; it answers Some(why) while the
    /// thing is still there (`why` completes the error after 10 minutes).
    pub(crate) async fn wait_gone(
        &self,
        what: &str,
        mut exists: impl AsyncFnMut() -> Result<Option<String>>,
    ) -> Result<()> {
        let started = Instant::now();
        while let Some(why) = exists().await? {
            if started.elapsed() > Duration::from_secs(600) {
                bail!("{what} is still there after 10 minutes{why}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Waits until volume `volume` reads `Bound` with claimRef naming claim
    /// `claim` by `uid`, and the claim reads `Bound` to it: only then is a
    /// `Delete` policy safe (a `Released` volume with `Delete` is deleted by
    /// the external-provisioner, whatever its claimRef says).
    pub(crate) async fn wait_bound(
        &self,
        volume: &str,
        claim: &str,
        uid: &str,
        limit: Duration,
    ) -> Result<()> {
        let ns = &self.namespace;
        let keep = "its reclaimPolicy stays Retain and the plan stays recorded";
        let started = Instant::now();
        loop {
            let Some(pv) = self.pvs().get_opt(volume).await? else {
                bail!(
                    "PersistentVolume {volume} is gone while waiting for it to be Bound to claim {ns}/{claim}"
                );
            };
            let r = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            if !r.is_some_and(|r| {
                r.name.as_deref() == Some(claim)
                    && r.namespace.as_deref() == Some(ns.as_str())
                    && r.uid.as_deref() == Some(uid)
            }) {
                bail!(
                    "PersistentVolume {volume} no longer names claim {ns}/{claim} (uid {uid}) in its claimRef: something else changed it; {keep}: check it, then run again with --resume or --rollback"
                );
            }
            let Some(c) = self
                .pvcs()
                .get_opt(claim)
                .await?
                .filter(|c| c.metadata.uid.as_deref() == Some(uid))
            else {
                bail!(
                    "claim {ns}/{claim} (uid {uid}) is gone while PersistentVolume {volume} waits to be Bound to it; {keep}: check it, then run again with --resume or --rollback"
                );
            };
            let pv_phase = pv.status.and_then(|s| s.phase).unwrap_or_default();
            let claim_phase = c
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            if pv_phase == "Bound" && claim_phase == "Bound" && bound_to(&c, volume) {
                return Ok(());
            }
            if started.elapsed() >= limit {
                bail!(
                    "PersistentVolume {volume} is not Bound to claim {ns}/{claim} (uid {uid}) after {}: the volume is {}, the claim {}; {keep} (restoring the policy before the PersistentVolume controller binds it could let the provisioner delete a Released volume's disk): run again with --resume once it is Bound",
                    human(limit),
                    if pv_phase.is_empty() {
                        "without a phase"
                    } else {
                        &pv_phase
                    },
                    if claim_phase.is_empty() {
                        "without a phase"
                    } else {
                        &claim_phase
                    },
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn finished(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn bound_to(c: &PersistentVolumeClaim, volume: &str) -> bool {
    c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(volume)
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
        if let Some(c) = k.pvcs().get_opt(&m.from).await?
            && bound_to(&c, &m.volume)
        {
            k.pvcs()
                .delete(&m.from, &DeleteParams::foreground())
                .await?;
            steps.push(format!("deleted claim {}/{}", k.namespace, m.from));
            k.wait_gone(
                &format!("the old claim {}/{}", k.namespace, m.from),
                async || {
                    Ok(k.pvcs()
                        .get_opt(&m.from)
                        .await?
                        .filter(|c| bound_to(c, &m.volume))
                        .map(|c| held_by(&c.metadata)))
                },
            )
            .await?;
        }
    }
    let mut bindings = Vec::new();
    for m in &plan.moves {
        let created = match k.pvcs().get_opt(&m.to).await? {
            Some(c) if bound_to(&c, &m.volume) => c,
            Some(_) => bail!(
                "claim {}/{} exists and is bound elsewhere",
                k.namespace,
                m.to
            ),
            None => {
                let c = k
                    .pvcs()
                    .create(&PostParams::default(), &new_claim(&k.namespace, &m.to, m)?)
                    .await?;
                steps.push(format!(
                    "created claim {}/{} bound to {}",
                    k.namespace, m.to, m.volume
                ));
                c
            }
        };
        let uid = created
            .metadata
            .uid
            .clone()
            .with_context(|| format!("claim {}/{} has no uid", k.namespace, m.to))?;
        let claim_ref = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": k.namespace, "name": m.to, "uid": uid});
        k.pvs()
            .patch(
                &m.volume,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"claimRef": claim_ref}})),
            )
            .await?;
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
        if let Some(c) = k.pvcs().get_opt(&m.to).await?
            && bound_to(&c, &m.volume)
        {
            k.pvcs().delete(&m.to, &DeleteParams::foreground()).await?;
            steps.push(format!("deleted claim {}/{}", k.namespace, m.to));
            k.wait_gone(
                &format!("the new claim {}/{}", k.namespace, m.to),
                async || {
                    Ok(k.pvcs()
                        .get_opt(&m.to)
                        .await?
                        .filter(|c| bound_to(c, &m.volume))
                        .map(|c| held_by(&c.metadata)))
                },
            )
            .await?;
        }
    }
    for m in &plan.moves {
        let claim = match k.pvcs().get_opt(&m.from).await? {
            Some(c) if bound_to(&c, &m.volume) => c,
            Some(_) => bail!(
                "claim {}/{} exists and is bound elsewhere; nothing more was undone",
                k.namespace,
                m.from
            ),
            None => {
                let c = k
                    .pvcs()
                    .create(
                        &PostParams::default(),
                        &new_claim(&k.namespace, &m.from, m)?,
                    )
                    .await?;
                steps.push(format!(
                    "recreated claim {}/{} bound to {}",
                    k.namespace, m.from, m.volume
                ));
                c
            }
        };
        let uid = claim
            .metadata
            .uid
            .clone()
            .with_context(|| format!("claim {}/{} has no uid", k.namespace, m.from))?;
        let claim_ref = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": k.namespace, "name": m.from, "uid": uid});
        k.pvs()
            .patch(
                &m.volume,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"claimRef": claim_ref}})),
            )
            .await?;
        bindings.push((m.clone(), m.from.clone(), uid));
    }
    finish(k, plan, &bindings, wait, &mut steps).await?;
    Ok(steps)
}
