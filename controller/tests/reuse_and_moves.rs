//! Sequences an adversarial review found breaking the controller's
//! promises (nothing destroyed that is not the request's own, no stray VM,
//! a refused privilege named once), each kept as a test.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::{Code, Request};

async fn named(e: &Env, name: &str) -> Vec<serde_json::Value> {
    e.admin("GET", "vms", "")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["config"]["name"] == name)
        .cloned()
        .collect()
}

/// A worker live-migrates while a controller's VM list still names its old
/// node: the old node answers "Configuration file … does not exist", which
/// means "not here", not "gone". DeleteVolume must still see the volume
/// attached and keep it.
#[tokio::test]
async fn a_volume_on_a_worker_that_migrated_is_not_deleted() {
    let e = env_with_role(
        "[VM.Audit, VM.Config.Disk, VM.Migrate, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
    )
    .await;
    let v = create_in(&e, "pvc-nfs", &[("storage", "nfs")], None).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-3")))
        .await
        .unwrap();
    // Another controller (a restart) lists the VMs, worker-3 on pve2, while
    // it looks up the owner of a volume that is not there.
    let other = proxmox_csi_controller::csi::controller::ControllerService(std::sync::Arc::new(
        controller_on(&e),
    ));
    other
        .delete_volume(Request::new(delete_req(&csi::Volume {
            volume_id: "region-1//nfs/vm-5555-pvc-x".into(),
            ..Default::default()
        })))
        .await
        .unwrap();
    e.api_write(
        "POST",
        "/nodes/pve2/qemu/113/migrate",
        &[("target", "pve1"), ("online", "1")],
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while e.vm(113).await["node"] != "pve1" {
        assert!(std::time::Instant::now() < deadline, "the VM never moved");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let err = other
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("attached to VM 113"),
        "{}",
        err.message()
    );
    assert!(
        e.admin("GET", "volumes", "")
            .await
            .to_string()
            .contains("pvc-nfs"),
        "the attached volume was deleted"
    );
}

/// A snapshot deleted (its answer lost), the controller restarted, a new
/// snapshot made under the VMID handed out again: the snapshotter's retried
/// DeleteSnapshot of the first leaves the second alone.
#[tokio::test]
async fn a_retried_snapshot_delete_never_destroys_a_newer_snapshot_under_its_vmid() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let s1 = until_ready(&e, "snapshot-1", &v.volume_id)
        .await
        .pop()
        .unwrap();
    let delete = |id: &str| {
        Request::new(csi::DeleteSnapshotRequest {
            snapshot_id: id.to_string(),
            ..Default::default()
        })
    };
    e.svc
        .delete_snapshot(delete(&s1.snapshot_id))
        .await
        .unwrap();
    let restarted = proxmox_csi_controller::csi::controller::ControllerService(
        std::sync::Arc::new(controller_on(&e)),
    );
    let e = Env {
        sim: e.sim,
        svc: restarted,
        http: e.http,
    };
    let s2 = until_ready(&e, "snapshot-2", &v.volume_id)
        .await
        .pop()
        .unwrap();
    assert_eq!(
        copy_vmid(&s1.snapshot_id),
        copy_vmid(&s2.snapshot_id),
        "the VMID was not handed out again"
    );
    assert_ne!(s1.snapshot_id, s2.snapshot_id, "two snapshots share an id");
    e.svc
        .delete_snapshot(delete(&s1.snapshot_id))
        .await
        .unwrap();
    assert_eq!(
        named(&e, "snapshot-2").await.len(),
        1,
        "snapshot-2 was destroyed"
    );
    // Restoring from the first is refused as a snapshot that does not exist.
    let err = e
        .svc
        .create_volume(Request::new(from_source(
            csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: s1.snapshot_id.clone(),
                },
            ),
            "pvc-from-gone",
            1 << 30,
            &[("storage", "local-lvm")],
            Some("pve2"),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
}

/// Under a tag policy the copy VM is made untagged, then tagged: the answer
/// of either write lost, the retries end with one tagged, protected VM.
#[tokio::test]
async fn a_lost_answer_while_tagging_a_new_vm_leaves_one_vm() {
    for skip in [1u32, 2] {
        let cluster = CLUSTER.replace(
            "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
            &format!("CSI: {COPY_ROLE}"),
        ) + "user-tag-access: { user-allow: list, user-allow-list: [proxmox-csi, csi-snapshot] }\n";
        let e = env_from(&cluster).await;
        let v = create(&e, "pvc-a", Some("pve2")).await;
        e.knobs(&format!(
            r#"{{"lose_answers": 1, "lose_answers_skip": {skip}, "lost_answer_status": 596}}"#
        ))
        .await;
        let mut ready = false;
        for _ in 0..40 {
            if let Ok(s) = e
                .svc
                .create_snapshot(Request::new(snap_req("snapshot-1", &v.volume_id)))
                .await
                && s.get_ref()
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.ready_to_use)
            {
                ready = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert!(ready, "skip {skip}: the snapshot never became ready");
        assert_eq!(
            e.faults().lost_answers,
            1,
            "skip {skip}: no answer was lost"
        );
        let vms = named(&e, "snapshot-1").await;
        assert_eq!(vms.len(), 1, "skip {skip}: {vms:?}");
        assert_eq!(
            vms[0]["config"]["tags"], "proxmox-csi;csi-snapshot",
            "skip {skip}"
        );
        assert_eq!(vms[0]["config"]["protection"], "1", "skip {skip}");
    }
}

/// Two detached volumes of one node expanded at once: one holder VM.
#[tokio::test]
async fn concurrent_offline_expansions_share_one_holder() {
    let e = env_with_role(COPY_ROLE).await;
    let a = create(&e, "pvc-a", Some("pve2")).await;
    let b = create(&e, "pvc-b", Some("pve2")).await;
    let (ra, rb) = tokio::join!(
        e.svc
            .controller_expand_volume(Request::new(expand_req(&a, 2 << 30))),
        e.svc
            .controller_expand_volume(Request::new(expand_req(&b, 2 << 30))),
    );
    ra.unwrap();
    rb.unwrap();
    assert_eq!(named(&e, "proxmox-csi-holder-pve2").await.len(), 1);
}

/// VM.Config.Disk is checked per drive in update_vm's worker: a publish
/// and a snapshot's import refused there are FailedPrecondition naming it,
/// not retried as if Proxmox were busy.
#[tokio::test]
async fn privileges_refused_in_a_publish_or_an_import_are_failed_precondition() {
    let e = env_with_role(
        "[VM.Audit, VM.Config.Options, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
    )
    .await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("lacks VM.Config.Disk on /vms/112"),
        "{}",
        err.message()
    );

    let e = env_with_role(&COPY_ROLE.replace("VM.Config.Disk, ", "")).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let mut last = None;
    for _ in 0..4 {
        match e
            .svc
            .create_snapshot(Request::new(snap_req("snapshot-1", &v.volume_id)))
            .await
        {
            Err(s) if s.code() == Code::FailedPrecondition => {
                last = Some(s);
                break;
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
        }
    }
    let err = last.expect("the refused import never answered FailedPrecondition");
    assert!(
        err.message().contains("VM.Config.Disk"),
        "{}",
        err.message()
    );
    // The sidecar's retries meanwhile get the same answer, not a new import.
    for _ in 0..3 {
        let again = e
            .svc
            .create_snapshot(Request::new(snap_req("snapshot-1", &v.volume_id)))
            .await
            .unwrap_err();
        assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    }
}

/// A clone deleted (its answer lost), the controller restarted, a snapshot
/// made under the VMID its copy VM had, so with the same disk name: the
/// retried DeleteVolume of the clone frees nothing of the snapshot's.
#[tokio::test]
async fn a_retried_clone_delete_never_frees_a_snapshot_under_its_vmid() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-src", Some("pve2")).await;
    let clone = until_created(
        &e,
        from_source(
            csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
                volume_id: v.volume_id.clone(),
            }),
            "pvc-clone",
            1 << 30,
            &[("storage", "local-lvm")],
            Some("pve2"),
        ),
    )
    .await;
    e.svc
        .delete_volume(Request::new(delete_req(&clone)))
        .await
        .unwrap();
    let restarted = proxmox_csi_controller::csi::controller::ControllerService(
        std::sync::Arc::new(controller_on(&e)),
    );
    let e = Env {
        sim: e.sim,
        svc: restarted,
        http: e.http,
    };
    let s = until_ready(&e, "snapshot-1", &v.volume_id)
        .await
        .pop()
        .unwrap();
    let disk = clone.volume_id.rsplit('/').next().unwrap().to_string();
    let vmid = disk.split('-').nth(1).unwrap();
    assert!(
        s.snapshot_id.contains(&format!("snapshot-vm-{vmid}.")),
        "the VMID was not handed out again: {}",
        s.snapshot_id
    );
    assert!(
        e.admin("GET", "volumes", "")
            .await
            .to_string()
            .contains(&disk)
    );
    e.svc
        .delete_volume(Request::new(delete_req(&clone)))
        .await
        .unwrap();
    assert!(
        e.admin("GET", "volumes", "")
            .await
            .to_string()
            .contains(&disk),
        "the snapshot's disk was freed"
    );
    assert_eq!(named(&e, "snapshot-1").await.len(), 1);
}

