//! Snapshots, clones and restores against pvesim: copy VMs made with an API
//! token, `ready_to_use=false` while the copy runs, idempotent retries,
//! failures reported and recovered, nothing left behind on delete.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;

use std::collections::HashMap;
use std::time::Duration;

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::volume_content_source::{
    SnapshotSource, Type as Source, VolumeSource,
};
use serde_json::Value;
use testkit::requests::created;
use tonic::{Code, Request};

fn from(source: Source, name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    from_source(
        source,
        name,
        bytes,
        &[("storage", "local-lvm")],
        Some("pve2"),
    )
}

fn with_timeout<T>(msg: T, ms: u64) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("grpc-timeout", format!("{ms}m").parse().unwrap());
    r
}

async fn counters(e: &Env) -> HashMap<String, u64> {
    let c = e.admin("GET", "counters", "").await;
    c.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect()
}

/// A 1 GiB volume attached to worker-2 and its snapshot "snapshot-1", taken
/// by a token with the copy role while the copy takes 2 s (so that the
/// first answer is seen unready): every answer seen, the last one, and the
/// copy VM's VMID.
struct Snapped {
    e: Env,
    v: csi::Volume,
    seen: Vec<csi::Snapshot>,
    snap: csi::Snapshot,
    vmid: u32,
}

async fn snapped() -> Snapped {
    let e = env_with_role(COPY_ROLE).await;
    e.knobs(r#"{"copy_ms_per_gib": 2000}"#).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap();
    let seen = until_ready(&e, "snapshot-1", &v.volume_id).await;
    let snap = seen.last().unwrap().clone();
    let vmid = copy_vmid(&snap.snapshot_id);
    Snapped {
        e,
        v,
        seen,
        snap,
        vmid,
    }
}

/// The worker VM 112 has nothing pending and no unusedN entry.
async fn worker_is_clean(e: &Env) {
    let w = e.vm(112).await;
    assert_eq!(w["pending"], serde_json::json!({}), "{w}");
    assert!(
        !w["config"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("unused")),
        "{w}"
    );
}

#[tokio::test]
async fn a_snapshot_is_a_stopped_tagged_copy_vm_named_by_its_vmid_and_mark() {
    let Snapped {
        e,
        v,
        seen,
        snap,
        vmid,
        ..
    } = snapped().await;
    assert!(
        !seen[0].ready_to_use,
        "the first answer comes before the copy is done"
    );
    assert!(
        seen.iter().all(|s| s.snapshot_id == snap.snapshot_id),
        "one ID for every answer: {seen:?}"
    );
    // The VMID, and the mark written into the copy VM's description at its
    // creation: a VMID handed out again never makes this id name another
    // snapshot.
    let mark = e.vm(vmid).await["config"]["description"]
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("csi-mark="))
        .unwrap()
        .to_string();
    assert_eq!(
        snap.snapshot_id,
        format!("region-1/pve2/local-lvm/snapshot-vm-{vmid}.{mark}")
    );
    assert_eq!(snap.source_volume_id, v.volume_id);
    assert_eq!(snap.size_bytes, 1 << 30);
    assert!(
        snap.creation_time
            .as_ref()
            .is_some_and(|t| t.seconds > 1_700_000_000),
        "{:?}",
        snap.creation_time
    );

    // The copy VM: stopped, tagged, the copy as unused0, nothing pending.
    let vm = e.vm(vmid).await;
    assert_eq!(vm["running"], false);
    assert_eq!(vm["config"]["name"], "snapshot-1");
    assert_eq!(vm["config"]["tags"], "proxmox-csi;csi-snapshot");
    assert_eq!(
        vm["config"]["unused0"],
        format!("local-lvm:vm-{vmid}-disk-0")
    );
    assert!(vm["config"].get("scsi0").is_none(), "{vm}");
    assert_eq!(vm["pending"], serde_json::json!({}), "{vm}");
    assert!(
        volumes(&e)
            .await
            .contains(&format!("local-lvm:vm-{vmid}-disk-0"))
    );
}

