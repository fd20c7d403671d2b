//! Proxmox as its source code says it behaves (pvesim, each behaviour cited
//! there): the texts of missing volumes, names that lag behind new VMs,
//! VMs that move between nodes, the datacenter's next-id range.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;

use std::time::Duration;

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use serde_json::Value;
use testkit::requests::created;
use tonic::Request;

async fn count(e: &Env, key: &str) -> u64 {
    e.admin("GET", "counters", "").await[key]
        .as_u64()
        .unwrap_or(0)
}

async fn vms_tagged(e: &Env, tag: &str) -> Vec<Value> {
    let all = e.admin("GET", "vms", "").await;
    all.as_array()
        .unwrap()
        .iter()
        .filter(|v| {
            v["config"]["tags"]
                .as_str()
                .is_some_and(|t| t.split(';').any(|x| x == tag))
        })
        .cloned()
        .collect()
}

/// LVM-thin answers a missing LV with `can't get size of …: Failed to find
/// logical volume …`: a new volume is allocated, the same name again is the
/// same volume.
#[tokio::test]
async fn volumes_on_local_lvm_are_created_once() {
    let e = env().await;
    let a = create(&e, "pvc-lvm", Some("pve2")).await;
    let b = create(&e, "pvc-lvm", Some("pve2")).await;
    assert_eq!(a.volume_id, "region-1/pve2/local-lvm/vm-9999-pvc-lvm");
    assert_eq!(a.volume_id, b.volume_id);
    assert_eq!(
        count(&e, "POST /nodes/{node}/storage/{storage}/content").await,
        1
    );
}

/// A wording the error corpus does not know is settled by the storage's
/// listing, not guessed; the listing is asked only then.
#[tokio::test]
async fn an_unknown_answer_for_a_volume_is_settled_by_the_listing() {
    let e = env().await;
    create(&e, "pvc-known", Some("pve2")).await;
    assert_eq!(
        count(&e, "GET /nodes/{node}/storage/{storage}/content").await,
        0,
        "the listing is off the common path"
    );
    e.knobs(r#"{"missing_volume_text": "lvs: unexpected reply from lvmetad"}"#)
        .await;
    let a = create(&e, "pvc-unknown", Some("pve2")).await;
    let b = create(&e, "pvc-unknown", Some("pve2")).await;
    assert_eq!(a.volume_id, b.volume_id);
    assert_eq!(
        count(&e, "POST /nodes/{node}/storage/{storage}/content").await,
        2,
        "pvc-known and pvc-unknown, once each"
    );
    assert_eq!(
        count(&e, "GET /nodes/{node}/storage/{storage}/content").await,
        1,
        "one listing for the one unknown answer"
    );
    // A volume that is gone is gone for the listing too.
    let missing = callers::sanity::validate_volume_capabilities(&pv_id(
        "region-1/pve2/local-lvm/vm-9999-pvc-never",
    ));
    let err = e
        .svc
        .validate_volume_capabilities(Request::new(missing))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
}

/// HA moved the worker VM to another node: attaching and detaching follow
/// it at once, without a controller restart.
#[tokio::test]
async fn a_worker_vm_that_moved_keeps_attaching_and_detaching() {
    let e = env().await;
    let nfs = |name: &str| create_req(name, 1 << 30, &[("storage", "nfs")], None);
    let a = created(&e.svc, nfs("pvc-mv-a")).await;
    let b = created(&e.svc, nfs("pvc-mv-b")).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&a, "worker-2/112")))
        .await
        .unwrap();
    e.admin("POST", "vms/112/relocate?node=pve1", "").await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&b, "worker-2/112")))
        .await
        .unwrap();
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&a, "worker-2/112")))
        .await
        .unwrap();
    let vm = e.vm(112).await;
    assert_eq!(vm["node"], "pve1");
    let config = vm["config"].as_object().unwrap();
    let disks: Vec<&str> = config
        .values()
        .filter_map(Value::as_str)
        .filter(|v| v.starts_with("nfs:"))
        .collect();
    assert_eq!(disks.len(), 1, "{config:?}");
    assert!(
        disks[0].starts_with("nfs:9999/vm-9999-pvc-mv-b.raw,"),
        "{disks:?}"
    );
    assert_eq!(vm["pending"], serde_json::json!({}));
}