/// Snapshot ids of earlier versions (no mark) name only unmarked copy VMs;
/// an id whose VMID now holds a VM that is not this driver's snapshot is a
/// snapshot that is gone, not a refusal that blocks its content forever.
#[tokio::test]
async fn old_and_stale_snapshot_ids_leave_other_vms_alone() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let s = until_ready(&e, "snapshot-1", &v.volume_id)
        .await
        .pop()
        .unwrap();
    let unmarked = s.snapshot_id.rsplit_once('.').unwrap().0.to_string();
    let delete = |id: &str| {
        Request::new(csi::DeleteSnapshotRequest {
            snapshot_id: id.to_string(),
            ..Default::default()
        })
    };
    e.svc.delete_snapshot(delete(&unmarked)).await.unwrap();
    assert_eq!(
        named(&e, "snapshot-1").await.len(),
        1,
        "a marked copy VM was destroyed by an old id"
    );
    // VMID 112 is a worker: a snapshot id naming it is gone.
    let worker = "region-1/pve2/local-lvm/snapshot-vm-112";
    e.svc.delete_snapshot(delete(worker)).await.unwrap();
    assert!(
        e.vm(112).await["config"]["scsi0"].is_string(),
        "the worker was touched"
    );
}

/// A holder moved to another node (a bulk migration, HA): expansions on its
/// old node make one new holder there, not one each.
#[tokio::test]
async fn a_holder_that_moved_away_is_replaced_once() {
    let e = env_with_role(COPY_ROLE).await;
    let a = create(&e, "pvc-a", Some("pve2")).await;
    e.svc
        .controller_expand_volume(Request::new(expand_req(&a, 2 << 30)))
        .await
        .unwrap();
    let first = named(&e, "proxmox-csi-holder-pve2").await;
    assert_eq!(first.len(), 1);
    let vmid = first[0]["vmid"].as_u64().unwrap();
    e.admin("POST", &format!("vms/{vmid}/relocate?node=pve1"), "")
        .await;
    for (n, name) in ["pvc-b", "pvc-c", "pvc-d"].iter().enumerate() {
        let v = create(&e, name, Some("pve2")).await;
        e.svc
            .controller_expand_volume(Request::new(expand_req(&v, 2 << 30)))
            .await
            .unwrap_or_else(|s| panic!("expansion {n}: {s:?}"));
    }
    assert_eq!(named(&e, "proxmox-csi-holder-pve2").await.len(), 2);
}

