//! The controller's watch caches on kubesim: publish, unpublish and
//! ListVolumes make no Kubernetes call whatever the cluster's size, and a
//! delete reads the volume's PersistentVolume again before deciding.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use common::*;
use proxmox_csi_controller::kube::Kube;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use serde_json::{Value, json};
use tonic::Request;

const DRIVER: &str = "csi.proxmox.sinextra.dev";

fn pv(name: &str, handle: &str, annotations: Value) -> Value {
    json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "csi": {"driver": DRIVER, "volumeHandle": handle},
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
        },
    })
}

/// kubesim with worker-2 (VM 112) registered and `others` volumes of the
/// driver; a controller watching it, its caches listed.
async fn watching(others: usize) -> (kubesim::Running, Env) {
    let kube = kubesim::start().await.unwrap();
    kube.put(
        "nodes",
        json!({"metadata": {"name": "worker-2"}, "spec": {"providerID": "proxmox://region-1/112"}}),
    );
    kube.put(
        "csinodes",
        json!({"metadata": {"name": "worker-2"}, "spec": {"drivers": [{"name": DRIVER, "nodeID": "worker-2", "topologyKeys": []}]}}),
    );
    kube.put_all(
        "persistentvolumes",
        (0..others).map(|i| {
            pv(
                &format!("pvc-o{i}"),
                &format!("region-1/pve2/local-lvm/vm-9999-pvc-o{i}"),
                json!({}),
            )
        }),
    );
    let client = kube::Client::try_from(kube::Config::new(kube.url.parse().unwrap())).unwrap();
    let k = Kube::new(client);
    let watched = k.watched().unwrap().clone();
    let e = env_with(|c| c.with_kube(k, DRIVER)).await;
    tokio::time::timeout(Duration::from_secs(30), watched.ready())
        .await
        .unwrap();
    (kube, e)
}

/// Waits until the controller's PV cache holds `name`.
async fn cached(e: &Env, name: &str) {
    let k = e.svc.0.kube.as_ref().unwrap();
    for _ in 0..100 {
        let pvs = k.watched().unwrap().pvs().unwrap_or_default();
        if pvs.iter().any(|p| p.metadata.name.as_deref() == Some(name)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{name} never reached the cache");
}

#[tokio::test]
async fn lookups_cost_no_kubernetes_call_at_any_size() {
    for others in [10, 2000] {
        let (kube, e) = watching(others).await;
        let v = create(&e, "pvc-a", Some("pve2")).await;
        kube.put("persistentvolumes", pv("pvc-a", &v.volume_id, json!({})));
        cached(&e, "pvc-a").await;
        let before = (kube.requests(), kube.objects_served());
        // worker-2 names no VM id: its Node (from the cache) does.
        e.svc
            .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
            .await
            .unwrap();
        e.svc
            .list_volumes(Request::new(callers::attacher::list_volumes("")))
            .await
            .unwrap();
        e.svc
            .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2")))
            .await
            .unwrap();
        assert_eq!(
            (kube.requests(), kube.objects_served()),
            before,
            "{others} other volumes"
        );
    }
}

#[tokio::test]
async fn a_delete_reads_the_volume_again_and_keeps_what_is_marked_keep() {
    let (kube, e) = watching(10).await;
    let v = create(&e, "pvc-k", Some("pve2")).await;
    kube.put("persistentvolumes", pv("pvc-k", &v.volume_id, json!({})));
    cached(&e, "pvc-k").await;
    kube.put(
        "persistentvolumes",
        pv(
            "pvc-k",
            &v.volume_id,
            json!({"csi.proxmox.sinextra.dev/lifecycle": "keep"}),
        ),
    );
    let before = (kube.requests(), kube.objects_served());
    e.svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap();
    assert_eq!(
        (kube.requests(), kube.objects_served()),
        (before.0 + 1, before.1 + 1),
        "one GET of the volume's PersistentVolume"
    );
    let volumes = e.admin("GET", "volumes", "").await;
    let volid = v
        .volume_id
        .splitn(4, '/')
        .skip(2)
        .collect::<Vec<_>>()
        .join(":");
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["volid"] == json!(volid)),
        "the disk marked keep is kept: {volumes}"
    );
}
