//! The controller with a Kubernetes API (a minimal stand-in serving Nodes,
//! PersistentVolumes and VolumeAttributesClasses): node → VM by providerID
//! and annotation, `lifecycle: keep`, and classes applied at attach and by
//! ControllerModifyVolume. The stand-in serves no watch, so the controller
//! reads every lookup from it (`Kube::unwatched`), as it does until its
//! caches have listed; the caches are tested on kubesim (`watch.rs`).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::sync::Arc;

use axum::Json;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::get;
use common::*;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::kube::Kube;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use serde_json::{Value, json};
use tonic::Request;

const KEEP: &str = "region-1/pve2/local-lvm/vm-9999-pvc-keep";
const FAST: &str = "region-1/pve2/local-lvm/vm-9999-pvc-fast";

fn not_found(what: &str) -> (StatusCode, Json<Value>) {
    (
        StatusCode::NOT_FOUND,
        Json(
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": format!("{what} not found")}),
        ),
    )
}

async fn node(Path(name): Path<String>) -> (StatusCode, Json<Value>) {
    let (spec, annotations) = match name.as_str() {
        "worker-x" => (json!({"providerID": "proxmox://region-1/113"}), json!({})),
        "worker-y" => (
            json!({}),
            json!({"proxmox.sinextra.dev/instance-id": "112"}),
        ),
        // Named like both worker-2 and worker-3: only the SMBIOS uuid tells them apart.
        "worker" => (json!({}), json!({})),
        _ => return not_found(&format!("nodes \"{name}\"")),
    };
    let status = json!({"nodeInfo": {"systemUUID": "5E7F1C2A-9B3D-4C1E-8F00-00000000A113", "machineID": "", "bootID": "", "kernelVersion": "", "osImage": "",
        "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}});
    (
        StatusCode::OK,
        Json(
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "annotations": annotations}, "spec": spec, "status": status}),
        ),
    )
}

fn pv(name: &str, handle: &str, annotations: Value, vac: Option<&str>) -> Value {
    let mut spec = json!({"csi": {"driver": "csi.proxmox.sinextra.dev", "volumeHandle": handle}, "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]});
    if let Some(v) = vac {
        spec["volumeAttributesClassName"] = json!(v);
    }
    json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec})
}

async fn pvs() -> Json<Value> {
    Json(json!({
        "kind": "PersistentVolumeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
        "items": [
            pv("pvc-keep", KEEP, json!({"csi.proxmox.sinextra.dev/lifecycle": "keep"}), None),
            pv("pvc-fast", FAST, json!({}), Some("fast")),
        ],
    }))
}

/// One of `pvs` by name, as the API server's GET answers it.
async fn pv_named(Path(name): Path<String>) -> (StatusCode, Json<Value>) {
    let Json(list) = pvs().await;
    match list["items"].as_array().and_then(|items| {
        items
            .iter()
            .find(|pv| pv["metadata"]["name"] == json!(name))
    }) {
        Some(pv) => {
            let mut pv = pv.clone();
            pv["kind"] = json!("PersistentVolume");
            pv["apiVersion"] = json!("v1");
            (StatusCode::OK, Json(pv))
        }
        None => not_found(&format!("persistentvolumes \"{name}\"")),
    }
}

async fn vac(Path(name): Path<String>) -> (StatusCode, Json<Value>) {
    if name != "fast" {
        return not_found(&format!(
            "volumeattributesclasses.storage.k8s.io \"{name}\""
        ));
    }
    (
        StatusCode::OK,
        Json(
            // `tier`: a key no driver reads, in a class made for another.
            json!({"kind": "VolumeAttributesClass", "apiVersion": "storage.k8s.io/v1", "metadata": {"name": "fast"}, "driverName": "csi.proxmox.sinextra.dev", "parameters": {"diskIOPS": "500", "tier": "gold"}}),
        ),
    )
}

/// What the node plugins registered: worker-y's id has no VM id (its Node's
/// annotation names VM 112).
async fn csinodes() -> Json<Value> {
    let csinode = |name: &str, id: &str| json!({"metadata": {"name": name}, "spec": {"drivers": [{"name": "csi.proxmox.sinextra.dev", "nodeID": id, "topologyKeys": ["topology.kubernetes.io/zone"]}]}});
    Json(json!({
        "kind": "CSINodeList", "apiVersion": "storage.k8s.io/v1", "metadata": {"resourceVersion": "1"},
        "items": [csinode("worker-y", "worker-y"), csinode("worker-x", "worker-x")],
    }))
}

