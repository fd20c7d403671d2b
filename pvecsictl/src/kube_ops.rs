//! The Kubernetes side of `rename`, `swap` and `migrate`: the claims and
//! volumes of one namespace, the pods that use them, cordons, and the waits
//! for deletions and bindings, each failing with what holds it up.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

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

pub(crate) fn bound_to(c: &PersistentVolumeClaim, volume: &str) -> bool {
    c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(volume)
}