#[tokio::test]
async fn create_snapshot_repeats_its_answer_and_refuses_another_source_or_a_bad_parameter() {
    let Snapped { e, v, snap, .. } = snapped().await;
    // Same name, same source: the same snapshot; another source: AlreadyExists.
    assert_eq!(create_snapshot(&e, "snapshot-1", &v.volume_id).await, snap);
    let other = create(&e, "pvc-b", Some("pve2")).await;
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req("snapshot-1", &other.volume_id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(
        err.message()
            .contains("already exists as a copy of region-1/pve2/local-lvm/vm-9999-pvc-a"),
        "{}",
        err.message()
    );
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req(
            "snapshot-s",
            "region-1/pve2/local-lvm/vm-9999-nope",
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let mut bad = snap_req("snapshot-s", &v.volume_id);
    bad.parameters = HashMap::from([("attached".to_string(), "never".to_string())]);
    let err = e.svc.create_snapshot(Request::new(bad)).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "parameters.attached: \"never\" is not allowed; allowed: allow, refuse"
        )
    );
}

#[tokio::test]
async fn a_restore_is_grown_repeatable_attachable_listed_and_deleted_with_its_copy_vm() {
    let Snapped {
        e, v, snap, vmid, ..
    } = snapped().await;
    // Restore into a larger volume: grown after the copy.
    let restore = from(
        Source::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        }),
        "pvc-r",
        2 << 30,
    );
    let r = created(&e.svc, restore.clone()).await;
    let rvm = vms_named(&e, "pvc-r").await;
    assert_eq!(rvm.len(), 1);
    let rid = rvm[0]["vmid"].as_u64().unwrap();
    assert_eq!(
        r.volume_id,
        format!("region-1/pve2/local-lvm/vm-{rid}-disk-0")
    );
    assert_eq!(r.capacity_bytes, 2 << 30);
    assert_eq!(r.content_source, restore.volume_content_source);
    assert_eq!(rvm[0]["config"]["tags"], "proxmox-csi;csi-volume");
    assert_eq!(
        rvm[0]["config"]["unused0"],
        format!("local-lvm:vm-{rid}-disk-0")
    );
    // Idempotent: the same answer, no second copy.
    let again = created(&e.svc, restore).await;
    assert_eq!(again, r);
    assert_eq!(vms_named(&e, "pvc-r").await.len(), 1);

    // The restored volume attaches like any other, and lists as ours.
    let ctx = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&r, "worker-2")))
        .await
        .unwrap()
        .into_inner();
    assert!(ctx.publish_context.contains_key("wwn"), "{ctx:?}");
    let w = e.vm(112).await;
    assert!(
        w["config"].as_object().unwrap().values().any(|l| l
            .as_str()
            .is_some_and(|l| l.starts_with(&format!("local-lvm:vm-{rid}-disk-0,")))),
        "{w}"
    );
    let listed = e
        .svc
        .list_volumes(Request::new(callers::attacher::list_volumes("")))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<String> = listed
        .entries
        .iter()
        .map(|x| x.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    assert!(
        ids.contains(&r.volume_id) && ids.contains(&v.volume_id),
        "{ids:?}"
    );
    assert!(
        !ids.iter()
            .any(|i| i.contains("snapshot-vm") || i.ends_with(&format!("vm-{vmid}-disk-0"))),
        "snapshots are not volumes: {ids:?}"
    );

    // Deleting the attached restore is refused; detached, its copy VM goes with it.
    let err = e
        .svc
        .delete_volume(Request::new(callers::provisioner::delete_volume(&pv_of(
            &r,
        ))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&r, "worker-2")))
        .await
        .unwrap();
    for _ in 0..2 {
        e.svc
            .delete_volume(Request::new(callers::provisioner::delete_volume(&pv_of(
                &r,
            ))))
            .await
            .unwrap();
    }
    assert!(vms_named(&e, "pvc-r").await.is_empty());
    assert!(
        !volumes(&e)
            .await
            .contains(&format!("local-lvm:vm-{rid}-disk-0"))
    );

    worker_is_clean(&e).await;
}

