//! The PersistentVolume binder with claimRef.uid: pre-bound volumes get the
//! uid, a uid that isn't the live claim's releases the volume, Released
//! becomes Bound again, a claim asking for another's volume stays Pending,
//! a bound claim whose volume names another uid is Lost, and the phase
//! write lags the claimRef write by the binder delay.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::{Duration, Instant};

use common::{PV_PATH, PVC_PATH, SOON, call, until};
use kubesim::{DRIVER, Running};
use serde_json::{Value, json};

fn volume(name: &str, claim_ref: Value, reclaim: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": reclaim, "claimRef": claim_ref,
        "csi": {"driver": DRIVER, "volumeHandle": format!("h-{name}")}}})
}

fn claim(name: &str, volume: Option<&str>) -> Value {
    let mut c = json!({"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}}});
    if let Some(v) = volume {
        c["spec"]["volumeName"] = json!(v);
    }
    c
}

fn get(sim: &Running, plural: &str, name: &str) -> Value {
    let ns = if plural == "persistentvolumes" {
        ""
    } else {
        "ns"
    };
    sim.get(plural, ns, name).unwrap_or_default()
}

fn phase(sim: &Running, plural: &str, name: &str) -> String {
    get(sim, plural, name)["status"]["phase"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

async fn create(sim: &Running, path: &str, body: Value) -> Value {
    let (code, out) = call(sim, "POST", path, Some(body)).await;
    assert_eq!(code, 201, "{out}");
    out
}

#[tokio::test]
async fn a_pre_bound_volume_is_bound_and_gets_the_claim_uid() {
    let sim = kubesim::start().await.unwrap();
    create(
        &sim,
        PV_PATH,
        volume("pv", json!({"namespace": "ns", "name": "c"}), "Retain"),
    )
    .await;
    assert_eq!(
        phase(&sim, "persistentvolumes", "pv"),
        "Available",
        "pre-bound"
    );
    let c = create(&sim, PVC_PATH, claim("c", Some("pv"))).await;
    let pv = get(&sim, "persistentvolumes", "pv");
    assert_eq!(pv["status"]["phase"], "Bound");
    assert_eq!(
        pv["spec"]["claimRef"]["uid"], c["metadata"]["uid"],
        "uid filled"
    );
    assert_eq!(pv["spec"]["claimRef"]["kind"], "PersistentVolumeClaim");
    assert!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"].is_null(),
        "it was bound to that claim already"
    );
    let c = get(&sim, "persistentvolumeclaims", "c");
    assert_eq!(c["status"]["phase"], "Bound");
    assert_eq!(c["status"]["capacity"]["storage"], "1Gi");
    assert_eq!(
        c["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"],
        "yes"
    );

    // A claim without volumeName finds the volume pre-bound to it.
    create(
        &sim,
        PV_PATH,
        volume("pv2", json!({"namespace": "ns", "name": "c2"}), "Retain"),
    )
    .await;
    create(&sim, PVC_PATH, claim("c2", None)).await;
    let c2 = get(&sim, "persistentvolumeclaims", "c2");
    assert_eq!(c2["spec"]["volumeName"], "pv2");
    assert_eq!(c2["status"]["phase"], "Bound");
    assert_eq!(
        c2["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
}

#[tokio::test]
async fn a_claim_ref_uid_that_is_not_the_live_claims_releases_the_volume() {
    let sim = kubesim::start().await.unwrap();
    let c = create(&sim, PVC_PATH, claim("c", Some("pv"))).await;
    assert_eq!(
        phase(&sim, "persistentvolumeclaims", "c"),
        "Pending",
        "no such volume"
    );
    create(
        &sim,
        PV_PATH,
        volume(
            "pv",
            json!({"namespace": "ns", "name": "c", "uid": "uid-of-a-deleted-claim"}),
            "Retain",
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        phase(&sim, "persistentvolumes", "pv"),
        "Released",
        "not Available"
    );
    assert_eq!(phase(&sim, "persistentvolumeclaims", "c"), "Pending");

    // Released → Bound once claimRef names the live claim with its uid.
    let (code, _) = call(
        &sim,
        "PATCH",
        &format!("{PV_PATH}/pv"),
        Some(json!({"spec": {"claimRef": {"uid": c["metadata"]["uid"]}}})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(phase(&sim, "persistentvolumes", "pv"), "Bound");
    assert_eq!(phase(&sim, "persistentvolumeclaims", "c"), "Bound");
    assert!(sim.deleted_volumes().is_empty());
}

#[tokio::test]
async fn a_claim_asking_for_a_volume_bound_to_another_claim_stays_pending() {
    let sim = kubesim::start().await.unwrap();
    create(
        &sim,
        PV_PATH,
        volume("pv", json!({"namespace": "ns", "name": "a"}), "Delete"),
    )
    .await;
    let a = create(&sim, PVC_PATH, claim("a", Some("pv"))).await;
    create(&sim, PVC_PATH, claim("b", Some("pv"))).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(phase(&sim, "persistentvolumeclaims", "b"), "Pending");
    assert_eq!(phase(&sim, "persistentvolumeclaims", "a"), "Bound");
    let pv = get(&sim, "persistentvolumes", "pv");
    assert_eq!(pv["status"]["phase"], "Bound");
    assert_eq!(pv["spec"]["claimRef"]["uid"], a["metadata"]["uid"]);
    assert!(sim.deleted_volumes().is_empty());
}

#[tokio::test]
async fn a_bound_claim_whose_volume_names_another_uid_is_lost() {
    let sim = kubesim::start().await.unwrap();
    sim.put(
        "persistentvolumes",
        volume(
            "pv",
            json!({"namespace": "ns", "name": "c", "uid": "uid-other"}),
            "Retain",
        ),
    );
    let mut c = claim("c", Some("pv"));
    c["metadata"]["namespace"] = json!("ns");
    c["metadata"]["annotations"] = json!({"pv.kubernetes.io/bind-completed": "yes"});
    sim.put("persistentvolumeclaims", c);
    assert_eq!(phase(&sim, "persistentvolumeclaims", "c"), "Lost");
    assert_eq!(phase(&sim, "persistentvolumes", "pv"), "Released");
}

#[tokio::test]
async fn the_phase_write_lags_the_claim_ref_write_by_the_binder_delay() {
    let sim = kubesim::start().await.unwrap();
    // A volume whose claim is gone (Released), and a new claim asking for it.
    sim.put(
        "persistentvolumes",
        volume(
            "pv",
            json!({"namespace": "ns", "name": "old", "uid": "uid-old"}),
            "Retain",
        ),
    );
    assert_eq!(phase(&sim, "persistentvolumes", "pv"), "Released");
    sim.set_binder_delay(Duration::from_millis(400));
    let c = create(&sim, PVC_PATH, claim("new", Some("pv"))).await;
    let started = Instant::now();
    call(
        &sim,
        "PATCH",
        &format!("{PV_PATH}/pv"),
        Some(json!({"spec": {"claimRef": {"name": "new", "uid": c["metadata"]["uid"]}}})),
    )
    .await;
    // The window: a new claimRef, still Released.
    let pv = get(&sim, "persistentvolumes", "pv");
    assert_eq!(pv["spec"]["claimRef"]["uid"], c["metadata"]["uid"]);
    assert_eq!(pv["status"]["phase"], "Released");
    assert!(until(SOON, || phase(&sim, "persistentvolumes", "pv") == "Bound").await);
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "{:?}",
        started.elapsed()
    );
    assert!(
        until(SOON, || phase(&sim, "persistentvolumeclaims", "new")
            == "Bound")
        .await
    );
    // The claim is Bound only after the volume.
    let rv_of = |plural: &str, name: &str| {
        sim.events(plural)
            .into_iter()
            .find(|(_, o)| o["metadata"]["name"] == name && o["status"]["phase"] == "Bound")
            .map(|(_, o)| {
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .unwrap()
    };
    assert!(rv_of("persistentvolumes", "pv") < rv_of("persistentvolumeclaims", "new"));
}

#[tokio::test]
async fn in_the_window_a_delete_policy_loses_the_disk() {
    // What pvecsictl must not do: policy Delete while the volume is still Released.
    let sim = kubesim::start().await.unwrap();
    sim.put(
        "persistentvolumes",
        volume(
            "pv",
            json!({"namespace": "ns", "name": "old", "uid": "uid-old"}),
            "Retain",
        ),
    );
    sim.set_binder_delay(Duration::from_millis(400));
    let c = create(&sim, PVC_PATH, claim("new", Some("pv"))).await;
    call(
        &sim,
        "PATCH",
        &format!("{PV_PATH}/pv"),
        Some(
            json!({"spec": {"claimRef": {"name": "new", "uid": c["metadata"]["uid"]},
            "persistentVolumeReclaimPolicy": "Delete"}}),
        ),
    )
    .await;
    assert!(until(SOON, || sim.get("persistentvolumes", "", "pv").is_none()).await);
    assert_eq!(sim.deleted_volumes(), ["DeleteVolume(h-pv)"]);
}