/// pvestatd fills a new VM's name in `/cluster/resources` only on its next
/// round; a copy VM is found by its tag meanwhile, so retries of a running
/// snapshot make no second copy.
#[tokio::test]
async fn no_duplicate_copy_vm_while_names_lag() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-src", Some("pve2")).await;
    e.knobs(r#"{"rrd_lag_ms": 10000, "copy_ms_per_gib": 3000}"#)
        .await;
    let first = create_snapshot(&e, "snapshot-lag", &v.volume_id).await;
    for _ in 0..3 {
        let again = create_snapshot(&e, "snapshot-lag", &v.volume_id).await;
        assert_eq!(again.snapshot_id, first.snapshot_id);
    }
    assert_eq!(
        vms_tagged(&e, "csi-snapshot").await.len(),
        1,
        "one copy VM, however often CreateSnapshot is called"
    );
    // And /cluster/resources really had no name for it.
    let rows = e.api("/cluster/resources?type=vm").await;
    let copy = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["tags"]
                .as_str()
                .is_some_and(|t| t.contains("csi-snapshot"))
        })
        .unwrap();
    assert!(copy.get("name").is_none(), "{copy}");
}

/// The datacenter's next-id range may start at the placeholder VMID, which
/// has no VM: a new VM never takes it.
#[tokio::test]
async fn a_new_vm_never_takes_the_placeholder_vmid() {
    let cluster = CLUSTER
        .replace(
            "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
            &format!("CSI: {COPY_ROLE}"),
        )
        + "next-id: { lower: 9999, upper: 20000 }\n";
    let e = env_from(&cluster).await;
    let v = create(&e, "pvc-src", Some("pve2")).await;
    let s = create_snapshot(&e, "snapshot-id", &v.volume_id).await;
    let copies = vms_tagged(&e, "csi-snapshot").await;
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0]["vmid"], 10000, "{copies:?}");
    assert!(
        s.snapshot_id.contains("/snapshot-vm-10000."),
        "{}",
        s.snapshot_id
    );
    assert!(
        e.admin_answer("GET", "vms/9999", "").await.0 == reqwest::StatusCode::NOT_FOUND,
        "no VM under the placeholder VMID"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// `import-from` runs only on the node of the source's owner VM: a restore
/// from a snapshot on shared storage is copied where the snapshot's VM is,
/// even after that VM moved.
#[tokio::test]
async fn a_restore_runs_on_the_node_of_the_snapshots_vm() {
    let e = env_with_role(COPY_ROLE).await;
    let src = created(
        &e.svc,
        create_req("pvc-shared", 1 << 30, &[("storage", "nfs")], None),
    )
    .await;
    let snap = until_ready(&e, "snapshot-shared", &src.volume_id)
        .await
        .pop()
        .unwrap();
    assert!(snap.ready_to_use, "{snap:?}");
    let copy = vms_tagged(&e, "csi-snapshot").await.remove(0);
    let other = if copy["node"] == "pve1" {
        "pve2"
    } else {
        "pve1"
    };
    e.admin(
        "POST",
        &format!("vms/{}/relocate?node={other}", copy["vmid"]),
        "",
    )
    .await;
    let source =
        csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        });
    let v = until_created(
        &e,
        from_source(source, "pvc-restored", 1 << 30, &[("storage", "nfs")], None),
    )
    .await;
    let restored = vms_tagged(&e, "csi-volume").await;
    assert_eq!(restored.len(), 1);
    assert_eq!(
        restored[0]["node"], other,
        "the copy ran beside the snapshot's VM"
    );
    assert!(v.volume_id.starts_with("region-1//nfs/"), "{}", v.volume_id);
}