/// A Kubernetes API stand-in serving the PersistentVolumes `pvs` holds (a
/// list, no watch: the controller on it reads every lookup from it).
async fn kube_serving(pvs: std::sync::Arc<std::sync::Mutex<serde_json::Value>>) -> kube::Client {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/api/v1/persistentvolumes",
        get(move || {
            let pvs = pvs.clone();
            async move {
                let items = pvs.lock().unwrap().clone();
                axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeList", "metadata": {}, "items": items}))
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap()
}

fn pv(name: &str, handle: &str, phase: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"csi": {"driver": "csi.proxmox.sinextra.dev", "volumeHandle": handle}},
        "status": {"phase": phase},
    })
}

/// With the Kubernetes API, a clone's copy VM goes with the volume only for
/// the PV being deleted: one named as CreateVolume names it, or as
/// `pvecsictl migrate` names its carrier (`<pv>-moved`); a VM named for a
/// claim still bound under the same handle is that claim's.
#[tokio::test]
async fn a_clones_copy_vm_goes_only_with_the_pv_it_was_made_for() {
    let pvs = std::sync::Arc::new(std::sync::Mutex::new(serde_json::json!([])));
    let k = kube_serving(pvs.clone()).await;
    let cluster = CLUSTER.replace(
        "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
        &format!("CSI: {COPY_ROLE}"),
    );
    let e = env_from_with(&cluster, |c| {
        c.with_kube(
            proxmox_csi_controller::kube::Kube::unwatched(k),
            "csi.proxmox.sinextra.dev",
        )
    })
    .await;
    let v = create(&e, "pvc-src", Some("pve2")).await;
    let clone_of = |name: &'static str| {
        from_source(
            csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
                volume_id: v.volume_id.clone(),
            }),
            name,
            1 << 30,
            &[("storage", "local-lvm")],
            Some("pve2"),
        )
    };
    // pvecsictl migrate's carrier of PV pvc-x, the PV being deleted.
    let moved = until_created(&e, clone_of("pvc-x-moved")).await;
    *pvs.lock().unwrap() = serde_json::json!([pv("pvc-x", &moved.volume_id, "Released")]);
    e.svc
        .delete_volume(Request::new(delete_req(&moved)))
        .await
        .unwrap();
    assert!(
        named(&e, "pvc-x-moved").await.is_empty(),
        "the carrier was not destroyed"
    );
    // A VM named for a bound claim of the same handle (its VMID handed out
    // again): that claim's, left alone.
    let live = until_created(&e, clone_of("pvc-y")).await;
    *pvs.lock().unwrap() = serde_json::json!([
        pv("pvc-old", &live.volume_id, "Released"),
        pv("pvc-y", &live.volume_id, "Bound")
    ]);
    e.svc
        .delete_volume(Request::new(delete_req(&live)))
        .await
        .unwrap();
    assert_eq!(
        named(&e, "pvc-y").await.len(),
        1,
        "a bound claim's VM was destroyed"
    );
}
