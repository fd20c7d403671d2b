//! A clone or restore that takes a while shows as progress, not failure:
//! CreateVolume waits for the copy within the provisioner's deadline and
//! answers once, while the claim gets Normal `Copying` events (what
//! `kubectl describe pvc` lists) and the controller's metrics a gauge.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::Api;
use proxmox_csi_controller::kube::Kube;
use proxmox_csi_controller::progress;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::volume_content_source::{
    SnapshotSource, Type as Source, VolumeSource,
};
use serde_json::json;
use tonic::{Code, Request};

/// The claim `name` in `default`, as the API server holds it; its UID.
fn claim_in(kube: &kubesim::Running, name: &str) -> String {
    kube.put(
        "persistentvolumeclaims",
        json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }),
    );
    kube.get("persistentvolumeclaims", "default", name).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn kube_client(kube: &kubesim::Running) -> kube::Client {
    kube::Client::try_from(kube::Config::new(kube.url.parse().unwrap())).unwrap()
}

/// The copy gauge of `volume` as the metrics endpoint renders it, if any.
fn gauge(volume: &str) -> Option<f64> {
    let mut registry = prometheus_client::registry::Registry::with_prefix("proxmox_csi");
    progress::register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let series = format!("proxmox_csi_volume_copy_progress_ratio{{volume=\"{volume}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.parse().unwrap())
}

const LIMIT: Duration = Duration::from_secs(1);

/// CreateVolume as the provisioner sends it for the claim `name` (in
/// `default`, 1 GiB) cloning the volume `source`.
fn clone_of(source: &str, name: &str) -> csi::CreateVolumeRequest {
    from_source(
        Source::Volume(VolumeSource {
            volume_id: source.to_string(),
        }),
        name,
        1 << 30,
        &[("storage", "local-lvm")],
        Some("pve2"),
    )
}

/// A first call cut short by its 1.5 s deadline while the copy runs.
async fn aborted_first_call(e: &Env, req: &csi::CreateVolumeRequest) {
    let first = e
        .svc
        .create_volume(with_timeout(req.clone(), 1500))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::Aborted, "{first:?}");
}

fn with_timeout<T>(msg: T, ms: u64) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("grpc-timeout", format!("{ms}m").parse().unwrap());
    r
}