#[tokio::test]
async fn a_clone_of_an_attached_volume_has_its_sources_size() {
    let Snapped { e, v, .. } = snapped().await;
    // A clone of the (attached) volume, at the source's size.
    let mut clone = from(
        Source::Volume(VolumeSource {
            volume_id: v.volume_id.clone(),
        }),
        "pvc-c",
        0,
    );
    clone.capacity_range = None;
    let c = created(&e.svc, clone).await;
    assert_eq!(c.capacity_bytes, 1 << 30);
    assert!(
        c.volume_id.starts_with("region-1/pve2/local-lvm/vm-"),
        "{}",
        c.volume_id
    );
}

#[tokio::test]
async fn a_deleted_snapshot_takes_its_copy_vm_and_disk_and_is_not_found_after() {
    let Snapped { e, snap, vmid, .. } = snapped().await;
    // Delete the snapshot: the VM and its disk are gone; a repeat is fine.
    for _ in 0..2 {
        e.svc
            .delete_snapshot(Request::new(callers::snapshotter::delete_snapshot(
                &snap.snapshot_id,
            )))
            .await
            .unwrap();
    }
    assert_eq!(
        e.admin_answer("GET", &format!("vms/{vmid}"), "").await.0,
        reqwest::StatusCode::NOT_FOUND
    );
    assert!(
        !volumes(&e)
            .await
            .contains(&format!("local-lvm:vm-{vmid}-disk-0"))
    );
    let err = e
        .svc
        .create_volume(Request::new(from(
            Source::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            }),
            "pvc-z",
            1 << 30,
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    worker_is_clean(&e).await;
}

#[tokio::test]
async fn list_and_get_snapshots_page_and_filter() {
    let e = env_with_role(COPY_ROLE).await;
    let a = create(&e, "pvc-a", Some("pve2")).await;
    let b = create(&e, "pvc-b", Some("pve1")).await;
    let sa = until_ready(&e, "snapshot-a", &a.volume_id)
        .await
        .pop()
        .unwrap();
    let sb = until_ready(&e, "snapshot-b", &b.volume_id)
        .await
        .pop()
        .unwrap();
    assert_eq!(
        sb.snapshot_id.split('/').nth(1),
        Some("pve1"),
        "the copy stays on the source's node"
    );

    let list = callers::sanity::list_snapshots;
    let all = e
        .svc
        .list_snapshots(Request::new(list(0, "", "", "")))
        .await
        .unwrap()
        .into_inner();
    let mut want = vec![sa.clone(), sb.clone()];
    want.sort_by(|x, y| x.snapshot_id.cmp(&y.snapshot_id));
    assert_eq!(
        all.entries
            .iter()
            .map(|x| x.snapshot.clone().unwrap())
            .collect::<Vec<_>>(),
        want
    );
    let p1 = e
        .svc
        .list_snapshots(Request::new(list(1, "", "", "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p1.entries.len(), 1);
    let p2 = e
        .svc
        .list_snapshots(Request::new(list(1, &p1.next_token, "", "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p2.entries[0].snapshot, Some(want[1].clone()));
    assert_eq!(p2.next_token, "");
    let by_source = e
        .svc
        .list_snapshots(Request::new(list(0, "", &b.volume_id, "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_source.entries.len(), 1);
    assert_eq!(by_source.entries[0].snapshot, Some(sb.clone()));
    let by_id = e
        .svc
        .list_snapshots(Request::new(list(0, "", "", &sa.snapshot_id)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_id.entries[0].snapshot, Some(sa.clone()));
    let none = e
        .svc
        .list_snapshots(Request::new(list(
            0,
            "",
            "",
            "region-1/pve2/local-lvm/snapshot-vm-777",
        )))
        .await
        .unwrap()
        .into_inner();
    assert!(none.entries.is_empty());
    let err = e
        .svc
        .list_snapshots(Request::new(list(0, "99", "", "")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);

    let got = e
        .svc
        .get_snapshot(Request::new(callers::sanity::get_snapshot(&sa.snapshot_id)))
        .await
        .unwrap();
    assert_eq!(got.into_inner().snapshot, Some(sa));
    let err = e
        .svc
        .get_snapshot(Request::new(callers::sanity::get_snapshot(
            "region-1/pve2/local-lvm/snapshot-vm-777",
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let caps = e
        .svc
        .controller_get_capabilities(Request::new(
            callers::identity::controller_get_capabilities(),
        ))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<String> = caps
        .capabilities
        .iter()
        .filter_map(|c| {
            c.r#type
                .as_ref()
                .map(|csi::controller_service_capability::Type::Rpc(r)| {
                    r.r#type().as_str_name().to_string()
                })
        })
        .collect();
    for want in [
        "CREATE_DELETE_SNAPSHOT",
        "LIST_SNAPSHOTS",
        "CLONE_VOLUME",
        "GET_SNAPSHOT",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn a_slow_copy_answers_aborted_with_progress_and_the_retry_finishes_it() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    e.knobs(r#"{"copy_ms_per_gib": 4000}"#).await;
    let req = from(
        Source::Volume(VolumeSource {
            volume_id: v.volume_id.clone(),
        }),
        "pvc-slow",
        1 << 30,
    );
    let first = e
        .svc
        .create_volume(with_timeout(req.clone(), 1500))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::Aborted, "{first:?}");
    assert!(
        first
            .message()
            .contains("copying local-lvm:vm-9999-pvc-a into VM"),
        "{}",
        first.message()
    );
    let second = e
        .svc
        .create_volume(with_timeout(req.clone(), 1500))
        .await
        .unwrap_err();
    assert_eq!(second.code(), Code::Aborted, "{second:?}");
    assert!(
        second.message().contains("transferred"),
        "progress from the task log: {}",
        second.message()
    );
    let done = created(&e.svc, req).await;
    assert_eq!(
        vms_named(&e, "pvc-slow").await.len(),
        1,
        "one copy VM however often it was asked"
    );
    let copies = volumes(&e)
        .await
        .into_iter()
        .filter(|x| done.volume_id.ends_with(x.split(':').nth(1).unwrap()))
        .count();
    assert_eq!(copies, 1);
}

#[tokio::test]
async fn a_failed_copy_is_reported_and_started_again() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    e.knobs(r#"{"task_latency_ms": 300}"#).await;
    let s = create_snapshot(&e, "snapshot-f", &v.volume_id).await;
    assert!(!s.ready_to_use);
    // The import task is waiting to start: make it fail after its UPID.
    e.knobs(r#"{"fail_tasks": 1}"#).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req("snapshot-f", &v.volume_id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message()
            .contains("task failed (injected by pvesim); the next call starts it again"),
        "{}",
        err.message()
    );
    assert_eq!(e.faults().failed_tasks, 1);
    let ready = until_ready(&e, "snapshot-f", &v.volume_id)
        .await
        .pop()
        .unwrap();
    assert_eq!(ready.snapshot_id, s.snapshot_id);
    assert_eq!(vms_named(&e, "snapshot-f").await.len(), 1);
}

/// qemu-server locks the source's owner VM (the snapshot's copy VM) for
/// the whole import; while another task holds that lock the import fails
/// after its UPID with "can't lock file … got timeout". The controller
/// retries within the RPC's deadline; past it, the answer names the lock,
/// and the provisioner's retry, once the lock is free, finishes with one
/// copy VM and nothing left of the failed attempts.
#[tokio::test]
async fn a_restore_waits_out_a_locked_snapshot_vm() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let snap = until_ready(&e, "snapshot-l", &v.volume_id)
        .await
        .pop()
        .unwrap();
    let holder = copy_vmid(&snap.snapshot_id);
    // The owner lock is given 3 × 200 ms; another task holds it for 4 s.
    e.knobs(r#"{"lock_timeout_ms": 200}"#).await;
    e.admin("POST", &format!("vms/{holder}/hold-lock?seconds=4"), "")
        .await;
    let restore = from(
        Source::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        }),
        "pvc-r",
        1 << 30,
    );
    // The provisioner calls again, unchanged, until it succeeds.
    let started = std::time::Instant::now();
    let mut answers = Vec::new();
    let restored = loop {
        match e
            .svc
            .create_volume(with_timeout(restore.clone(), 1000))
            .await
        {
            Ok(r) => break r.into_inner().volume.unwrap(),
            Err(s)
                if matches!(
                    s.code(),
                    Code::Aborted | Code::Unavailable | Code::DeadlineExceeded
                ) && started.elapsed() < Duration::from_secs(30) =>
            {
                answers.push(s.message().to_string());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!("the retried restore: {s:?}"),
        }
    };
    let lock = format!("can't lock file '/var/lock/qemu-server/lock-{holder}.conf' - got timeout");
    assert!(
        answers.iter().any(|a| a.contains(&lock)),
        "no answer named the held lock: {answers:#?}"
    );
    assert_eq!(
        vms_named(&e, "pvc-r").await.len(),
        1,
        "one copy VM for the restore"
    );
    let copies: Vec<String> = volumes(&e)
        .await
        .into_iter()
        .filter(|v| {
            v.contains("disk-") && !v.contains(&format!("vm-{holder}-")) && !v.contains("vm-112-")
        })
        .collect();
    assert_eq!(
        copies,
        [restored
            .volume_id
            .rsplit('/')
            .next()
            .map(|n| format!("local-lvm:{n}"))
            .unwrap()],
        "only the restored disk besides the snapshot's and the worker's own"
    );
}

#[tokio::test]
async fn missing_privileges_name_what_to_grant() {
    let e = env().await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req("snapshot-x", &v.volume_id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("grant VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options to the CSI role"), "{}", err.message());

    let e = env_with_role("[VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]").await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req("snapshot-x", &v.volume_id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("Permission check failed (/vms/9999, VM.Clone)"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("grant VM.Clone"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn calls_per_snapshot_operation() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    // Warm the caches as a running controller has them.
    until_ready(&e, "snapshot-warm", &v.volume_id).await;
    let mut n = Vec::new();
    let b = e.calls().await;
    let seen = until_ready(&e, "snapshot-n", &v.volume_id).await;
    n.push((
        "snapshot, every call until ready",
        e.calls().await - b,
        seen.len(),
    ));
    let s = seen.last().unwrap().clone();
    let b = e.calls().await;
    create_snapshot(&e, "snapshot-n", &v.volume_id).await;
    n.push(("snapshot, repeated when ready", e.calls().await - b, 1));
    let before = counters(&e).await;
    let r = created(
        &e.svc,
        from(
            Source::Snapshot(SnapshotSource {
                snapshot_id: s.snapshot_id.clone(),
            }),
            "pvc-n",
            2 << 30,
        ),
    )
    .await;
    let after = counters(&e).await;
    let used: u64 = after
        .iter()
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
        .sum();
    let mut by_endpoint: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    by_endpoint.sort();
    eprintln!("RESTORE {by_endpoint:?}");
    n.push(("restore (grown to 2 GiB)", used, 1));
    let b = e.calls().await;
    e.svc
        .delete_volume(Request::new(callers::provisioner::delete_volume(&pv_of(
            &r,
        ))))
        .await
        .unwrap();
    n.push(("delete restored volume", e.calls().await - b, 1));
    let b = e.calls().await;
    e.svc
        .delete_snapshot(Request::new(callers::snapshotter::delete_snapshot(
            &s.snapshot_id,
        )))
        .await
        .unwrap();
    n.push(("delete snapshot", e.calls().await - b, 1));
    eprintln!("CALLS {n:?}");
    // Budgets: snapshot ≤ 21 over its calls (the first one also builds the
    // attachment index, one config read per VM, to tell whether the source
    // is attached), restore ≤ 25, deletes ≤ 10 and 7. A copy VM is
    // protected: releasing its disk and destroying it each cost a config
    // read and the write that lifts the flag; a copy VM is read once more to
    // check it is the one the id names (a snapshot's mark, a clone's sole
    // volume); a clone's disk is looked for once its VM is gone (a krbd
    // image Proxmox could not free). A new copy VM first lists the
    // disks on the node's storages (3 calls here): a VMID that owns a disk
    // is never taken.
    let budget = [21, 3, 25, 10, 7];
    for ((name, used, _), max) in n.iter().zip(budget) {
        assert!(*used <= max, "{name}: {used} calls > {max}");
    }
}

/// A raw API call with the CSI token, answered whatever its status: what an
/// operator's click or an IaC tool sends.
async fn api_answer(e: &Env, method: &str, path: &str) -> (u16, Value) {
    let url = format!("{}{path}", e.sim.api_url());
    let r = e
        .http
        .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url)
        .header(
            "Authorization",
            format!("PVEAPIToken=kubernetes-csi@pve!csi={SECRET}"),
        )
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json::<Value>().await.unwrap_or(Value::Null))
}

/// A snapshot `snapshot-p` of a new volume `pvc-a` on pve2 (both returned), made by a
/// controller whose token may copy and whose `vmIDRange` is `range`, on the
/// common cluster with `volumes:\n` replaced by `extra` (a VM or a volume
/// of someone else's).
async fn snapshot_in_range(
    extra: &str,
    range: std::ops::RangeInclusive<u32>,
) -> (Env, csi::Volume, csi::Snapshot) {
    let cluster = CLUSTER
        .replace(
            "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
            &format!("CSI: {COPY_ROLE}"),
        )
        .replace("volumes:\n", extra);
    let e = env_from_with(&cluster, |mut c| {
        c.vmid_range = proxmox_csi_controller::config::VmidRange {
            low: *range.start(),
            high: *range.end(),
        };
        c
    })
    .await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    let s = until_ready(&e, "snapshot-p", &v.volume_id).await;
    let snap = s.last().unwrap().clone();
    (e, v, snap)
}

/// Another Kubernetes cluster on the same Proxmox keeps its detached disks
/// under its controllerVmID, 20001, which has no VM: `/cluster/nextid`
/// calls 20001 free. A copy VM there would have those disks listed under
/// it. And a disk allocated under the copy VM's VMID after it was made
/// (another cluster whose controllerVmID it is) survives its destroy, which
/// frees only what the VM's config names (no `destroy-unreferenced-disks`,
/// which frees every disk of the VMID: qemu-server destroy_vm).
#[tokio::test]
async fn a_vmid_that_owns_disks_is_never_given_to_a_copy_vm() {
    let (e, _, snap) = snapshot_in_range(
        "volumes:\n  - { volid: \"local-lvm:vm-20001-pvc-other-cluster\", node: pve2, size: 1073741824 }\n",
        20001..=20003,
    )
    .await;
    let vm = vms_named(&e, "snapshot-p").await;
    assert_eq!(vm[0]["vmid"], 20002, "{vm:?}");
    {
        let mut c = e.sim.ctx.cluster();
        let place = c.place("local-lvm", "pve2").unwrap();
        c.volumes.entry(place).or_default().insert(
            "vm-20002-pvc-later".into(),
            pvesim::state::Volume {
                size: 1 << 30,
                format: "raw".into(),
                owner: 20002,
                ctime: 0,
            },
        );
    }
    e.svc
        .delete_snapshot(Request::new(callers::snapshotter::delete_snapshot(
            &snap.snapshot_id,
        )))
        .await
        .unwrap();
    assert!(vms_named(&e, "snapshot-p").await.is_empty());
    let left = volumes(&e).await;
    for other in [
        "local-lvm:vm-20001-pvc-other-cluster",
        "local-lvm:vm-20002-pvc-later",
    ] {
        assert!(left.iter().any(|v| v == other), "{other} is gone: {left:?}");
    }
}

#[tokio::test]
async fn copy_vms_are_protected_numbered_in_their_range_and_say_what_they_hold() {
    // A site that keeps 20000 for its own VM (Terraform's) and gives the
    // driver 20000-20002.
    let (e, v, snap) = snapshot_in_range(
        "  - { vmid: 20000, node: pve1, name: terraform-managed, config: { scsihw: virtio-scsi-pci } }\nvolumes:\n",
        20000..=20002,
    )
    .await;

    let vm = vms_named(&e, "snapshot-p").await;
    assert_eq!(vm.len(), 1, "{vm:?}");
    let vm = &vm[0];
    assert_eq!(vm["vmid"], 20001, "the first free VMID of the range: {vm}");
    let cfg = &vm["config"];
    assert_eq!(cfg["protection"], "1", "{cfg}");
    let description = cfg["description"].as_str().unwrap();
    for says in [
        "Proxmox CSI snapshot snapshot-p",
        "Owned by the Proxmox CSI driver",
        "destroying this VM destroys the volume data it holds",
        "Delete that object, not this VM",
    ] {
        assert!(description.contains(says), "{says:?} not in {description}");
    }
    assert!(
        cfg["unused0"]
            .as_str()
            .unwrap()
            .starts_with("local-lvm:vm-20001-"),
        "{cfg}"
    );

    // Destroyed from the UI or by IaC: Proxmox refuses, the data stays.
    let (status, body) = api_answer(&e, "DELETE", "/nodes/pve2/qemu/20001").await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("can't remove VM 20001 - protection mode enabled"),
        "{body}"
    );
    // Removing its disk is refused as well.
    let (status, body) =
        api_answer(&e, "PUT", "/nodes/pve2/qemu/20001/unlink?idlist=unused0").await;
    assert_eq!(status, 500, "{body}");
    assert!(
        volumes(&e)
            .await
            .iter()
            .any(|v| v.starts_with("local-lvm:vm-20001-"))
    );

    // A restore takes the last VMID of the range; a third copy finds none.
    let restored = until_created(
        &e,
        from(
            Source::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            }),
            "pvc-r",
            1 << 30,
        ),
    )
    .await;
    let r = vms_named(&e, "pvc-r").await;
    assert_eq!(r[0]["vmid"], 20002, "{r:?}");
    assert_eq!(r[0]["config"]["protection"], "1");
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req("snapshot-q", &v.volume_id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("vmIDRange 20000-20002"),
        "{}",
        err.message()
    );

    // The driver's own deletes lift the protection and leave nothing.
    e.svc
        .delete_volume(Request::new(callers::provisioner::delete_volume(&pv_of(
            &restored,
        ))))
        .await
        .unwrap();
    e.svc
        .delete_snapshot(Request::new(callers::snapshotter::delete_snapshot(
            &snap.snapshot_id,
        )))
        .await
        .unwrap();
    assert!(vms_named(&e, "snapshot-p").await.is_empty());
    assert!(vms_named(&e, "pvc-r").await.is_empty());
    // Their VMIDs are not handed out again at once: a late retry of either
    // delete must not find a new copy under the old VMID.
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req("snapshot-z", &v.volume_id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(vms_named(&e, "snapshot-z").await.is_empty());
    assert!(
        !volumes(&e).await.iter().any(|v| v.contains("vm-2000")),
        "{:?}",
        volumes(&e).await
    );
    assert_eq!(e.vm(20000).await["config"]["name"], "terraform-managed");
}