/// A node down (its calls answer 595) makes only what it could hold
/// unknown: volumes local to other nodes attach as usual; a shared volume
/// is refused as Unavailable naming the VM that could not be read, and
/// works once the node is back.
#[tokio::test]
async fn a_node_down_leaves_the_rest_of_the_attachment_index_usable() {
    let e = env().await;
    let local = create(&e, "pvc-local", Some("pve2")).await;
    let shared = created(
        &e.svc,
        create_req("pvc-shared", 1 << 30, &[("storage", "nfs")], None),
    )
    .await;
    // worker-1 (VM 111) lives on pve1, which goes down before the index is built.
    e.admin("PUT", "nodes/pve1/online?value=0", "").await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&local, "worker-2/112")))
        .await
        .unwrap();
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&shared, "worker-2/112")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("VM 111 on pve1"),
        "{}",
        err.message()
    );
    e.admin("PUT", "nodes/pve1/online?value=1", "").await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&shared, "worker-2/112")))
        .await
        .unwrap();

    // Down after its VMs were read: through the attacher's reconcile (every
    // VM read again) they keep the disks they were last read to hold, so
    // shared volumes still publish and delete, through a node that is up
    // (the storage's RRD row still says `available` on the one down).
    let more = created(
        &e.svc,
        create_req("pvc-shared-2", 1 << 30, &[("storage", "nfs")], None),
    )
    .await;
    let gone = created(
        &e.svc,
        create_req("pvc-shared-3", 1 << 30, &[("storage", "nfs")], None),
    )
    .await;
    e.admin("PUT", "nodes/pve1/online?value=0", "").await;
    // The attacher's reconcile lists every volume: the node that is down is
    // not asked, and the others' volumes are all there, the shared ones
    // once each.
    let listed = e
        .svc
        .list_volumes(Request::new(callers::attacher::list_volumes("")))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = listed
        .entries
        .iter()
        .map(|en| en.volume.as_ref().unwrap().volume_id.as_str())
        .collect();
    for v in [&local, &shared, &more, &gone] {
        assert_eq!(
            ids.iter().filter(|id| **id == v.volume_id).count(),
            1,
            "{} in {ids:?}",
            v.volume_id
        );
    }

    e.svc
        .controller_publish_volume(Request::new(publish_req(&more, "worker-2/112")))
        .await
        .unwrap();
    e.svc
        .delete_volume(Request::new(delete_req(&gone)))
        .await
        .unwrap();
    e.admin("PUT", "nodes/pve1/online?value=1", "").await;
}

