//! The generic registry rules kubesim follows: admission finalizers,
//! DELETE with and without finalizers, propagation policies,
//! updates of deleting objects, and DELETE preconditions; status codes,
//! texts and watch events as the API server gives them.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use common::{PV_PATH, PVC_PATH, SOON, call, until};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use kubesim::{FOREGROUND_DELETION, ORPHAN, PV_PROTECTION, PVC_PROTECTION};
use serde_json::{Value, json};

const HOLD: &str = "example.com/hold";

fn claim(name: &str, finalizers: &[&str]) -> Value {
    let mut c = json!({"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}}});
    if !finalizers.is_empty() {
        c["metadata"]["finalizers"] = json!(finalizers);
    }
    c
}

fn volume(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain"}})
}

/// kubesim with the admission off, so only the test's finalizers are there.
async fn bare() -> kubesim::Running {
    let sim = kubesim::start().await.unwrap();
    sim.set_admission(false);
    sim
}

fn events(sim: &kubesim::Running, plural: &str, name: &str) -> Vec<(String, Value)> {
    sim.events(plural)
        .into_iter()
        .filter(|(_, o)| o["metadata"]["name"] == name)
        .collect()
}

#[tokio::test]
async fn admission_adds_the_protection_finalizers_at_create() {
    let sim = kubesim::start().await.unwrap();
    let (code, c) = call(&sim, "POST", PVC_PATH, Some(claim("c", &[]))).await;
    assert_eq!(code, 201);
    assert_eq!(c["metadata"]["finalizers"], json!([PVC_PROTECTION]));
    let (_, c) = call(&sim, "POST", PVC_PATH, Some(claim("c2", &[HOLD]))).await;
    assert_eq!(c["metadata"]["finalizers"], json!([HOLD, PVC_PROTECTION]));
    let (code, v) = call(&sim, "POST", PV_PATH, Some(volume("pv"))).await;
    assert_eq!(code, 201);
    assert_eq!(v["metadata"]["finalizers"], json!([PV_PROTECTION]));
    let (_, p) = call(
        &sim,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some(json!({"metadata": {"name": "p"}, "spec": {"containers": []}})),
    )
    .await;
    assert!(p["metadata"]["finalizers"].is_null(), "{p}");
    // A seeded object is created too.
    sim.put("persistentvolumes", volume("seeded"));
    assert_eq!(
        sim.get("persistentvolumes", "", "seeded").unwrap()["metadata"]["finalizers"],
        json!([PV_PROTECTION])
    );
    sim.set_admission(false);
    let (_, c) = call(&sim, "POST", PVC_PATH, Some(claim("c3", &[]))).await;
    assert!(c["metadata"]["finalizers"].is_null(), "{c}");
}

#[tokio::test]
async fn delete_without_finalizers_removes_the_object_at_once() {
    let sim = bare().await;
    let (_, created) = call(&sim, "POST", PV_PATH, Some(volume("pv"))).await;
    let stored = sim.get("persistentvolumes", "", "pv").unwrap();
    let (code, body) = call(&sim, "DELETE", &format!("{PV_PATH}/pv"), None).await;
    assert_eq!(code, 200);
    assert_eq!(body["metadata"]["uid"], created["metadata"]["uid"]);
    assert!(body["metadata"]["deletionTimestamp"].is_null());
    let (code, gone) = call(&sim, "GET", &format!("{PV_PATH}/pv"), None).await;
    assert_eq!((code, gone["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(gone["message"], "persistentvolumes \"pv\" not found");
    let evs = events(&sim, "persistentvolumes", "pv");
    let (last_type, last) = evs.last().unwrap();
    assert_eq!(last_type, "DELETED");
    // The last state, with the revision of the deletion.
    let rv = |o: &Value| {
        o["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(last) > rv(&stored), "{last}");
    assert_eq!(last["spec"], stored["spec"]);
}

#[tokio::test]
async fn delete_with_a_finalizer_marks_the_object_deleting_and_a_repeat_changes_nothing() {
    let sim = bare().await;
    call(&sim, "POST", PVC_PATH, Some(claim("c", &[HOLD]))).await;
    let before = events(&sim, "persistentvolumeclaims", "c").len();
    let (code, body) = call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    assert_eq!(code, 200);
    let ts = body["metadata"]["deletionTimestamp"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        ts.len() == 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
        "RFC 3339: {ts}"
    );
    assert_eq!(body["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(body["metadata"]["finalizers"], json!([HOLD]));
    let evs = events(&sim, "persistentvolumeclaims", "c");
    assert_eq!(evs.len(), before + 1);
    assert_eq!(evs[before].0, "MODIFIED");
    assert_eq!(evs[before].1["metadata"]["deletionTimestamp"], json!(ts));
    // Still readable.
    let (code, got) = call(&sim, "GET", &format!("{PVC_PATH}/c"), None).await;
    assert_eq!(code, 200);
    assert_eq!(got, body);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (code, again) = call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    assert_eq!(code, 200);
    assert_eq!(again, body, "same timestamp, same resourceVersion");
    assert_eq!(
        events(&sim, "persistentvolumeclaims", "c").len(),
        before + 1,
        "no event"
    );
}

#[tokio::test]
async fn propagation_policies_set_and_clear_the_gc_finalizers() {
    let sim = bare().await;
    // Foreground: `foregroundDeletion` even without finalizers; the GC removes
    // it on a tick (nothing depends on a claim), and the claim goes.
    call(&sim, "POST", PVC_PATH, Some(claim("fg", &[]))).await;
    let (code, body) = call(
        &sim,
        "DELETE",
        &format!("{PVC_PATH}/fg"),
        Some(
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}),
        ),
    )
    .await;
    assert_eq!(code, 200, "Foreground is 200, not 202");
    assert_eq!(body["metadata"]["finalizers"], json!([FOREGROUND_DELETION]));
    assert!(body["metadata"]["deletionTimestamp"].is_string());
    assert!(
        until(SOON, || sim
            .get("persistentvolumeclaims", "ns", "fg")
            .is_none())
        .await
    );
    // The GC's removal of the last finalizer is the DELETED, with no MODIFIED.
    let evs = events(&sim, "persistentvolumeclaims", "fg");
    let tail: Vec<&str> = evs[evs.len() - 2..].iter().map(|e| e.0.as_str()).collect();
    assert_eq!(tail, ["MODIFIED", "DELETED"]);
    assert_eq!(
        evs[evs.len() - 2].1["metadata"]["finalizers"],
        json!([FOREGROUND_DELETION])
    );

    // Orphan: `orphan`, removed by the GC; the other finalizer holds the claim.
    call(&sim, "POST", PVC_PATH, Some(claim("or", &[HOLD]))).await;
    let (_, body) = call(
        &sim,
        "DELETE",
        &format!("{PVC_PATH}/or?propagationPolicy=Orphan"),
        None,
    )
    .await;
    assert_eq!(body["metadata"]["finalizers"], json!([HOLD, ORPHAN]));
    assert!(
        until(SOON, || sim
            .get("persistentvolumeclaims", "ns", "or")
            .is_some_and(|c| c["metadata"]["finalizers"] == json!([HOLD])))
        .await
    );

    // With the controllers held back, a Background DELETE takes
    // `foregroundDeletion` out again, and with nothing left the claim goes.
    sim.set_controller_delay(Duration::from_secs(3600));
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(common::client(&sim), "ns");
    call(&sim, "POST", PVC_PATH, Some(claim("bg", &[]))).await;
    pvcs.delete("bg", &DeleteParams::foreground())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        sim.get("persistentvolumeclaims", "ns", "bg").unwrap()["metadata"]["finalizers"],
        json!([FOREGROUND_DELETION])
    );
    let (code, _) = call(
        &sim,
        "DELETE",
        &format!("{PVC_PATH}/bg"),
        Some(json!({"propagationPolicy": "Background"})),
    )
    .await;
    assert_eq!(code, 200);
    assert!(sim.get("persistentvolumeclaims", "ns", "bg").is_none());
}

#[tokio::test]
async fn emptying_the_finalizers_of_a_deleting_object_deletes_it() {
    let sim = bare().await;
    call(
        &sim,
        "POST",
        PVC_PATH,
        Some(claim("c", &[HOLD, "example.com/two"])),
    )
    .await;
    call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    let n = events(&sim, "persistentvolumeclaims", "c").len();
    // Some but not all: a MODIFIED.
    let (code, body) = call(
        &sim,
        "PATCH",
        &format!("{PVC_PATH}/c"),
        Some(json!({"metadata": {"finalizers": [HOLD]}})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(body["metadata"]["finalizers"], json!([HOLD]));
    let evs = events(&sim, "persistentvolumeclaims", "c");
    assert_eq!((evs.len(), evs[n].0.as_str()), (n + 1, "MODIFIED"));
    let stored = sim.get("persistentvolumeclaims", "ns", "c").unwrap();

    // The last one: gone, 200 with the request's object, only a DELETED.
    let (code, body) = call(
        &sim,
        "PATCH",
        &format!("{PVC_PATH}/c"),
        Some(json!({"metadata": {"finalizers": null}})),
    )
    .await;
    assert_eq!(code, 200);
    assert!(body["metadata"]["finalizers"].is_null(), "{body}");
    assert!(body["metadata"]["deletionTimestamp"].is_string(), "{body}");
    assert!(sim.get("persistentvolumeclaims", "ns", "c").is_none());
    let evs = events(&sim, "persistentvolumeclaims", "c");
    assert_eq!(evs.len(), n + 2);
    assert_eq!(evs[n + 1].0, "DELETED");
    assert_eq!(
        evs[n + 1].1["metadata"]["finalizers"],
        json!([HOLD]),
        "the DELETED event carries the last stored state"
    );
    assert_eq!(evs[n + 1].1["spec"], stored["spec"]);
}

#[tokio::test]
async fn no_new_finalizers_on_a_deleting_object() {
    let sim = bare().await;
    call(&sim, "POST", PVC_PATH, Some(claim("c", &[HOLD]))).await;
    let (_, deleting) = call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    let (code, err) = call(
        &sim,
        "PATCH",
        &format!("{PVC_PATH}/c"),
        Some(json!({"metadata": {"finalizers": [HOLD, "x"]}})),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(err["reason"], "Invalid");
    assert_eq!(
        err["message"],
        r#"PersistentVolumeClaim "c" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"x"}"#
    );
    assert_eq!(err["details"]["causes"][0]["field"], "metadata.finalizers");
    // A replace too.
    let mut put = deleting.clone();
    put["metadata"]["finalizers"] = json!(["y", HOLD]);
    let (code, _) = call(&sim, "PUT", &format!("{PVC_PATH}/c"), Some(put)).await;
    assert_eq!(code, 422);
    assert_eq!(
        sim.get("persistentvolumeclaims", "ns", "c").unwrap(),
        deleting
    );
}

#[tokio::test]
async fn an_update_keeps_the_deletion_timestamp() {
    let sim = bare().await;
    call(&sim, "POST", PVC_PATH, Some(claim("c", &[HOLD]))).await;
    let (_, deleting) = call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    let ts = deleting["metadata"]["deletionTimestamp"].clone();
    for change in [json!("2000-01-01T00:00:00Z"), Value::Null] {
        let (code, body) = call(
            &sim,
            "PATCH",
            &format!("{PVC_PATH}/c"),
            Some(json!({"metadata": {"deletionTimestamp": change, "deletionGracePeriodSeconds": null, "labels": {"l": "1"}}})),
        )
        .await;
        assert_eq!(code, 200);
        assert_eq!(body["metadata"]["deletionTimestamp"], ts);
        assert_eq!(body["metadata"]["deletionGracePeriodSeconds"], 0);
    }
    let mut put = sim.get("persistentvolumeclaims", "ns", "c").unwrap();
    put["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("deletionTimestamp");
    let (code, body) = call(&sim, "PUT", &format!("{PVC_PATH}/c"), Some(put)).await;
    assert_eq!(code, 200);
    assert_eq!(body["metadata"]["deletionTimestamp"], ts);
}

#[tokio::test]
async fn delete_preconditions_answer_409() {
    let sim = bare().await;
    let (_, c) = call(&sim, "POST", PVC_PATH, Some(claim("c", &[]))).await;
    let uid = c["metadata"]["uid"].as_str().unwrap().to_string();
    // The binder has written the claim's phase since.
    let rv = sim.get("persistentvolumeclaims", "ns", "c").unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, err) = call(
        &sim,
        "DELETE",
        &format!("{PVC_PATH}/c"),
        Some(json!({"preconditions": {"uid": "A"}})),
    )
    .await;
    assert_eq!((code, err["reason"].as_str()), (409, Some("Conflict")));
    assert_eq!(
        err["message"],
        format!(
            "Operation cannot be fulfilled on PersistentVolumeClaim \"c\": the UID in the precondition (A) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
        )
    );
    let (code, err) = call(
        &sim,
        "DELETE",
        &format!("{PVC_PATH}/c"),
        Some(json!({"preconditions": {"uid": uid, "resourceVersion": "1"}})),
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(
        err["message"],
        format!(
            "Operation cannot be fulfilled on PersistentVolumeClaim \"c\": the ResourceVersion in the precondition (1) does not match the ResourceVersion in record ({rv}). The object might have been modified"
        )
    );
    assert!(sim.get("persistentvolumeclaims", "ns", "c").is_some());
    // Through kube-rs, with both right: deleted.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(common::client(&sim), "ns");
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: Some(rv),
        }),
        ..Default::default()
    };
    pvcs.delete("c", &dp).await.unwrap();
    assert!(sim.get("persistentvolumeclaims", "ns", "c").is_none());
}
