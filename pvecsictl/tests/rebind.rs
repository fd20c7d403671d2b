//! rename and swap against kubesim: claims rebound, reclaim policies
//! restored, nodes uncordoned, RBAC checked first, dry runs, and an
//! interrupted run resumed or rolled back.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::time::{Duration, Instant};

use kubesim::Running;
use pvecsictl::rebind::{self, Kube, OPERATION, Options};
use serde_json::{Value, json};

const NS: &str = "apps";

fn pv(name: &str, claim: &str, reclaim: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": reclaim,
        "csi": {"driver": "csi.proxmox.sinextra.dev", "volumeHandle": format!("region-1/pve2/local-lvm/vm-9999-{name}")},
        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": NS, "name": claim}}})
}

/// A claim asking for `volume`; kubesim's binder binds them (and writes
/// `pv.kubernetes.io/bind-completed` and the volume's claimRef.uid).
fn pvc(name: &str, volume: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": NS, "labels": {"app": "db"}, "annotations": {"team": "storage"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "proxmox", "volumeName": volume}})
}

async fn lab() -> (Running, Kube) {
    let sim = kubesim::start().await.unwrap();
    sim.put("persistentvolumes", pv("pv-a", "a", "Delete"));
    sim.put("persistentvolumeclaims", pvc("a", "pv-a"));
    sim.put("persistentvolumes", pv("pv-b", "b", "Retain"));
    sim.put("persistentvolumeclaims", pvc("b", "pv-b"));
    sim.put("nodes", json!({"metadata": {"name": "n1"}, "spec": {}}));
    sim.put("pods", json!({"metadata": {"name": "db-0", "namespace": NS}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "a"}}]}, "status": {"phase": "Running"}}));
    let client = kube::Client::try_from(kube::Config::new(sim.url.parse().unwrap())).unwrap();
    (
        sim,
        Kube {
            client,
            namespace: NS.into(),
        },
    )
}