/// Discovery of `storage.k8s.io/<version>` (kube-apiserver's
/// APIResourceList), with VolumeAttributesClasses where `vacs` says.
fn resources(version: &'static str, vacs: bool) -> Json<Value> {
    let mut resources = vec![
        json!({"name": "csinodes", "singularName": "csinode", "namespaced": false, "kind": "CSINode", "verbs": ["get", "list"]}),
    ];
    if vacs {
        resources.push(json!({"name": "volumeattributesclasses", "singularName": "volumeattributesclass", "namespaced": false, "kind": "VolumeAttributesClass", "verbs": ["get", "list"]}));
    }
    Json(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("storage.k8s.io/{version}"), "resources": resources}),
    )
}

/// ControllerPublish of `v` to `node`, then the drive line VM `vmid` got.
async fn publish_and_read(e: &Env, v: &csi::Volume, node: &str, vmid: u32) -> String {
    let ctx = e
        .svc
        .controller_publish_volume(Request::new(publish_req(v, node)))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    e.vm(vmid).await["config"][format!("scsi{}", ctx["lun"])]
        .as_str()
        .unwrap()
        .to_string()
}

async fn kube_api() -> kube::Client {
    kube_api_serving("v1").await
}

/// The API server of Kubernetes 1.34 (`vac_version` "v1") or of 1.31–1.33
/// with the feature on ("v1beta1": storage.k8s.io/v1 serves no
/// VolumeAttributesClass).
async fn kube_api_serving(vac_version: &'static str) -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut app = axum::Router::new()
        .route("/api/v1/nodes/{name}", get(node))
        .route("/api/v1/persistentvolumes", get(pvs))
        .route("/api/v1/persistentvolumes/{name}", get(pv_named))
        .route(
            &format!("/apis/storage.k8s.io/{vac_version}/volumeattributesclasses/{{name}}"),
            get(vac),
        )
        .route(
            "/apis/storage.k8s.io/v1",
            get(move || async move { resources("v1", vac_version == "v1") }),
        )
        .route("/apis/storage.k8s.io/v1/csinodes", get(csinodes));
    if vac_version == "v1beta1" {
        app = app.route(
            "/apis/storage.k8s.io/v1beta1",
            get(|| async { resources("v1beta1", true) }),
        );
    }
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn nodes_pvs_and_classes_from_kubernetes() {
    let k = kube_api().await;
    let e = env_with(|c| c.with_kube(Kube::unwatched(k), "csi.proxmox.sinextra.dev")).await;
    let keep = create(&e, "pvc-keep", Some("pve2")).await;
    let fast = create(&e, "pvc-fast", Some("pve2")).await;
    assert_eq!(keep.volume_id, KEEP);
    assert_eq!(fast.volume_id, FAST);

    // Node ids without a VM id: providerID, then the annotation.
    let ctx = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&keep, "worker-x")))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert!(
        e.vm(113).await["config"][format!("scsi{}", ctx["lun"])]
            .as_str()
            .unwrap()
            .contains("pvc-keep")
    );
    let ctx = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&fast, "worker-y")))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let slot = format!("scsi{}", ctx["lun"]);
    // The PV's class applies at attach.
    let line = e.vm(112).await["config"][&slot]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        line.contains("iops_rd=500") && line.contains("iops_wr=500"),
        "{line}"
    );

    // A controller that never published (restarted) lists the volumes
    // published to the ids in CSINode, as the attacher compares them.
    let fresh = ControllerService(Arc::new(common::controller_on(&e).with_kube(
        Kube::unwatched(kube_api().await),
        "csi.proxmox.sinextra.dev",
    )));
    let listed = fresh
        .list_volumes(Request::new(callers::attacher::list_volumes("")))
        .await
        .unwrap()
        .into_inner();
    assert!(
        callers::attacher::published(&listed.entries, FAST, "worker-y"),
        "{listed:?}"
    );
    assert!(
        callers::attacher::published(&listed.entries, KEEP, "worker-x"),
        "{listed:?}"
    );

    // ModifyVolume on the attached disk: a limit changed at once; a limit of
    // 0 keeps the one there, as the Go driver (ModifyVolumeParameters MergeMap).
    e.svc
        .controller_modify_volume(Request::new(callers::resizer::controller_modify(
            &pv_of(&fast),
            &[("diskIOPS", "0"), ("diskMBps", "20")],
        )))
        .await
        .unwrap();
    let line = e.vm(112).await["config"][&slot]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        line.contains("iops_rd=500") && line.contains("mbps_rd=20"),
        "{line}"
    );
    let err = e
        .svc
        .controller_modify_volume(Request::new(callers::resizer::controller_modify(
            &pv_of(&fast),
            &[("ssd", "1")],
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("not a mutable parameter; allowed: diskIOPS, diskMBps, backup, cache"),
        "{}",
        err.message()
    );

    // `lifecycle: keep`: DeleteVolume succeeds and the disk stays.
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&keep, "worker-x")))
        .await
        .unwrap();
    // No VM id on the Node: its system UUID is found in VM 113's smbios1.
    let line = publish_and_read(&e, &keep, "worker", 113).await;
    assert!(line.contains("pvc-keep"), "{line}");
    assert!(
        e.vm(112).await["config"]
            .to_string()
            .find("pvc-keep")
            .is_none(),
        "attached to the wrong VM"
    );
    // Found again: one config read confirms the VM found last time, no scan.
    let config_reads = |c: Value| {
        c["GET /nodes/{node}/qemu/{vmid}/config"]
            .as_u64()
            .unwrap_or(0)
    };
    e.admin("DELETE", "counters", "").await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&keep, "worker")))
        .await
        .unwrap();
    let by_uuid = config_reads(e.admin("GET", "counters", "").await);
    e.admin("DELETE", "counters", "").await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&keep, "worker-3/113")))
        .await
        .unwrap();
    let by_id = config_reads(e.admin("GET", "counters", "").await);
    assert_eq!(
        by_uuid,
        by_id + 1,
        "config reads: {by_uuid} by uuid, {by_id} by VM id"
    );
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&keep, "worker")))
        .await
        .unwrap();
    assert!(
        e.vm(113).await["config"]
            .to_string()
            .find("pvc-keep")
            .is_none(),
        "detached again"
    );
    e.svc
        .delete_volume(Request::new(delete_req(&keep)))
        .await
        .unwrap();
    let vols = e.admin("GET", "volumes", "").await;
    assert!(
        vols.as_array()
            .unwrap()
            .iter()
            .any(|v| v["volid"] == "local-lvm:vm-9999-pvc-keep")
    );
    // A Node that is gone: unpublish counts it as detached.
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&fast, "worker-gone")))
        .await
        .unwrap();
}