/// The events of `default` in the order they were posted.
async fn events(client: &kube::Client) -> Vec<Event> {
    let mut all = Api::<Event>::namespaced(client.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    all.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
    all
}

/// A controller with events every 300 ms at most and operations limited to
/// 1 s, on kubesim, with the copy role; a volume of `gib` GiB to copy, and
/// copies taking `ms_per_gib` (ten progress lines each).
async fn copying_env(kube: &kubesim::Running, gib: i64, ms_per_gib: u64) -> (Env, String) {
    let client = kube_client(kube);
    let e = env_with_role_then(COPY_ROLE, |mut c| {
        c.progress.event_interval = Duration::from_millis(300);
        c.operation_limit = LIMIT;
        c.with_kube(Kube::new(client), "csi.proxmox.sinextra.dev")
    })
    .await;
    let v = testkit::requests::created(
        &e.svc,
        create_req(
            "pvc-a",
            gib << 30,
            &[("storage", "local-lvm")],
            Some("pve2"),
        ),
    )
    .await;
    e.knobs(&format!(r#"{{"copy_ms_per_gib": {ms_per_gib}}}"#))
        .await;
    (e, v.volume_id)
}

/// `copying_env` of 1 GiB at 3 s per GiB, the claim `name`, and the
/// provisioner's CreateVolume cloning the volume for it.
async fn claimed_clone(name: &str) -> (kubesim::Running, Env, String, csi::CreateVolumeRequest) {
    let kube = kubesim::start().await.unwrap();
    let (e, source) = copying_env(&kube, 1, 3000).await;
    claim_in(&kube, name);
    let req = clone_of(&source, name);
    (kube, e, source, req)
}

/// What `kubectl describe` shows of each event: type, reason, message.
fn described(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}: {}",
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.message.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test]
async fn a_10_gib_restore_answers_once_with_normal_progress_events_on_its_claim() {
    let kube = kubesim::start().await.unwrap();
    // 0.4 s per GiB: each 10 GiB copy takes 4 s.
    let (e, source) = copying_env(&kube, 10, 400).await;
    let snapshot = until_ready(&e, "snapshot-1", &source)
        .await
        .pop()
        .unwrap()
        .snapshot_id;
    let uid = claim_in(&kube, "pvc-restored");
    let req = from_source(
        Source::Snapshot(SnapshotSource {
            snapshot_id: snapshot.clone(),
        }),
        "pvc-restored",
        10 << 30,
        &[("storage", "local-lvm")],
        Some("pve2"),
    );
    // The gauge, read as a scrape would while the call runs.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let seen = seen.clone();
        tokio::spawn(async move {
            loop {
                if let Some(v) = gauge("pvc-restored") {
                    seen.lock().unwrap().push(v);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // One call, as the provisioner makes it with the chart's timeout: the
    // wait for the copy (4 s) is not held to the operation limit (1 s).
    let answer = e.svc.create_volume(with_timeout(req, 60_000)).await;
    sampler.abort();
    let volume = answer.expect("one answer, no error while copying");
    assert!(volume.into_inner().volume.is_some());

    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|v| *v > 0.0 && *v < 1.0),
        "the gauge followed the copy: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "never backwards: {seen:?}"
    );
    assert_eq!(gauge("pvc-restored"), None, "gone once the copy is done");

    let events = events(&kube_client(&kube)).await;
    let listed = described(&events);
    assert!(
        events.iter().all(|e| e.type_.as_deref() == Some("Normal")),
        "no Warning while copying: {listed:#?}"
    );
    for e in &events {
        let o = &e.involved_object;
        assert_eq!(
            (
                o.kind.as_deref(),
                o.namespace.as_deref(),
                o.name.as_deref(),
                o.uid.as_deref()
            ),
            (
                Some("PersistentVolumeClaim"),
                Some("default"),
                Some("pvc-restored"),
                Some(uid.as_str())
            ),
            "kubectl describe pvc finds it: {listed:#?}"
        );
        assert_eq!(
            e.source.as_ref().unwrap().component.as_deref(),
            Some(progress::COMPONENT)
        );
    }
    let reasons: Vec<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
    let copying = reasons.iter().filter(|r| **r == progress::COPYING).count();
    // 4 s of copy, one event per 300 ms at most.
    assert!((2..=14).contains(&copying), "{listed:#?}");
    assert_eq!(reasons.last(), Some(&progress::COPIED), "{listed:#?}");
    assert!(
        listed[0].contains(&format!("restoring snapshot {snapshot} into pvc-restored")),
        "{listed:#?}"
    );
    assert!(
        listed.iter().any(|l| l.contains(" of 10.0 GiB (")),
        "the task's progress lines: {listed:#?}"
    );
    assert!(
        listed.last().unwrap().contains("done, 10.0 GiB in "),
        "{listed:#?}"
    );
}

/// A real failure is one error answer (one Warning from the provisioner);
/// its next call carries on with Normal progress.
#[tokio::test]
async fn a_failure_answers_once_and_the_next_call_shows_progress() {
    let (kube, e, source, req) = claimed_clone("pvc-copy").await;
    // The next task (the copy VM's creation) fails after its UPID.
    e.knobs(r#"{"fail_tasks": 1}"#).await;
    let mut errors = Vec::new();
    loop {
        match e.svc.create_volume(with_timeout(req.clone(), 60_000)).await {
            Ok(_) => break,
            Err(s) => errors.push(s),
        }
        assert!(errors.len() < 5, "{errors:?}");
    }
    assert_eq!(e.faults().failed_tasks, 1);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let listed = described(&events(&kube_client(&kube)).await);
    assert!(
        listed.iter().all(|l| l.starts_with("Normal ")),
        "{listed:#?}"
    );
    assert!(
        listed[0].contains(&format!("cloning volume {source} into pvc-copy")),
        "{listed:#?}"
    );
    assert!(
        listed.last().unwrap().starts_with("Normal Copied: "),
        "{listed:#?}"
    );
}

#[tokio::test]
async fn a_copy_outlasting_the_call_answers_aborted_and_its_claim_still_sees_progress() {
    let (kube, e, _, req) = claimed_clone("pvc-long").await;
    aborted_first_call(&e, &req).await;
    let running = events(&kube_client(&kube)).await;
    assert!(
        !running.is_empty()
            && running
                .iter()
                .all(|e| e.reason.as_deref() == Some(progress::COPYING)),
        "{running:?}"
    );
    // The provisioner's next call finishes it, in the same claim's events.
    testkit::requests::created(&e.svc, req).await;
    let after = events(&kube_client(&kube)).await;
    assert_eq!(
        after.last().and_then(|e| e.reason.as_deref()),
        Some(progress::COPIED)
    );
    assert!(after.iter().all(|e| e.type_.as_deref() == Some("Normal")));
}

#[tokio::test]
async fn without_the_claims_name_a_copy_posts_no_event_and_still_answers() {
    let kube = kubesim::start().await.unwrap();
    let (e, source) = copying_env(&kube, 1, 3000).await;
    let mut req = clone_of(&source, "pvc-bare");
    // A provisioner without --extra-create-metadata.
    req.parameters
        .retain(|k, _| !k.starts_with("csi.storage.k8s.io/"));
    e.svc
        .create_volume(with_timeout(req, 60_000))
        .await
        .expect("answered");
    assert_eq!(events(&kube_client(&kube)).await.len(), 0);
}

#[tokio::test]
async fn the_long_timeout_is_for_copies_an_unreachable_proxmox_is_reported_within_the_operation_limit()
 {
    let kube = kubesim::start().await.unwrap();
    let (e, _) = copying_env(&kube, 1, 3000).await;
    // Every request answered 595 (pveproxy's "no route to host" kind).
    e.knobs(r#"{"error_5xx_rate": 1.0}"#).await;
    let req = create_req(
        "pvc-plain",
        1 << 30,
        &[("storage", "local-lvm")],
        Some("pve2"),
    );
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        e.svc.create_volume(with_timeout(req, 600_000)),
    )
    .await
    .expect("answered long before the call's 10 minutes")
    .unwrap_err();
    assert!(
        matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Deletes the claim as kubectl does; kubesim's pvc-protection then lets
/// it go (no pod uses it). With `wait`, until it is gone.
async fn delete_claim(kube: &kubesim::Running, name: &str, wait: bool) {
    Api::<PersistentVolumeClaim>::namespaced(kube_client(kube), "default")
        .delete(name, &Default::default())
        .await
        .unwrap();
    for _ in 0..100 {
        if !wait
            || kube
                .get("persistentvolumeclaims", "default", name)
                .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("claim {name} never went");
}

/// The copy VMs and volumes pvesim holds for the volume `name`.
async fn left_for(e: &Env, name: &str) -> (Vec<serde_json::Value>, Vec<String>) {
    let vms = vms_named(e, name).await;
    let vmids: Vec<String> = vms.iter().map(|v| format!("vm-{}-", v["vmid"])).collect();
    let disks = volumes(e)
        .await
        .into_iter()
        .filter(|v| vmids.iter().any(|m| v.contains(m.as_str())))
        .collect();
    (vms, disks)
}

#[tokio::test]
async fn a_claim_deleted_while_its_copy_runs_leaves_no_copy_behind() {
    let (kube, e, _, req) = claimed_clone("pvc-dropped").await;
    let call = {
        let svc = e.svc.clone();
        let req = req.clone();
        tokio::spawn(async move { svc.create_volume(with_timeout(req, 60_000)).await })
    };
    // The copy runs (3 s); the claim goes.
    for _ in 0..100 {
        if !vms_named(&e, "pvc-dropped").await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!vms_named(&e, "pvc-dropped").await.is_empty(), "no copy VM");
    delete_claim(&kube, "pvc-dropped", false).await;
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("its claim default/pvc-dropped is not in the Kubernetes API")
            && err.message().contains("is destroyed"),
        "{}",
        err.message()
    );
    let (vms, disks) = left_for(&e, "pvc-dropped").await;
    assert!(vms.is_empty() && disks.is_empty(), "{vms:?} {disks:?}");
    assert_eq!(gauge("pvc-dropped"), None);
    // The provisioner's next call, with the claim it remembers: final.
    let again = e
        .svc
        .create_volume(with_timeout(req, 60_000))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    assert!(again.message().contains("nothing was copied"), "{again:?}");
    assert!(vms_named(&e, "pvc-dropped").await.is_empty());
}

#[tokio::test]
async fn a_claim_deleted_between_calls_has_its_copy_destroyed_on_the_next_call() {
    let (kube, e, _, req) = claimed_clone("pvc-later").await;
    aborted_first_call(&e, &req).await;
    delete_claim(&kube, "pvc-later", true).await;
    // Until the copy VM is destroyed, the answer says "in progress".
    let mut answers = Vec::new();
    let last = loop {
        let s = e
            .svc
            .create_volume(with_timeout(req.clone(), 60_000))
            .await
            .unwrap_err();
        if s.code() != Code::Unavailable {
            break s;
        }
        answers.push(s);
        assert!(answers.len() < 10, "{answers:?}");
    };
    assert_eq!(
        last.code(),
        Code::FailedPrecondition,
        "{last:?} after {answers:?}"
    );
    let (vms, disks) = left_for(&e, "pvc-later").await;
    assert!(vms.is_empty() && disks.is_empty(), "{vms:?} {disks:?}");
}

#[tokio::test]
async fn a_claim_replaced_under_the_same_name_gets_no_copy_and_no_events() {
    let kube = kubesim::start().await.unwrap();
    let (e, source) = copying_env(&kube, 1, 3000).await;
    // The provisioner names the volume after the claim it saw; the claim
    // of that name now is another one.
    let name = "pvc-5bc58ec7-1f2a-4c3b-9d8e-0123456789ab";
    kube.put(
        "persistentvolumeclaims",
        json!({"metadata": {"name": name, "namespace": "default",
                            "uid": "0e9d8c7b-6a5f-4e3d-2c1b-a09876543210"}}),
    );
    let req = clone_of(&source, name);
    let err = e
        .svc
        .create_volume(with_timeout(req, 60_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("nothing was copied"), "{err:?}");
    assert!(vms_named(&e, name).await.is_empty());
    assert_eq!(events(&kube_client(&kube)).await.len(), 0);
}

#[tokio::test]
async fn a_copy_that_does_not_record_its_claim_is_never_destroyed_for_it() {
    let (kube, e, _, req) = claimed_clone("pvc-unrecorded").await;
    // A controller that reads no claim (no Kubernetes API) starts the copy:
    // its VM records no claim UID.
    let blind =
        proxmox_csi_controller::csi::controller::ControllerService(Arc::new(controller_on(&e)));
    let first = blind
        .create_volume(with_timeout(req.clone(), 1500))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::Aborted, "{first:?}");
    delete_claim(&kube, "pvc-unrecorded", true).await;
    let err = e
        .svc
        .create_volume(with_timeout(req, 60_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("is kept"), "{err:?}");
    assert_eq!(vms_named(&e, "pvc-unrecorded").await.len(), 1);
}
