//! The controllers on kubesim's tick: pvc-protection, pv-protection, the
//! external-attacher and its finalizer, the provisioner's deleter, the
//! controller delay; and VolumeAttachments served like the other resources.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::{Duration, Instant};

use common::{PV_PATH, PVC_PATH, SOON, call, until};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kubesim::{ATTACHER_FINALIZER, DRIVER, PV_PROTECTION, PVC_PROTECTION, Running};
use serde_json::{Value, json};

fn volume(name: &str, claim: Option<&str>, reclaim: &str) -> Value {
    let mut v = json!({"metadata": {"name": name}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": reclaim, "csi": {"driver": DRIVER, "volumeHandle": format!("region-1/pve1/local-lvm/vm-9999-{name}")}}});
    if let Some(c) = claim {
        v["spec"]["claimRef"] =
            json!({"kind": "PersistentVolumeClaim", "namespace": "ns", "name": c});
    }
    v
}

fn claim(name: &str, volume: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}, "volumeName": volume}})
}

fn attachment(pv: &str, node: &str) -> Value {
    let handle = format!("region-1/pve1/local-lvm/vm-9999-{pv}");
    json!({"metadata": {"name": kubesim::attachment_name(&handle, DRIVER, node)},
        "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv}}})
}

fn phase(sim: &Running, plural: &str, ns: &str, name: &str) -> String {
    sim.get(plural, ns, name)
        .map(|o| o["status"]["phase"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

fn finalizers(sim: &Running, plural: &str, ns: &str, name: &str) -> Value {
    sim.get(plural, ns, name)
        .map(|o| o["metadata"]["finalizers"].clone())
        .unwrap_or_default()
}

/// A volume and its claim, bound.
async fn bound(sim: &Running, pv: &str, c: &str, reclaim: &str) {
    sim.put("persistentvolumes", volume(pv, Some(c), reclaim));
    sim.put("persistentvolumeclaims", claim(c, pv));
    assert_eq!(phase(sim, "persistentvolumes", "", pv), "Bound");
}

#[tokio::test]
async fn pvc_protection_holds_a_claim_while_a_scheduled_pod_names_it() {
    let sim = kubesim::start().await.unwrap();
    bound(&sim, "pv", "c", "Retain").await;
    let pod = |name: &str, node: Option<&str>, phase: &str| {
        let mut p = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"containers": [],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]}, "status": {"phase": phase}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    };
    // A finished pod still counts; an unscheduled one does not.
    sim.put("pods", pod("done", Some("n1"), "Succeeded"));
    sim.put("pods", pod("waiting", None, "Pending"));
    let (code, body) = call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    assert_eq!(code, 200);
    assert_eq!(body["metadata"]["finalizers"], json!([PVC_PROTECTION]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        finalizers(&sim, "persistentvolumeclaims", "ns", "c"),
        json!([PVC_PROTECTION]),
        "held by the Succeeded pod"
    );
    assert_eq!(phase(&sim, "persistentvolumes", "", "pv"), "Bound");
    let (code, _) = call(&sim, "DELETE", "/api/v1/namespaces/ns/pods/done", None).await;
    assert_eq!(code, 200);
    assert!(
        until(SOON, || sim
            .get("persistentvolumeclaims", "ns", "c")
            .is_none())
        .await
    );
    assert!(
        until(SOON, || phase(&sim, "persistentvolumes", "", "pv")
            == "Released")
        .await
    );
    assert!(sim.deleted_volumes().is_empty(), "Retain keeps the disk");
}

#[tokio::test]
async fn pv_protection_holds_a_volume_while_it_is_bound() {
    let sim = kubesim::start().await.unwrap();
    bound(&sim, "pv", "c", "Retain").await;
    let (code, body) = call(&sim, "DELETE", &format!("{PV_PATH}/pv"), None).await;
    assert_eq!(code, 200);
    assert_eq!(body["metadata"]["finalizers"], json!([PV_PROTECTION]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        sim.get("persistentvolumes", "", "pv").is_some(),
        "Bound: pv-protection holds it"
    );
    call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    assert!(until(SOON, || sim.get("persistentvolumes", "", "pv").is_none()).await);
    assert!(sim.deleted_volumes().is_empty());
}

#[tokio::test]
async fn the_attacher_finalizer_holds_a_volume_while_an_attachment_names_it() {
    assert_eq!(kubesim::attacher_finalizer(DRIVER), ATTACHER_FINALIZER);
    assert_eq!(
        kubesim::attacher_finalizer("a.b/c-"),
        "external-attacher/a-b-c-X"
    );
    let sim = kubesim::start().await.unwrap();
    sim.put("persistentvolumes", volume("pv", None, "Retain"));
    let vas: Api<VolumeAttachment> = Api::all(common::client(&sim));
    let va: VolumeAttachment = serde_json::from_value(attachment("pv", "worker-1")).unwrap();
    let name = vas
        .create(&PostParams::default(), &va)
        .await
        .unwrap()
        .metadata
        .name
        .unwrap();
    // csiAttach: the volume's finalizer, the attachment's, attached.
    assert!(
        until(SOON, || {
            let va = sim.get("volumeattachments", "", &name).unwrap();
            va["status"]["attached"] == true
                && va["metadata"]["finalizers"] == json!([ATTACHER_FINALIZER])
        })
        .await
    );
    assert_eq!(
        finalizers(&sim, "persistentvolumes", "", "pv"),
        json!([PV_PROTECTION, ATTACHER_FINALIZER])
    );

    let (code, body) = call(&sim, "DELETE", &format!("{PV_PATH}/pv"), None).await;
    assert_eq!(code, 200);
    assert!(body["metadata"]["deletionTimestamp"].is_string());
    // pv-protection goes (Available is not Bound); the attacher's stays.
    assert!(
        until(SOON, || finalizers(&sim, "persistentvolumes", "", "pv")
            == json!([ATTACHER_FINALIZER]))
        .await
    );
    // A deleting volume is not attached anywhere new.
    let other: VolumeAttachment = serde_json::from_value(attachment("pv", "worker-2")).unwrap();
    let other = vas
        .create(&PostParams::default(), &other)
        .await
        .unwrap()
        .metadata
        .name
        .unwrap();
    assert!(
        until(
            SOON,
            || sim.get("volumeattachments", "", &other).unwrap()["status"]["attachError"]["message"]
                == "PersistentVolume \"pv\" is marked for deletion"
        )
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(sim.get("persistentvolumes", "", "pv").is_some());

    // Detached (the attachment's finalizer goes), then the volume goes.
    vas.delete(&name, &DeleteParams::default()).await.unwrap();
    vas.delete(&other, &DeleteParams::default()).await.unwrap();
    assert!(until(SOON, || sim.get("persistentvolumes", "", "pv").is_none()).await);
    assert!(
        vas.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn volume_attachments_are_served_like_the_others() {
    // kubernetes pkg/volume/csi/csi_attacher.go getAttachmentName; the value
    // is `printf '%s' '<handle><driver><node>' | sha256sum`.
    assert_eq!(
        kubesim::attachment_name(
            "cluster-1/pve-1/local-lvm/vm-9999-pvc-abc",
            "csi.proxmox.sinextra.dev",
            "worker-1"
        ),
        "csi-e317559b8f4029cc6af82bace377e21b5fa1efa5c11deaf22b9a2426bbb237b7"
    );
    let sim = kubesim::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(common::client(&sim));
    let rv = vas
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = vas
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    // Another attacher's attachment: kubesim's attacher leaves it alone.
    let va: VolumeAttachment = serde_json::from_value(json!({"metadata": {"name": "va-1"},
        "spec": {"attacher": "other.csi.example", "nodeName": "n1", "source": {"persistentVolumeName": "pv"}}}))
    .unwrap();
    let created = vas.create(&PostParams::default(), &va).await.unwrap();
    assert_eq!(
        created
            .metadata
            .uid
            .as_deref()
            .map(|u| u.starts_with("uid-")),
        Some(true)
    );
    let first = watch.try_next().await.unwrap().unwrap();
    assert!(
        matches!(first, WatchEvent::Added(ref v) if v.metadata.name.as_deref() == Some("va-1")),
        "{first:?}"
    );
    let got = vas.get("va-1").await.unwrap();
    assert_eq!(got.spec.attacher, "other.csi.example");
    let raw = sim.get("volumeattachments", "", "va-1").unwrap();
    assert_eq!(raw["apiVersion"], "storage.k8s.io/v1");
    assert_eq!(raw["kind"], "VolumeAttachment");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(sim.get("volumeattachments", "", "va-1").unwrap()["metadata"]["finalizers"].is_null());
    vas.delete("va-1", &DeleteParams::default()).await.unwrap();
    let (code, err) = call(
        &sim,
        "GET",
        "/apis/storage.k8s.io/v1/volumeattachments/va-1",
        None,
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(
        err["message"],
        "volumeattachments.storage.k8s.io \"va-1\" not found"
    );
}

#[tokio::test]
async fn the_provisioner_deletes_a_released_volume_with_policy_delete() {
    let sim = kubesim::start().await.unwrap();
    bound(&sim, "pv-d", "c-d", "Delete").await;
    bound(&sim, "pv-r", "c-r", "Retain").await;
    bound(&sim, "pv-a", "c-a", "Delete").await;
    sim.put("volumeattachments", attachment("pv-a", "worker-1"));
    for c in ["c-d", "c-r", "c-a"] {
        call(&sim, "DELETE", &format!("{PVC_PATH}/{c}"), None).await;
    }
    assert!(until(SOON, || sim.get("persistentvolumes", "", "pv-d").is_none()).await);
    assert_eq!(
        sim.deleted_volumes(),
        ["DeleteVolume(region-1/pve1/local-lvm/vm-9999-pv-d)"]
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(phase(&sim, "persistentvolumes", "", "pv-r"), "Released");
    // canDeleteVolume: not while an attachment names it.
    assert_eq!(phase(&sim, "persistentvolumes", "", "pv-a"), "Released");
    assert_eq!(sim.deleted_volumes().len(), 1);
    let va = kubesim::attachment_name("region-1/pve1/local-lvm/vm-9999-pv-a", DRIVER, "worker-1");
    call(
        &sim,
        "DELETE",
        &format!("/apis/storage.k8s.io/v1/volumeattachments/{va}"),
        None,
    )
    .await;
    assert!(until(SOON, || sim.get("persistentvolumes", "", "pv-a").is_none()).await);
    assert_eq!(
        sim.deleted_volumes(),
        [
            "DeleteVolume(region-1/pve1/local-lvm/vm-9999-pv-d)",
            "DeleteVolume(region-1/pve1/local-lvm/vm-9999-pv-a)"
        ]
    );
    // Another driver's volume is not ours to delete.
    let mut foreign = volume("pv-x", Some("gone"), "Delete");
    foreign["spec"]["csi"]["driver"] = json!("other.csi.example");
    foreign["spec"]["claimRef"]["uid"] = json!("uid-gone");
    sim.put("persistentvolumes", foreign);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(phase(&sim, "persistentvolumes", "", "pv-x"), "Released");
    assert_eq!(sim.deleted_volumes().len(), 2);
}

#[tokio::test]
async fn the_controller_delay_holds_the_controllers_back() {
    let sim = kubesim::start().await.unwrap();
    bound(&sim, "pv", "c", "Retain").await;
    sim.set_controller_delay(Duration::from_millis(500));
    let started = Instant::now();
    call(&sim, "DELETE", &format!("{PVC_PATH}/c"), None).await;
    assert!(
        until(SOON, || sim
            .get("persistentvolumeclaims", "ns", "c")
            .is_none())
        .await
    );
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );
}
