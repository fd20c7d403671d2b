//! The dangerous faults: a write that took effect in Proxmox and whose
//! answer was lost (pvesim's `lose_answers`), and a task that did its work
//! and still ended in error (`fail_tasks_after_work`). For each write of
//! each operation in turn, the operation is retried as its sidecar retries
//! it and must end in the same single result: one disk, one slot, one copy
//! VM, the size asked for, the volume gone. Every case proves its fault
//! fired.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;

use std::future::Future;
use std::time::Duration;

use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use serde_json::Value;
use tonic::{Code, Request, Response, Status};

/// Calls `rpc` until it succeeds, as the sidecars do (external-provisioner,
/// -attacher, -resizer and -snapshotter requeue every failed call with
/// backoff). A code no retry can fix fails the test: after a lost answer
/// every failure must be one to try again.
async fn retried<T, F, Fut>(what: &str, mut rpc: F) -> (T, u32)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    let mut failures = 0;
    loop {
        match rpc().await {
            Ok(r) => return (r.into_inner(), failures),
            Err(s) => {
                assert!(
                    matches!(
                        s.code(),
                        Code::Unavailable | Code::Aborted | Code::DeadlineExceeded
                    ),
                    "{what}: a lost answer must leave a retryable error, got {s:?}"
                );
                failures += 1;
                assert!(failures < 30, "{what}: still failing: {s:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// CreateSnapshot of `name` from `volume_id`, asked again until the
/// snapshot is ready to use, as the external-snapshotter does: every
/// answer, the ready one last.
async fn until_ready(
    e: &Env,
    name: &str,
    volume_id: &str,
) -> Vec<proxmox_csi_proto::csi::v1::Snapshot> {
    let req = snap_req(name, volume_id);
    let mut answers = Vec::new();
    loop {
        let (r, _) = retried("snapshot", || {
            e.svc.create_snapshot(Request::new(req.clone()))
        })
        .await;
        let s = r.snapshot.unwrap();
        let ready = s.ready_to_use;
        answers.push(s);
        if ready {
            return answers;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// pvesim's VMs whose config is named `name`.
async fn vms_named(e: &Env, name: &str) -> Vec<Value> {
    let vms = e.admin("GET", "vms", "").await;
    vms.as_array()
        .unwrap()
        .iter()
        .filter(|vm| vm["config"]["name"] == name)
        .cloned()
        .collect()
}

async fn volumes(e: &Env) -> Vec<Value> {
    e.admin("GET", "volumes", "")
        .await
        .as_array()
        .unwrap()
        .clone()
}

fn named<'a>(vols: &'a [Value], name: &str) -> Vec<&'a Value> {
    vols.iter()
        .filter(|v| v["volid"].as_str().unwrap().contains(name))
        .collect()
}

/// The keys of VM `vmid`'s config that name `volume`, and its pending
/// changes.
async fn slots_of(e: &Env, vmid: u32, volume: &str) -> (Vec<String>, Value) {
    let vm = e.vm(vmid).await;
    let keys = vm["config"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| v.as_str().is_some_and(|s| s.contains(volume)))
        .map(|(k, _)| k.clone())
        .collect();
    (keys, vm["pending"].clone())
}

/// How an answer is lost: the connection dropped (0), or a proxy's status
/// in place of the answer after it passed the write on (pveproxy's 596, a
/// gateway's 504).
const DROPPED: u16 = 0;
const TIMED_OUT: u16 = 596;
const GATEWAY_TIMEOUT: u16 = 504;

/// Loses the answer of the `skip`-th write from now on, as `how` says;
/// whether it was lost is read from pvesim's fault tally afterwards.
async fn lose_write(e: &Env, skip: u32, how: u16) {
    e.knobs(&format!(
        r#"{{"lose_answers": 1, "lose_answers_skip": {skip}, "lost_answer_status": {how}}}"#
    ))
    .await;
}

/// Whether the armed fault fired; when it did not, the operation has fewer
/// writes than `skip` + 1 and the fault is disarmed.
async fn fired(e: &Env) -> bool {
    let fired = e.faults().lost_answers == 1;
    if !fired {
        e.knobs(r#"{"lose_answers": 0, "lose_answers_skip": 0}"#)
            .await;
    }
    fired
}

#[tokio::test]
async fn create_with_a_lost_answer_makes_one_disk() {
    create_with_a_lost_answer_makes_one_disk_when(DROPPED).await;
}

#[tokio::test]
async fn create_with_a_lost_answer_makes_one_disk_answered_596() {
    create_with_a_lost_answer_makes_one_disk_when(TIMED_OUT).await;
}

#[tokio::test]
async fn create_with_a_lost_answer_makes_one_disk_answered_504_by_a_gateway() {
    create_with_a_lost_answer_makes_one_disk_when(GATEWAY_TIMEOUT).await;
}

async fn create_with_a_lost_answer_makes_one_disk_when(how: u16) {
    let mut writes = 0;
    for skip in 0.. {
        let e = env().await;
        lose_write(&e, skip, how).await;
        let req = create_req("pvc-lc", 1 << 30, &[("storage", "local-lvm")], Some("pve2"));
        let (v, _) = retried("create", || e.svc.create_volume(Request::new(req.clone()))).await;
        if !fired(&e).await {
            break;
        }
        writes += 1;
        let v = v.volume.unwrap();
        let vols = volumes(&e).await;
        let mine = named(&vols, "pvc-lc");
        assert_eq!(mine.len(), 1, "write {skip}: {vols:?}");
        assert!(
            v.volume_id.ends_with(
                mine[0]["volid"]
                    .as_str()
                    .unwrap()
                    .split(':')
                    .nth(1)
                    .unwrap()
            )
        );
        // The retried call answers the same volume again.
        let again = e.svc.create_volume(Request::new(req)).await.unwrap();
        assert_eq!(again.into_inner().volume.unwrap().volume_id, v.volume_id);
    }
    assert!(writes >= 1, "no write of CreateVolume lost its answer");
    eprintln!(
        "CreateVolume: the answer of each of its {writes} writes lost in turn, one result each time"
    );
}

#[tokio::test]
async fn publish_and_unpublish_with_a_lost_answer_use_one_slot() {
    publish_and_unpublish_with_a_lost_answer_use_one_slot_when(DROPPED).await;
}

#[tokio::test]
async fn publish_and_unpublish_with_a_lost_answer_use_one_slot_answered_596() {
    publish_and_unpublish_with_a_lost_answer_use_one_slot_when(TIMED_OUT).await;
}

async fn publish_and_unpublish_with_a_lost_answer_use_one_slot_when(how: u16) {
    let mut writes = (0, 0);
    for skip in 0.. {
        let e = env().await;
        let v = create(&e, "pvc-lp", Some("pve2")).await;
        let name = "vm-9999-pvc-lp";
        lose_write(&e, skip, how).await;
        let req = publish_req(&v, "worker-2/112");
        let (pc, _) = retried("publish", || {
            e.svc.controller_publish_volume(Request::new(req.clone()))
        })
        .await;
        if !fired(&e).await {
            break;
        }
        writes.0 += 1;
        let (keys, pending) = slots_of(&e, 112, name).await;
        assert_eq!(keys.len(), 1, "write {skip}: one slot, got {keys:?}");
        assert_eq!(pending, serde_json::json!({}), "write {skip}");
        let lun = keys[0].trim_start_matches("scsi");
        assert_eq!(pc.publish_context["lun"], lun, "{pc:?}");
    }
    for skip in 0.. {
        let e = env().await;
        let v = create(&e, "pvc-lu", Some("pve2")).await;
        let name = "vm-9999-pvc-lu";
        e.svc
            .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
            .await
            .unwrap();
        lose_write(&e, skip, how).await;
        let req = unpublish_req(&v, "worker-2/112");
        retried("unpublish", || {
            e.svc.controller_unpublish_volume(Request::new(req.clone()))
        })
        .await;
        if !fired(&e).await {
            break;
        }
        writes.1 += 1;
        let (keys, pending) = slots_of(&e, 112, name).await;
        assert!(keys.is_empty(), "write {skip}: left on the VM: {keys:?}");
        assert_eq!(pending, serde_json::json!({}), "write {skip}");
        assert_eq!(named(&volumes(&e).await, name).len(), 1, "the disk stays");
    }
    assert!(writes.0 >= 1 && writes.1 >= 1, "{writes:?}");
    eprintln!(
        "ControllerPublish/Unpublish: {} and {} writes lost in turn",
        writes.0, writes.1
    );
}

#[tokio::test]
async fn expand_with_a_lost_answer_grows_once() {
    expand_with_a_lost_answer_grows_once_when(DROPPED).await;
}

#[tokio::test]
async fn expand_with_a_lost_answer_grows_once_answered_596() {
    expand_with_a_lost_answer_grows_once_when(TIMED_OUT).await;
}

async fn expand_with_a_lost_answer_grows_once_when(how: u16) {
    let mut writes = 0;
    for skip in 0.. {
        // Offline growth goes through the controller's holder VM.
        let e = env_with_role(COPY_ROLE).await;
        let v = create(&e, "pvc-le", Some("pve2")).await;
        lose_write(&e, skip, how).await;
        let req = expand_req(&v, 3 << 30);
        let (r, _) = retried("expand", || {
            e.svc.controller_expand_volume(Request::new(req.clone()))
        })
        .await;
        if !fired(&e).await {
            break;
        }
        writes += 1;
        assert_eq!(r.capacity_bytes, 3 << 30);
        let vols = volumes(&e).await;
        let mine = named(&vols, "pvc-le");
        assert_eq!(
            mine[0]["size"],
            3u64 << 30,
            "write {skip}: grown once: {mine:?}"
        );
    }
    assert!(
        writes >= 1,
        "no write of ControllerExpandVolume lost its answer"
    );
    eprintln!(
        "ControllerExpandVolume: the answer of each of its {writes} writes lost in turn, one result each time"
    );
}

#[tokio::test]
async fn snapshot_with_a_lost_answer_makes_one_copy() {
    snapshot_with_a_lost_answer_makes_one_copy_when(DROPPED).await;
}

#[tokio::test]
async fn snapshot_with_a_lost_answer_makes_one_copy_answered_596() {
    snapshot_with_a_lost_answer_makes_one_copy_when(TIMED_OUT).await;
}

async fn snapshot_with_a_lost_answer_makes_one_copy_when(how: u16) {
    let mut writes = 0;
    for skip in 0.. {
        let e = env_with_role(COPY_ROLE).await;
        let v = create(&e, "pvc-ls", Some("pve2")).await;
        lose_write(&e, skip, how).await;
        let answers = until_ready(&e, "snapshot-ls", &v.volume_id).await;
        let snap = answers.last().unwrap();
        if !fired(&e).await {
            break;
        }
        writes += 1;
        let copies = vms_named(&e, "snapshot-ls").await;
        assert_eq!(copies.len(), 1, "write {skip}: one copy VM: {copies:?}");
        let vols = volumes(&e).await;
        let owned = vols
            .iter()
            .filter(|x| x["owner"] == copies[0]["vmid"])
            .count();
        assert_eq!(owned, 1, "write {skip}: one copied disk: {vols:?}");
        assert!(!snap.snapshot_id.is_empty());
    }
    assert!(writes >= 1, "no write of CreateSnapshot lost its answer");
    eprintln!(
        "CreateSnapshot: the answer of each of its {writes} writes lost in turn, one result each time"
    );
}

#[tokio::test]
async fn delete_with_a_lost_answer_is_done_once() {
    delete_with_a_lost_answer_is_done_once_when(DROPPED).await;
}

#[tokio::test]
async fn delete_with_a_lost_answer_is_done_once_answered_596() {
    delete_with_a_lost_answer_is_done_once_when(TIMED_OUT).await;
}

async fn delete_with_a_lost_answer_is_done_once_when(how: u16) {
    let mut writes = 0;
    for skip in 0.. {
        let e = env().await;
        let v = create(&e, "pvc-ld", Some("pve2")).await;
        lose_write(&e, skip, how).await;
        let req = delete_req(&v);
        retried("delete", || e.svc.delete_volume(Request::new(req.clone()))).await;
        if !fired(&e).await {
            break;
        }
        writes += 1;
        assert!(
            named(&volumes(&e).await, "pvc-ld").is_empty(),
            "write {skip}"
        );
    }
    assert!(writes >= 1, "no write of DeleteVolume lost its answer");
    eprintln!(
        "DeleteVolume: the answer of each of its {writes} writes lost in turn, one result each time"
    );
}

/// A task that did its work and still ended in error: the retry finds the
/// work and ends with the single result.
#[tokio::test]
async fn tasks_failing_after_their_work_are_found_by_the_retry() {
    let e = env().await;
    let v = create(&e, "pvc-lt", Some("pve2")).await;
    let name = "vm-9999-pvc-lt";
    e.knobs(r#"{"fail_tasks_after_work": 1}"#).await;
    let req = publish_req(&v, "worker-2/112");
    retried("publish", || {
        e.svc.controller_publish_volume(Request::new(req.clone()))
    })
    .await;
    assert_eq!(e.faults().failed_tasks_after_work, 1);
    let (keys, pending) = slots_of(&e, 112, name).await;
    assert_eq!(keys.len(), 1, "one slot: {keys:?}");
    assert_eq!(pending, serde_json::json!({}));

    e.knobs(r#"{"fail_tasks_after_work": 1}"#).await;
    let req = unpublish_req(&v, "worker-2/112");
    retried("unpublish", || {
        e.svc.controller_unpublish_volume(Request::new(req.clone()))
    })
    .await;
    assert_eq!(e.faults().failed_tasks_after_work, 2);
    let (keys, _) = slots_of(&e, 112, name).await;
    assert!(keys.is_empty(), "{keys:?}");

    e.knobs(r#"{"fail_tasks_after_work": 1}"#).await;
    let req = delete_req(&v);
    retried("delete", || e.svc.delete_volume(Request::new(req.clone()))).await;
    assert_eq!(e.faults().failed_tasks_after_work, 3);
    assert!(named(&volumes(&e).await, "pvc-lt").is_empty());
}

/// Another writer holds VM 112's config lock (a backup, a migration) while
/// the controller dies in the middle of a publish; the new controller (no
/// memory of the old one's work) waits the lock out and ends with one slot
/// and nothing pending.
#[tokio::test]
async fn a_lock_held_across_a_controller_restart() {
    let e = env().await;
    let v = create(&e, "pvc-lr", Some("pve2")).await;
    e.admin("POST", "vms/112/hold-lock?seconds=3", "").await;
    assert_eq!(e.faults().held_locks, 1);
    let req = publish_req(&v, "worker-2/112");
    // The first controller is waiting for the lock when it dies.
    let first = tokio::time::timeout(
        Duration::from_millis(500),
        e.svc.controller_publish_volume(Request::new(req.clone())),
    )
    .await;
    assert!(first.is_err(), "the publish was still waiting: {first:?}");
    drop(first);
    let restarted = proxmox_csi_controller::csi::controller::ControllerService(
        std::sync::Arc::new(controller_on(&e)),
    );
    retried("publish after the restart", || {
        restarted.controller_publish_volume(Request::new(req.clone()))
    })
    .await;
    let (keys, pending) = slots_of(&e, 112, "vm-9999-pvc-lr").await;
    assert_eq!(keys.len(), 1, "one slot: {keys:?}");
    assert_eq!(pending, serde_json::json!({}));
}

/// pvedaemon's three workers held by slow calls: pveproxy answers 596 for
/// each write it passed on once its wait runs out, and the write is carried
/// out when a worker frees. Create, publish, expand and unpublish each
/// leave one result when retried as their sidecars retry them.
#[tokio::test]
async fn a_saturated_pvedaemon_answers_596_and_each_write_lands_once() {
    let e = env().await;
    e.knobs(r#"{"daemon_workers": 3, "proxy_timeout_ms": 300}"#)
        .await;
    let busy = || async {
        e.admin("POST", "daemon/busy?workers=3&seconds=0.8", "")
            .await;
    };
    let req = create_req(
        "pvc-busy",
        1 << 30,
        &[("storage", "local-lvm")],
        Some("pve2"),
    );
    busy().await;
    let (v, failures) = retried("create", || e.svc.create_volume(Request::new(req.clone()))).await;
    assert!(failures > 0, "the create met no busy daemon");
    let v = v.volume.unwrap();
    assert_eq!(named(&volumes(&e).await, "pvc-busy").len(), 1);

    busy().await;
    let (pc, _) = retried("publish", || {
        e.svc
            .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
    })
    .await;
    let (keys, pending) = slots_of(&e, 112, "pvc-busy").await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(
        pc.publish_context["lun"],
        keys[0].trim_start_matches("scsi")
    );
    assert_eq!(pending, Value::Object(Default::default()), "{pending}");

    busy().await;
    retried("expand", || {
        e.svc
            .controller_expand_volume(Request::new(expand_req(&v, 2 << 30)))
    })
    .await;
    let vols = volumes(&e).await;
    assert_eq!(named(&vols, "pvc-busy")[0]["size"], 2u64 << 30, "{vols:?}");

    busy().await;
    retried("unpublish", || {
        e.svc
            .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2")))
    })
    .await;
    let (keys, pending) = slots_of(&e, 112, "pvc-busy").await;
    assert!(keys.is_empty(), "{keys:?}");
    assert_eq!(pending, Value::Object(Default::default()), "{pending}");
    assert!(
        e.faults().proxy_timeouts >= 4,
        "the proxy timed out only {} times",
        e.faults().proxy_timeouts
    );
}

/// A snapshot's copy VM created while pvedaemon's workers are held: each
/// POST /qemu is answered 596 by pveproxy and carried out later, after the
/// retry looked for the VM and found none. The retry creates under the VMID
/// whose answer was lost, so that of the creates that land one makes the
/// VM and the others find it taken: one copy VM, and the snapshot id the
/// first answer gave stays the snapshot's.
#[tokio::test]
async fn a_snapshot_while_pvedaemon_is_saturated_makes_one_copy_vm() {
    let e = env_with_role(COPY_ROLE).await;
    let v = create(&e, "pvc-sat", Some("pve2")).await;
    e.knobs(r#"{"daemon_workers": 3, "proxy_timeout_ms": 300}"#)
        .await;
    e.admin("POST", "daemon/busy?workers=3&seconds=1.5", "")
        .await;
    let answers = until_ready(&e, "snapshot-sat", &v.volume_id).await;
    let snap = answers.last().unwrap();
    // Let every queued create land before counting.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(e.faults().proxy_timeouts >= 1, "the proxy never timed out");
    let copies = vms_named(&e, "snapshot-sat").await;
    assert_eq!(copies.len(), 1, "one copy VM: {copies:?}");
    let ids: Vec<&str> = answers.iter().map(|a| a.snapshot_id.as_str()).collect();
    assert!(
        ids.iter().all(|id| *id == snap.snapshot_id),
        "one snapshot id in every answer: {ids:?}"
    );
}
