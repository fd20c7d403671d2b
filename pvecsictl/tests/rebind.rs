//! rename and swap against kubesim: claims rebound, reclaim policies
//! restored, nodes uncordoned, RBAC checked first, dry runs, and an
//! interrupted run resumed or rolled back.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
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

fn pvc(name: &str, volume: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": NS, "labels": {"app": "db"}, "annotations": {"pv.kubernetes.io/bind-completed": "yes", "team": "storage"}},
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
    assert!(
        data["metadata"]["annotations"]
            .get("pv.kubernetes.io/bind-completed")
            .is_none()
    );
    assert_eq!(phase(&sim, "persistentvolumeclaims", NS, "data"), "Bound");
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
    assert_eq!(phase(sim, "persistentvolumes", "", "pv-a"), "Released");
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