/// The node id comes from the node plugin; the Node object is Kubernetes'.
/// When both name a VM they must agree: a node plugin claiming another VM
/// id gets nothing attached there.
#[tokio::test]
async fn a_node_id_that_contradicts_its_node_object_is_refused() {
    let k = kube_api().await;
    let e = env_with(|c| c.with_kube(Kube::unwatched(k), "csi.proxmox.sinextra.dev")).await;
    let vol = create(&e, "pvc-claim", Some("pve2")).await;
    // worker-x's providerID names VM 113; worker's system UUID is VM 113's.
    for claimed in ["worker-x/112", "worker/112"] {
        let err = e
            .svc
            .controller_publish_volume(Request::new(publish_req(&vol, claimed)))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::FailedPrecondition,
            "{claimed}: {err:?}"
        );
        assert!(
            err.message().contains("belongs to VM 113"),
            "{}",
            err.message()
        );
    }
    assert!(
        e.vm(112).await["config"]
            .to_string()
            .find("pvc-claim")
            .is_none(),
        "attached to the claimed VM"
    );
    // The id that agrees is served.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&vol, "worker-x/113")))
        .await
        .unwrap();
}

/// Without a VM id anywhere, a node is matched by name, and only when one
/// VM has that name.
#[tokio::test]
async fn two_vms_with_a_nodes_name_are_not_guessed_between() {
    let cluster = common::CLUSTER.replace(
        "  - { vmid: 111, node: pve1, name: worker-1,",
        "  - { vmid: 114, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci } }\n  - { vmid: 111, node: pve1, name: worker-1,",
    );
    let e = common::env_from(&cluster).await;
    let vol = create(&e, "pvc-twins", Some("pve2")).await;
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&vol, "worker-2")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("2 VMs are named worker-2 (112, 114)"),
        "{}",
        err.message()
    );
    e.svc
        .controller_publish_volume(Request::new(publish_req(&vol, "worker-2/114")))
        .await
        .unwrap();
}

/// Kubernetes 1.31–1.33 serve VolumeAttributesClasses as v1beta1 only: the
/// class still applies at attach (found by discovery), and its key no driver
/// reads (`tier`) is left out with a warning, as the Go driver ignores it.
#[tokio::test]
async fn a_class_served_as_v1beta1_applies_at_attach() {
    let k = kube_api_serving("v1beta1").await;
    let e = env_with(|c| c.with_kube(Kube::unwatched(k), "csi.proxmox.sinextra.dev")).await;
    let fast = create(&e, "pvc-fast", Some("pve2")).await;
    let line = publish_and_read(&e, &fast, "worker-y", 112).await;
    assert!(
        line.contains("iops_rd=500") && !line.contains("tier"),
        "{line}"
    );
}