/// qemu-server writes a config update key by key and stops at the first
/// key it cannot take: the publishes written together with a volume Proxmox
/// refuses still land, each on its own write, and only that one fails.
#[tokio::test]
async fn a_refused_volume_does_not_fail_the_others_of_its_write() {
    let e = env().await;
    let mut vols = Vec::new();
    for i in 0..4 {
        vols.push(create(&e, &format!("pvc-b{i}"), Some("pve2")).await);
    }
    e.knobs(r#"{"hotplug_latency_ms": 200, "refuse_volumes": ["local-lvm:vm-9999-pvc-b2"]}"#)
        .await;
    let calls = vols.iter().map(|v| {
        let svc = e.svc.clone();
        let req = publish_req(v, "worker-2/112");
        async move { svc.controller_publish_volume(Request::new(req)).await }
    });
    let results = futures::future::join_all(calls).await;
    for (i, r) in results.iter().enumerate() {
        match (i, r) {
            (2, Err(s)) => assert!(
                s.message()
                    .contains("no such logical volume pve/vm-9999-pvc-b2"),
                "{s:?}"
            ),
            (2, Ok(_)) => panic!("the refused volume was published"),
            (_, r) => assert!(r.is_ok(), "pvc-b{i}: {r:?}"),
        }
    }
    let vm = e.vm(112).await;
    let attached: Vec<&str> = vm["config"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(Value::as_str)
        .filter(|v| v.contains("pvc-b"))
        .collect();
    assert_eq!(attached.len(), 3, "{attached:?}");
    assert_eq!(vm["pending"], serde_json::json!({}));
}

/// A copy of an attached volume is read from a live disk: a
/// VolumeSnapshotClass with `attached: refuse` refuses it, naming the VM;
/// detached, the same snapshot is taken.
#[tokio::test]
async fn a_class_may_refuse_snapshots_of_attached_volumes() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-live", Some("pve2")).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    let pv = pv_of(&v);
    let req = || {
        Request::new(callers::snapshotter::create_snapshot(
            "5e1d2c3b-4a59-4687-9a0b-1c2d3e4f5a6b",
            "live",
            &pv,
            &[("attached", "refuse")],
        ))
    };
    let err = e.svc.create_snapshot(req()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("attached to VM 112") && err.message().contains("attached: refuse"),
        "{}",
        err.message()
    );
    assert!(vms_tagged(&e, "csi-snapshot").await.is_empty());
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    e.svc.create_snapshot(req()).await.unwrap();
    assert_eq!(vms_tagged(&e, "csi-snapshot").await.len(), 1);
}

/// Quorum lost: pmxcfs is read-only, so creating on shared storage and
/// attaching are refused by Proxmox; the controller answers Unavailable (the
/// sidecar retries) and everything works once quorum is back.
#[tokio::test]
async fn quorum_loss_is_unavailable_and_passes() {
    let e = env().await;
    let local = create(&e, "pvc-q", Some("pve2")).await;
    e.knobs(r#"{"no_quorum": true}"#).await;
    let mut req = Request::new(create_req(
        "pvc-q-shared",
        1 << 30,
        &[("storage", "nfs")],
        None,
    ));
    req.metadata_mut()
        .insert("grpc-timeout", "2S".parse().unwrap());
    let err = e.svc.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("no quorum"), "{}", err.message());
    let mut req = Request::new(publish_req(&local, "worker-2/112"));
    req.metadata_mut()
        .insert("grpc-timeout", "2S".parse().unwrap());
    let err = e.svc.controller_publish_volume(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    e.knobs(r#"{"no_quorum": false}"#).await;
    e.svc
        .create_volume(Request::new(create_req(
            "pvc-q-shared",
            1 << 30,
            &[("storage", "nfs")],
            None,
        )))
        .await
        .unwrap();
    e.svc
        .controller_publish_volume(Request::new(publish_req(&local, "worker-2/112")))
        .await
        .unwrap();
    assert_eq!(e.vm(112).await["pending"], serde_json::json!({}));
}

/// A password session lives longer than its login ticket (2 hours on
/// Proxmox, a second here): the client logs in again before the ticket
/// expires, so no call in between meets an expired one.
#[tokio::test]
async fn a_password_session_renews_its_ticket_before_it_expires() {
    use proxmox_csi_controller::config::CloudConfig;
    use proxmox_csi_controller::pve::{self, Deadline};
    let cluster = CLUSTER.replace(
        "  - userid: kubernetes-csi@pve\n",
        "  - userid: kubernetes-csi@pve\n    password: s3cret-pw\n",
    );
    let e = env_from(&cluster).await;
    e.knobs(r#"{"ticket_lifetime_ms": 1000}"#).await;
    let cfg = CloudConfig::parse(&format!(
        "clusters:\n  - url: {}\n    username: kubernetes-csi@pve\n    password: s3cret-pw\n    region: region-1\n",
        e.sim.api_url()
    ))
    .unwrap();
    let client = pve::Client::new(
        cfg.clusters.into_iter().next().unwrap(),
        Duration::from_secs(10),
        Default::default(),
    )
    .unwrap()
    .with_session_renewal(Duration::from_millis(500));
    for i in 0..8 {
        let d = Deadline(std::time::Instant::now());
        client
            .vms(d)
            .await
            .unwrap_or_else(|err| panic!("call {i}, {} ms into the session: {err}", i * 250));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
