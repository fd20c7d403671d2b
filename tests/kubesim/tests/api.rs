//! kubesim through kube-rs: create, conflicts on a stale replace, merge
//! patches, the binder, and watch from a resourceVersion.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

#[tokio::test]
async fn resource_versions_conflicts_binding_and_watch() {
    let sim = kubesim::start().await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(sim.url.parse().unwrap())).unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pv-1"}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "claimRef": {"namespace": "ns", "name": "c1"}}})).unwrap();
    let created = pvs.create(&PostParams::default(), &pv).await.unwrap();
    // The binder writes the phase (Available) after the create.
    let rv0 = pvs
        .get("pv-1")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let dup = pvs.create(&PostParams::default(), &pv).await.unwrap_err();
    assert!(
        matches!(dup, kube::Error::Api(ref e) if e.code == 409 && e.reason == "AlreadyExists"),
        "{dup:?}"
    );

    // A watch from now sees what follows.
    let mut events = pvs
        .watch(&WatchParams::default().timeout(5), &rv0)
        .await
        .unwrap()
        .boxed();
    pvs.patch(
        "pv-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    let first = events.try_next().await.unwrap().unwrap();
    assert!(
        matches!(first, WatchEvent::Modified(ref p) if p.metadata.labels.as_ref().is_some_and(|l| l["x"] == "1")),
        "{first:?}"
    );

    // A replace with the version read before the patch is refused.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("y".to_string(), "2".to_string())].into());
    let err = pvs
        .replace("pv-1", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 409 && e.reason == "Conflict"),
        "{err:?}"
    );

    // The binder: a claim naming the volume that names it binds both.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "ns");
    let pvc: PersistentVolumeClaim = serde_json::from_value(
        json!({"metadata": {"name": "c1"}, "spec": {"accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pv-1"}}),
    )
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    assert_eq!(
        pvcs.get("c1")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Bound")
    );
    assert_eq!(
        pvs.get("pv-1")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Bound")
    );
    // pvc-protection holds the claim until the next tick; then it goes and
    // the volume is Released.
    pvcs.delete("c1", &Default::default()).await.unwrap();
    assert!(
        common::until(common::SOON, || sim
            .get("persistentvolumes", "", "pv-1")
            .is_some_and(|pv| pv["status"]["phase"] == "Released"))
        .await
    );
    assert!(pvcs.get_opt("c1").await.unwrap().is_none());
}