/// Polls `f` for up to 10 s.
async fn until(mut f: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !f() {
        if started.elapsed() > Duration::from_secs(10) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

fn phase(sim: &Running, plural: &str, ns: &str, name: &str) -> String {
    sim.get(plural, ns, name)
        .map(|o| o["status"]["phase"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn rename_rebinds_restores_and_uncordons() {
    let (sim, k) = lab().await;
    assert_eq!(
        phase(&sim, "persistentvolumeclaims", NS, "a"),
        "Bound",
        "kubesim binds the seed"
    );
    let pairs = [("a".to_string(), "data".to_string())];

    let err = rebind::run(&k, "rename", &pairs, Options::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("are used by pods db-0") && err.contains("--force"),
        "{err}"
    );
    let plan = rebind::run(
        &k,
        "rename",
        &pairs,
        Options {
            dry_run: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        plan.iter()
            .any(|s| s == "create claim apps/data bound to pv-a"),
        "{plan:?}"
    );
    assert!(
        plan.iter()
            .any(|s| s == "restore pv-a reclaimPolicy Delete"),
        "{plan:?}"
    );
    let untouched = sim.get("persistentvolumes", "", "pv-a").unwrap();
    assert_eq!(untouched["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert!(
        untouched["metadata"]["annotations"]
            .get(OPERATION)
            .is_none(),
        "a dry run changes nothing"
    );

    let steps = rebind::run(
        &k,
        "rename",
        &pairs,
        Options {
            force: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        steps.contains(&"cordoned n1".to_string()) && steps.contains(&"uncordoned n1".to_string()),
        "{steps:?}"
    );
    assert!(sim.get("pods", NS, "db-0").is_none(), "the pod was deleted");
    assert!(sim.get("persistentvolumeclaims", NS, "a").is_none());
    let data = sim.get("persistentvolumeclaims", NS, "data").unwrap();
    assert_eq!(data["spec"]["volumeName"], "pv-a");
    assert_eq!(data["metadata"]["labels"]["app"], "db");
    assert_eq!(data["metadata"]["annotations"]["team"], "storage");
    assert_eq!(phase(&sim, "persistentvolumeclaims", NS, "data"), "Bound");
    // Created without what binding wrote on the old claim (bind-completed
    // would make the binder judge it Lost), and never Lost.
    let created = sim
        .events("persistentvolumeclaims")
        .into_iter()
        .find(|(t, o)| t == "ADDED" && o["metadata"]["name"] == "data")
        .unwrap()
        .1;
    assert!(
        created["metadata"]["annotations"]
            .get("pv.kubernetes.io/bind-completed")
            .is_none(),
        "{created}"
    );
    assert!(
        !sim.events("persistentvolumeclaims")
            .iter()
            .any(|(_, o)| o["metadata"]["name"] == "data" && o["status"]["phase"] == "Lost")
    );
    let pv = sim.get("persistentvolumes", "", "pv-a").unwrap();
    assert_eq!(pv["spec"]["claimRef"]["name"], "data");
    assert_eq!(
        pv["spec"]["persistentVolumeReclaimPolicy"], "Delete",
        "the reclaim policy is restored"
    );
    assert!(pv["metadata"]["annotations"].get(OPERATION).is_none());
    assert_eq!(
        sim.get("nodes", "", "n1").unwrap()["spec"]["unschedulable"],
        false,
        "uncordoned"
    );
}

#[tokio::test]
async fn swap_trades_volumes_and_keeps_each_policy() {
    let (sim, k) = lab().await;
    let pairs = [
        ("a".to_string(), "b".to_string()),
        ("b".to_string(), "a".to_string()),
    ];
    rebind::run(
        &k,
        "swap",
        &pairs,
        Options {
            force: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        sim.get("persistentvolumeclaims", NS, "a").unwrap()["spec"]["volumeName"],
        "pv-b"
    );
    assert_eq!(
        sim.get("persistentvolumeclaims", NS, "b").unwrap()["spec"]["volumeName"],
        "pv-a"
    );
    assert_eq!(phase(&sim, "persistentvolumeclaims", NS, "a"), "Bound");
    assert_eq!(phase(&sim, "persistentvolumeclaims", NS, "b"), "Bound");
    assert_eq!(
        sim.get("persistentvolumes", "", "pv-a").unwrap()["spec"]["persistentVolumeReclaimPolicy"],
        "Delete"
    );
    assert_eq!(
        sim.get("persistentvolumes", "", "pv-b").unwrap()["spec"]["persistentVolumeReclaimPolicy"],
        "Retain"
    );
}

#[tokio::test]
async fn rbac_is_checked_before_anything_changes() {
    let (sim, k) = lab().await;
    sim.deny("delete", "persistentvolumeclaims");
    let err = rebind::run(
        &k,
        "rename",
        &[("a".into(), "data".into())],
        Options {
            force: true,
            ..Default::default()
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "rbac: you are not allowed to delete persistentvolumeclaims; nothing was changed"
    );
    assert!(
        sim.get("persistentvolumeclaims", NS, "a").is_some()
            && sim.get("pods", NS, "db-0").is_some()
    );
    assert!(
        sim.get("nodes", "", "n1").unwrap()["spec"]
            .get("unschedulable")
            .is_none()
    );
}

/// The state a run leaves when it stops right after deleting the old claim.
async fn interrupted(sim: &Running) {
    let claim = sim.get("persistentvolumeclaims", NS, "a").unwrap();
    let plan = json!({"op": "rename", "namespace": NS, "cordoned": [],
        "moves": [{"volume": "pv-a", "from": "a", "to": "data", "reclaim": "Delete", "claim": claim}]});
    let mut pv = sim.get("persistentvolumes", "", "pv-a").unwrap();
    pv["metadata"]["annotations"] = json!({OPERATION: plan.to_string()});
    pv["spec"]["persistentVolumeReclaimPolicy"] = json!("Retain");
    sim.put("persistentvolumes", pv);
    let client = reqwest::Client::new();
    for path in ["pods/db-0", "persistentvolumeclaims/a"] {
        client
            .delete(format!("{}/api/v1/namespaces/{NS}/{path}", sim.url))
            .send()
            .await
            .unwrap();
    }
    // pvc-protection lets the claim go on the next tick; then it is Released.
    assert!(until(|| phase(sim, "persistentvolumes", "", "pv-a") == "Released").await);
}

#[tokio::test]
async fn an_interrupted_rename_is_resumed_or_rolled_back() {
    for rollback in [false, true] {
        let (sim, k) = lab().await;
        interrupted(&sim).await;
        let pairs = [("a".to_string(), "data".to_string())];
        let err = rebind::run(&k, "rename", &pairs, Options::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("an interrupted rename of a → data")
                && err.contains("--resume")
                && err.contains("--rollback"),
            "{err}"
        );
        let opts = Options {
            resume: !rollback,
            rollback,
            ..Default::default()
        };
        rebind::run(&k, "rename", &pairs, opts).await.unwrap();
        let (kept, gone) = if rollback {
            ("a", "data")
        } else {
            ("data", "a")
        };
        assert!(
            sim.get("persistentvolumeclaims", NS, gone).is_none(),
            "rollback={rollback}"
        );
        assert_eq!(
            phase(&sim, "persistentvolumeclaims", NS, kept),
            "Bound",
            "rollback={rollback}"
        );
        let pv = sim.get("persistentvolumes", "", "pv-a").unwrap();
        assert_eq!(pv["spec"]["claimRef"]["name"], kept);
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert!(pv["metadata"]["annotations"].get(OPERATION).is_none());
    }
}

/// After a run: once the binder has caught up, no disk was deleted, and
/// each volume is Bound to its claim (by uid) with its policy restored.
async fn kept(sim: &Running, bindings: &[(&str, &str, &str)], what: &str) {
    let settled = until(|| {
        bindings.iter().all(|(pv, claim, _)| {
            phase(sim, "persistentvolumeclaims", NS, claim) == "Bound"
                || sim.get("persistentvolumes", "", pv).is_none()
        })
    })
    .await;
    // Ticks enough for the provisioner to act on anything it would.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        sim.deleted_volumes(),
        Vec::<String>::new(),
        "{what}: the provisioner deleted a disk"
    );
    assert!(settled, "{what}: not bound after 10 s");
    for (volume, claim, reclaim) in bindings {
        let pv = sim.get("persistentvolumes", "", volume).unwrap();
        let c = sim.get("persistentvolumeclaims", NS, claim).unwrap();
        assert_eq!(pv["status"]["phase"], "Bound", "{what}: {pv}");
        assert_eq!(pv["spec"]["claimRef"]["name"], *claim, "{what}");
        assert_eq!(
            pv["spec"]["claimRef"]["uid"], c["metadata"]["uid"],
            "{what}"
        );
        assert_eq!(
            pv["spec"]["persistentVolumeReclaimPolicy"], *reclaim,
            "{what}"
        );
        assert!(
            pv["metadata"]["annotations"].get(OPERATION).is_none(),
            "{what}"
        );
    }
}

/// Research §5 point 1: the PersistentVolume controller writes a volume's
/// phase after its claimRef. Restoring `Delete` while the volume still reads
/// `Released` lets the external-provisioner delete the disk.
#[tokio::test]
async fn an_interrupted_rename_keeps_the_disk_while_the_binder_lags() {
    for rollback in [false, true] {
        let (sim, k) = lab().await;
        interrupted(&sim).await;
        sim.set_binder_delay(Duration::from_millis(500));
        let pairs = [("a".to_string(), "data".to_string())];
        let opts = Options {
            resume: !rollback,
            rollback,
            ..Default::default()
        };
        rebind::run(&k, "rename", &pairs, opts).await.unwrap();
        let claim = if rollback { "a" } else { "data" };
        kept(
            &sim,
            &[("pv-a", claim, "Delete")],
            &format!("rollback={rollback}"),
        )
        .await;
    }
}

#[tokio::test]
async fn rename_and_swap_keep_the_disks_while_the_binder_lags() {
    for op in ["rename", "swap"] {
        let (sim, k) = lab().await;
        sim.set_binder_delay(Duration::from_millis(200));
        let (pairs, bindings) = if op == "rename" {
            (
                vec![("a".to_string(), "data".to_string())],
                vec![("pv-a", "data", "Delete"), ("pv-b", "b", "Retain")],
            )
        } else {
            (
                vec![
                    ("a".to_string(), "b".to_string()),
                    ("b".to_string(), "a".to_string()),
                ],
                vec![("pv-a", "b", "Delete"), ("pv-b", "a", "Retain")],
            )
        };
        let opts = Options {
            force: true,
            ..Default::default()
        };
        rebind::run(&k, op, &pairs, opts).await.unwrap();
        kept(&sim, &bindings, op).await;
    }
}

#[tokio::test]
async fn a_volume_not_bound_in_time_keeps_retain_and_the_plan() {
    let (sim, k) = lab().await;
    interrupted(&sim).await;
    // The PersistentVolume controller does not write the phase for an hour.
    sim.set_binder_delay(Duration::from_secs(3600));
    let pairs = [("a".to_string(), "data".to_string())];
    let resume = Options {
        resume: true,
        bind_wait: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let started = Instant::now();
    let err = rebind::run(&k, "rename", &pairs, resume)
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() >= Duration::from_secs(2));
    let uid = sim.get("persistentvolumeclaims", NS, "data").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        format!(
            "PersistentVolume pv-a is not Bound to claim apps/data (uid {uid}) after 2 s: the volume is Released, the claim Pending; its reclaimPolicy stays Retain and the plan stays recorded (restoring the policy before the PersistentVolume controller binds it could let the provisioner delete a Released volume's disk): run again with --resume once it is Bound"
        )
    );
    let pv = sim.get("persistentvolumes", "", "pv-a").unwrap();
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(pv["spec"]["claimRef"]["uid"], json!(uid));
    assert!(pv["metadata"]["annotations"].get(OPERATION).is_some());
    assert!(sim.deleted_volumes().is_empty());

    // The controller catches up; --resume finishes.
    sim.set_binder_delay(Duration::ZERO);
    let steps = rebind::run(&k, "rename", &pairs, resume).await.unwrap();
    assert!(
        steps.contains(&"pv-a is Bound to apps/data".to_string()),
        "{steps:?}"
    );
    kept(&sim, &[("pv-a", "data", "Delete")], "resumed").await;
}

#[tokio::test]
async fn a_finished_pod_holding_the_claim_is_named_and_deleted_with_force() {
    let (sim, k) = lab().await;
    // pvc-protection keeps a claim that a pod on a node names, finished or not.
    sim.put("pods", json!({"metadata": {"name": "job-0", "namespace": NS}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "b"}}]}, "status": {"phase": "Succeeded"}}));
    let pairs = [("b".to_string(), "b2".to_string())];
    let err = rebind::run(&k, "rename", &pairs, Options::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("are used by pods job-0 (finished, but it holds the claim until deleted)"),
        "{err}"
    );
    let plan = rebind::run(
        &k,
        "rename",
        &pairs,
        Options {
            dry_run: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        plan.iter()
            .any(|s| s == "wait until pv-b is Bound to apps/b2"),
        "{plan:?}"
    );
    let steps = rebind::run(
        &k,
        "rename",
        &pairs,
        Options {
            force: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        steps.contains(&"deleted pod job-0".to_string()),
        "{steps:?}"
    );
    assert!(
        !steps.iter().any(|s| s.starts_with("cordoned")),
        "a finished pod's node is left alone: {steps:?}"
    );
    kept(
        &sim,
        &[("pv-b", "b2", "Retain"), ("pv-a", "a", "Delete")],
        "rename b",
    )
    .await;
}
