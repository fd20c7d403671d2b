//! Every controller RPC against pvesim: outcomes in Proxmox's state, gRPC
//! codes, idempotency, and the faults the Go driver gets wrong.

mod common;

use common::*;

use std::sync::Arc;
use std::time::Duration;

use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::volume_capability::AccessMode;
use proxmox_csi_proto::csi::v1::volume_capability::access_mode::Mode;
use testkit::requests::created;
use tonic::{Code, Request};

#[tokio::test]
async fn create_is_idempotent_and_strict() {
    let e = env().await;
    let v = create(&e, "pvc-a", Some("pve2")).await;
    assert_eq!(v.volume_id, "region-1/pve2/local-lvm/vm-9999-pvc-a");
    assert_eq!(v.capacity_bytes, 1 << 30);
    assert_eq!(v.volume_context["ssd"], "1");
    let again = create(&e, "pvc-a", Some("pve2")).await;
    assert_eq!(again, v);
    let vols = e.admin("GET", "volumes", "").await;
    assert_eq!(
        vols.as_array()
            .unwrap()
            .iter()
            .filter(|v| v["volid"] == "local-lvm:vm-9999-pvc-a")
            .count(),
        1
    );

    // Same name, another size: AlreadyExists.
    let err = e
        .svc
        .create_volume(Request::new(create_req(
            "pvc-a",
            5 << 30,
            &[("storage", "local-lvm")],
            Some("pve2"),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // Sizes: 512 MiB steps; the default 10 GiB.
    let v = created(
        &e.svc,
        create_req(
            "pvc-b",
            (1 << 30) + 1,
            &[("storage", "local-lvm")],
            Some("pve2"),
        ),
    )
    .await;
    assert_eq!(v.capacity_bytes, 1536 << 20);

    // What the Go driver fails on (a number that does not parse; a boolean
    // that does not is false there and here), access modes, topology.
    let cases: Vec<(csi::CreateVolumeRequest, Code, &str)> = vec![
        (
            create_req(
                "x",
                1,
                &[("storage", "local-lvm"), ("diskIOPS", "lots")],
                None,
            ),
            Code::InvalidArgument,
            "parameters.diskIOPS: \"lots\" is not a number",
        ),
        (
            create_req("x", 1, &[], None),
            Code::InvalidArgument,
            "parameters.storage: parameter storage must be provided",
        ),
        (
            create_req("x", 1, &[("storage", "nope")], None),
            Code::InvalidArgument,
            "parameters.storage: storage \"nope\" is not available",
        ),
        (
            create_req("", 1, &[("storage", "local-lvm")], None),
            Code::InvalidArgument,
            "name: is required",
        ),
        (
            create_req("x", 1, &[("storage", "nfs")], Some("pve3")),
            Code::ResourceExhausted,
            "storage \"nfs\" is on none of the requested zones",
        ),
    ];
    for (req, code, want) in cases {
        let err = e.svc.create_volume(Request::new(req)).await.unwrap_err();
        assert_eq!(err.code(), code, "{want}: {err:?}");
        assert!(
            err.message().contains(want),
            "want {want:?}, got {:?}",
            err.message()
        );
    }
    let mut rwx = create_req("x", 1, &[("storage", "local-lvm")], None);
    rwx.volume_capabilities[0].access_mode = Some(AccessMode {
        mode: Mode::MultiNodeMultiWriter as i32,
    });
    let err = e.svc.create_volume(Request::new(rwx)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("MULTI_NODE_MULTI_WRITER is not supported"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn zone_is_chosen_by_free_capacity_and_shared_storage_has_region_topology() {
    let e = env().await;
    // Fill pve1's local-lvm so that pve2 or pve3 has more room.
    let big = e
        .svc
        .create_volume(Request::new(create_req(
            "pvc-big",
            50 << 30,
            &[("storage", "local-lvm")],
            Some("pve1"),
        )))
        .await
        .unwrap();
    assert!(
        big.get_ref()
            .volume
            .as_ref()
            .unwrap()
            .volume_id
            .contains("/pve1/")
    );
    let v = created(
        &e.svc,
        create_req("pvc-free", 1 << 30, &[("storage", "local-lvm")], None),
    )
    .await;
    assert!(!v.volume_id.contains("/pve1/"), "{}", v.volume_id);
    let s = created(
        &e.svc,
        create_req("pvc-shared", 1 << 30, &[("storage", "nfs")], None),
    )
    .await;
    assert_eq!(s.volume_id, "region-1//nfs/9999/vm-9999-pvc-shared.raw");
    let zones: Vec<&str> = s
        .accessible_topology
        .iter()
        .map(|t| t.segments["topology.kubernetes.io/zone"].as_str())
        .collect();
    assert_eq!(zones, ["pve1", "pve2"], "the storage's nodes list");
}

#[tokio::test]
async fn publish_attaches_with_wwn_and_serial_and_unpublish_leaves_nothing() {
    let e = env().await;
    let v = create(&e, "pvc-p", Some("pve2")).await;
    let ctx = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let cfg = e.vm(112).await;
    let line = cfg["config"]["scsi1"].as_str().unwrap();
    assert!(line.starts_with("local-lvm:vm-9999-pvc-p,"), "{line}");
    assert!(
        line.contains("discard=on")
            && line.contains("ssd=1")
            && line.contains("backup=0")
            && line.contains("iothread=1"),
        "{line}"
    );
    assert!(
        line.contains(&format!("wwn={}", ctx["wwn"])),
        "{line} / {ctx:?}"
    );
    assert!(
        line.contains(&format!("serial={}", ctx["serial"])),
        "{line}"
    );
    // virtio-scsi-pci: target 0, the slot number as LUN.
    assert_eq!((ctx["target"].as_str(), ctx["lun"].as_str()), ("0", "1"));
    assert_eq!(
        ctx["DevicePath"],
        format!("/dev/disk/by-id/wwn-{}", ctx["wwn"])
    );
    // Idempotent: same context, no second slot.
    let again = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(again, ctx);
    assert!(e.vm(112).await["config"].get("scsi2").is_none());
    // Attached to another VM: refused with the reason.
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-3/113")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("is attached to VM 112"),
        "{}",
        err.message()
    );
    // Local storage of pve2 cannot go to a VM on pve1: the remedy is named.
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-1/111")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("pvecsictl migrate"),
        "{}",
        err.message()
    );
    // Delete refuses an attached disk.
    let err = e
        .svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("attached to VM 112"),
        "{}",
        err.message()
    );

    for _ in 0..2 {
        e.svc
            .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2/112")))
            .await
            .unwrap();
    }
    let vm = e.vm(112).await;
    assert!(vm["config"].get("scsi1").is_none(), "{vm}");
    assert!(
        vm["config"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("unused")),
        "{vm}"
    );
    assert!(
        vm["pending"].as_object().unwrap().is_empty()
            && vm["pending_delete"].as_object().unwrap().is_empty(),
        "{vm}"
    );
    // A node whose VM is gone counts as detached.
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "ghost/4242")))
        .await
        .unwrap();

    for _ in 0..2 {
        e.svc
            .delete_volume(Request::new(delete_req(&v)))
            .await
            .unwrap();
    }
    let vols = e.admin("GET", "volumes", "").await;
    assert!(
        vols.as_array()
            .unwrap()
            .iter()
            .all(|x| x["volid"] != "local-lvm:vm-9999-pvc-p")
    );
}

#[tokio::test]
async fn a_failed_hotplug_is_reverted_and_retryable() {
    let e = env().await;
    let v = create(&e, "pvc-h", Some("pve2")).await;
    e.knobs(r#"{"fail_hotplugs": 1}"#).await;
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("hotplug problem"),
        "{}",
        err.message()
    );
    assert_eq!(e.faults().failed_hotplugs, 1);
    let vm = e.vm(112).await;
    assert!(vm["config"].get("scsi1").is_none(), "{vm}");
    assert!(
        vm["pending"].as_object().unwrap().is_empty(),
        "nothing left pending: {vm}"
    );
    // The retry (as the attacher sidecar does) succeeds.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    assert!(
        e.vm(112).await["config"]["scsi1"]
            .as_str()
            .unwrap()
            .starts_with("local-lvm:vm-9999-pvc-h")
    );
}

#[tokio::test]
async fn locks_5xx_and_dropped_connections_are_retried_within_the_deadline() {
    let e = env().await;
    let v = create(&e, "pvc-l", Some("pve2")).await;
    // `lock: backup` for a while: retried, then it works.
    e.admin("PUT", "vms/112/lock?value=backup", "").await;
    let http = e.http.clone();
    let addr = e.sim.addr;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let _ = http
            .delete(format!("http://{addr}/pvesim/vms/112/lock"))
            .send()
            .await;
    });
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();

    // A lock that outlasts the deadline: Unavailable, with Proxmox's text.
    e.admin("PUT", "vms/112/lock?value=backup", "").await;
    let mut req = Request::new(unpublish_req(&v, "worker-2/112"));
    req.metadata_mut()
        .insert("grpc-timeout", "1500m".parse().unwrap());
    let err = e.svc.controller_unpublish_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("VM is locked (backup)"),
        "{}",
        err.message()
    );
    e.admin("DELETE", "vms/112/lock", "").await;

    // 5xx and dropped connections.
    e.knobs(r#"{"drop_connections": 2}"#).await;
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    assert_eq!(e.faults().dropped_connections, 2);
    // Every call answered 595 until the controller has retried four times.
    e.knobs(r#"{"error_5xx_rate": 1.0}"#).await;
    let sim = e.sim.ctx.clone();
    let healer = tokio::spawn(async move {
        while sim.cluster().faults.errors_5xx < 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sim.cluster().knobs.error_5xx_rate = 0.0;
    });
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    healer.await.unwrap();
    assert!(e.faults().errors_5xx >= 4, "{:?}", e.faults());
    // A task that fails after its UPID: the exit status is read.
    e.knobs(r#"{"fail_tasks": 1}"#).await;
    let err = e
        .svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2/112")))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("task failed (injected by pvesim)"),
        "{err:?}"
    );
    // Retryable, as the sidecars must try again (the soak found it final).
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(e.faults().failed_tasks, 1);
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    assert!(e.vm(112).await["config"].get("scsi1").is_none());
    e.knobs(r#"{"fail_tasks": 1}"#).await;
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(e.faults().failed_tasks, 2);
    assert_eq!(
        e.vm(112).await["pending"],
        serde_json::json!({}),
        "nothing left pending"
    );
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
}

/// A config lock held longer than Proxmox waits for it (qemu-server's
/// 10 s, scaled down by pvesim's `lock_timeout_ms`): the write that timed
/// out waiting is sent again until the lock is free, and lands once.
#[tokio::test]
async fn a_config_lock_held_past_the_lock_timeout_is_waited_out() {
    let e = env().await;
    let v = create(&e, "pvc-12", Some("pve2")).await;
    e.knobs(r#"{"lock_timeout_ms": 400}"#).await;
    e.admin("POST", "vms/112/hold-lock?seconds=1", "").await;
    e.admin("DELETE", "counters", "").await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    let counters = e.admin("GET", "counters", "").await;
    let writes = counters["POST /nodes/{node}/qemu/{vmid}/config"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        writes >= 2,
        "the write that timed out was not sent again: {counters}"
    );
    let cfg = e.vm(112).await;
    let held: Vec<&str> = cfg["config"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|l| l.as_str())
        .filter(|l| l.contains("pvc-12"))
        .collect();
    assert_eq!(held.len(), 1, "{cfg}");
}

#[tokio::test]
async fn concurrent_publishes_to_one_vm_are_coalesced() {
    let e = env().await;
    e.knobs(r#"{"hotplug_latency_ms": 200}"#).await;
    let mut vols = Vec::new();
    for i in 0..8 {
        vols.push(create(&e, &format!("pvc-c{i}"), Some("pve2")).await);
    }
    let before = e
        .svc
        .0
        .attacher
        .writes
        .load(std::sync::atomic::Ordering::Relaxed);
    let calls = vols.iter().map(|v| {
        let svc = e.svc.clone();
        let req = publish_req(v, "worker-2/112");
        async move { svc.controller_publish_volume(Request::new(req)).await }
    });
    let results = futures::future::join_all(calls).await;
    let mut luns = std::collections::BTreeSet::new();
    for r in results {
        luns.insert(r.unwrap().into_inner().publish_context["lun"].clone());
    }
    assert_eq!(luns.len(), 8, "every volume has its own slot");
    let writes = e
        .svc
        .0
        .attacher
        .writes
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    assert!(writes < 8, "8 attaches took {writes} config writes");
    let cfg = e.vm(112).await;
    for i in 1..=8 {
        assert!(cfg["config"].get(format!("scsi{i}")).is_some(), "{cfg}");
    }
}

#[tokio::test]
async fn two_controllers_racing_on_one_vm_both_land() {
    let e = env().await;
    let other = env_sharing(&e).await;
    let a = create(&e, "pvc-r1", Some("pve2")).await;
    let b = create(&e, "pvc-r2", Some("pve2")).await;
    let (ra, rb) = tokio::join!(
        e.svc
            .controller_publish_volume(Request::new(publish_req(&a, "worker-2/112"))),
        other.controller_publish_volume(Request::new(publish_req(&b, "worker-2/112"))),
    );
    let (la, lb) = (
        ra.unwrap().into_inner().publish_context["lun"].clone(),
        rb.unwrap().into_inner().publish_context["lun"].clone(),
    );
    assert_ne!(la, lb, "the digest kept them from taking the same slot");
    let cfg = e.vm(112).await;
    assert!(
        cfg["config"][format!("scsi{la}")]
            .as_str()
            .unwrap()
            .contains("pvc-r1")
    );
    assert!(
        cfg["config"][format!("scsi{lb}")]
            .as_str()
            .unwrap()
            .contains("pvc-r2")
    );
}

/// A second controller (its own queues and caches) on the same pvesim.
async fn env_sharing(e: &Env) -> ControllerService {
    ControllerService(Arc::new(controller_on(e)))
}

#[tokio::test]
async fn expand_capacity_list_and_get() {
    let e = env().await;
    let v = create(&e, "pvc-x", Some("pve2")).await;
    let exp = |bytes: i64| expand_req(&v, bytes);
    // Not attached, and the minimal role may not create the holder VM.
    let err = e
        .svc
        .controller_expand_volume(Request::new(exp(2 << 30)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("grant VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options"), "{}", err.message());
    // Attached: grown through the VM; asking again is a no-op.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    let r = e
        .svc
        .controller_expand_volume(Request::new(exp(2 << 30)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 2 << 30);
    assert!(r.node_expansion_required);
    assert!(
        e.vm(112).await["config"]["scsi1"]
            .as_str()
            .unwrap()
            .contains("size=2G")
    );
    let r = e
        .svc
        .controller_expand_volume(Request::new(exp(1 << 30)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 2 << 30);

    let cap = e
        .svc
        .get_capacity(Request::new(callers::provisioner::get_capacity(
            &callers::provisioner::StorageClass::new(&[("storage", "local-lvm")]),
            Some(&[
                ("topology.kubernetes.io/region", "region-1"),
                ("topology.kubernetes.io/zone", "pve2"),
            ]),
        )))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        cap.available_capacity,
        107374182400 - (32 << 30) - (2 << 30)
    );
    assert!(cap.maximum_volume_size.unwrap() <= cap.available_capacity);

    create(&e, "pvc-y", Some("pve3")).await;
    let page1 = e
        .svc
        .list_volumes(Request::new(callers::sanity::list_volumes(1, "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page1.entries.len(), 1);
    let page2 = e
        .svc
        .list_volumes(Request::new(callers::sanity::list_volumes(
            5,
            &page1.next_token,
        )))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page2.entries.len(), 1);
    assert!(page2.next_token.is_empty());
    let all: Vec<_> = page1.entries.iter().chain(page2.entries.iter()).collect();
    let published = all
        .iter()
        .find(|e| e.volume.as_ref().unwrap().volume_id == v.volume_id)
        .unwrap();
    assert_eq!(
        published.status.as_ref().unwrap().published_node_ids,
        ["worker-2/112"]
    );
    let err = e
        .svc
        .list_volumes(Request::new(callers::sanity::list_volumes(1, "bogus")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err:?}");

    let g = e
        .svc
        .controller_get_volume(Request::new(callers::health::controller_get_volume(
            &pv_of(&v),
        )))
        .await
        .unwrap()
        .into_inner();
    let cond = g.status.unwrap().volume_condition.unwrap();
    assert!(!cond.abnormal, "{cond:?}");
    e.admin("PUT", "vms/112/lock?value=backup", "").await;
    let g = e
        .svc
        .controller_get_volume(Request::new(callers::health::controller_get_volume(
            &pv_of(&v),
        )))
        .await
        .unwrap()
        .into_inner();
    let cond = g.status.unwrap().volume_condition.unwrap();
    assert!(
        cond.abnormal && cond.message.contains("VM 112 is locked (backup)"),
        "{cond:?}"
    );
    let err = e
        .svc
        .controller_get_volume(Request::new(callers::health::controller_get_volume(
            &pv_id("region-1/pve2/local-lvm/vm-9999-none"),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let val = e
        .svc
        .validate_volume_capabilities(Request::new(callers::sanity::validate_volume_capabilities(
            &pv_of(&v),
        )))
        .await
        .unwrap()
        .into_inner();
    assert!(val.confirmed.is_some());
}

#[tokio::test]
async fn calls_per_operation() {
    let e = env().await;
    e.admin("DELETE", "counters", "").await;
    // Warm the caches as a running controller has them.
    let warm = create(&e, "pvc-warm", Some("pve2")).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&warm, "worker-2/112")))
        .await
        .unwrap();
    let mut n = Vec::new();
    let mut step = |name: &'static str, before: u64, after: u64| n.push((name, after - before));
    let b = e.calls().await;
    let v = create(&e, "pvc-n", Some("pve2")).await;
    step("create", b, e.calls().await);
    let b = e.calls().await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    step("attach", b, e.calls().await);
    let b = e.calls().await;
    e.svc
        .controller_expand_volume(Request::new(expand_req(&v, 2 << 30)))
        .await
        .unwrap();
    step("expand", b, e.calls().await);
    let b = e.calls().await;
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    step("detach", b, e.calls().await);
    let b = e.calls().await;
    e.svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap();
    step("delete", b, e.calls().await);
    eprintln!("CALLS {n:?}");
    // Budgets well under the Go driver's (create ≈5, attach ≈12, detach ≈10, delete ≈6).
    // Delete reads the config of every VM on the volume's node (two here)
    // before a disk is deleted: what cannot be undone is checked with Proxmox.
    let budget = [
        ("create", 3),
        ("attach", 8),
        ("expand", 6),
        ("detach", 8),
        ("delete", 5),
    ];
    for ((name, used), (_, max)) in n.iter().zip(budget) {
        assert!(*used <= max, "{name}: {used} calls > {max}");
    }
}

#[tokio::test]
async fn detached_volumes_expand_through_a_holder_vm() {
    let e = env_with_role("[VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]").await;
    let v = create(&e, "pvc-off", Some("pve2")).await;
    let r = e
        .svc
        .controller_expand_volume(Request::new(expand_req(&v, 3 << 30)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 3 << 30);
    assert!(r.node_expansion_required);
    let vols = e.admin("GET", "volumes", "").await;
    let vol = vols
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["volid"] == "local-lvm:vm-9999-pvc-off")
        .unwrap()
        .clone();
    assert_eq!(vol["size"], 3u64 << 30);
    // The holder VM takes the first VMID above controllerVmID (9999), is
    // stopped, on the volume's node, protected again after its disk left,
    // and holds nothing afterwards.
    let holder = e.admin("GET", "vms/10000", "").await;
    assert_eq!(holder["node"], "pve2");
    assert_eq!(holder["running"], false);
    assert_eq!(holder["config"]["name"], "proxmox-csi-holder-pve2");
    assert_eq!(holder["config"]["protection"], "1", "{holder}");
    assert!(
        holder["config"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("scsi") || k == "scsihw"),
        "{holder}"
    );
    // The volume publishes normally afterwards, at its new size.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    assert!(
        e.vm(112).await["config"]["scsi1"]
            .as_str()
            .unwrap()
            .contains("size=3G")
    );
}

#[tokio::test]
async fn several_regions_and_allow_lists() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let a = pvesim::Sim::new(pvesim::State::from_yaml(CLUSTER).unwrap())
        .plain_http()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let b = pvesim::Sim::new(pvesim::State::from_yaml(CLUSTER).unwrap())
        .plain_http()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let cfg = proxmox_csi_controller::config::CloudConfig::parse(&format!(
        "clusters:\n  - url: {}\n    token_id: kubernetes-csi@pve!csi\n    token_secret: {SECRET}\n    region: region-1\n    allowed_nodes: [pve3]\n  - url: {}\n    token_id: kubernetes-csi@pve!csi\n    token_secret: {SECRET}\n    region: region-2\n    allowed_storages: [nfs]\n",
        a.api_url(),
        b.api_url()
    ))
    .unwrap();
    let svc = proxmox_csi_controller::csi::controller::ControllerService(std::sync::Arc::new(
        proxmox_csi_controller::ctl::Controller::from_config(
            &cfg,
            Duration::from_secs(10),
            Default::default(),
            Duration::from_secs(20),
        )
        .unwrap(),
    ));
    // region-1 may only use pve3, whatever has more room.
    let v = created(
        &svc,
        create_req("pvc-r1", 1 << 30, &[("storage", "local-lvm")], None),
    )
    .await;
    assert_eq!(v.volume_id, "region-1/pve3/local-lvm/vm-9999-pvc-r1");
    // region-2 goes to the second cluster, and only to nfs.
    let mut req = create_req("pvc-r2", 1 << 30, &[("storage", "local-lvm")], None);
    req.accessibility_requirements.as_mut().unwrap().preferred[0]
        .segments
        .insert("topology.kubernetes.io/region".into(), "region-2".into());
    req.accessibility_requirements
        .as_mut()
        .unwrap()
        .requisite
        .clear();
    let err = svc
        .create_volume(Request::new(req.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("not in allowed_storages of region region-2"),
        "{}",
        err.message()
    );
    req.parameters.insert("storage".into(), "nfs".into());
    let v = created(&svc, req).await;
    assert_eq!(v.volume_id, "region-2//nfs/9999/vm-9999-pvc-r2.raw");
    let b_vols: serde_json::Value = reqwest::get(format!("http://{}/pvesim/volumes", b.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        b_vols["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["volid"] == "nfs:9999/vm-9999-pvc-r2.raw")
    );
    let a_vols: serde_json::Value = reqwest::get(format!("http://{}/pvesim/volumes", a.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        a_vols["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["volid"] != "nfs:9999/vm-9999-pvc-r2.raw")
    );
    // An unknown region names the configured ones.
    let mut req = create_req("pvc-r3", 1 << 30, &[("storage", "nfs")], None);
    req.accessibility_requirements.as_mut().unwrap().preferred[0]
        .segments
        .insert("topology.kubernetes.io/region".into(), "region-9".into());
    let err = svc.create_volume(Request::new(req)).await.unwrap_err();
    assert!(err.message().contains("\"region-9\" is not a cluster of the cloud config; configured: [\"region-1\", \"region-2\"]"), "{}", err.message());
}

/// An operator detaches a disk in the Proxmox UI, and attaches another one
/// to a second VM: the controller acts on what Proxmox says, not on what
/// it last did itself.
#[tokio::test]
async fn changes_made_in_proxmox_behind_the_controllers_back() {
    let e = env().await;
    let v = create(&e, "pvc-oob", Some("pve2")).await;
    let ctx = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    // Detached in the UI (a synchronous PUT), then the PV deleted: no
    // refusal from a remembered attachment.
    e.api_write(
        "PUT",
        "/nodes/pve2/qemu/112/config",
        &[("delete", &format!("scsi{}", ctx["lun"]))],
    )
    .await;
    e.svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap();
    assert!(
        e.admin("GET", "volumes", "")
            .await
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["volid"] != "local-lvm:vm-9999-pvc-oob")
    );

    // Attached in the UI to VM 113: the attacher's reconcile sees it, and a
    // publish to VM 112 is refused with the VM that really has it.
    let w = create(&e, "pvc-oob2", Some("pve2")).await;
    e.api_write(
        "PUT",
        "/nodes/pve2/qemu/113/config",
        &[("scsi7", "local-lvm:vm-9999-pvc-oob2,backup=0")],
    )
    .await;
    let listed = e
        .svc
        .list_volumes(Request::new(callers::attacher::list_volumes("")))
        .await
        .unwrap()
        .into_inner();
    let entry = listed
        .entries
        .iter()
        .find(|x| x.volume.as_ref().unwrap().volume_id == w.volume_id)
        .unwrap();
    let published = &entry.status.as_ref().unwrap().published_node_ids;
    assert!(
        published.len() == 1 && published[0].ends_with("113"),
        "{entry:?}"
    );
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&w, "worker-2/112")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("is attached to VM 113"),
        "{}",
        err.message()
    );
    assert!(
        e.vm(112).await["config"]
            .to_string()
            .find("pvc-oob2")
            .is_none(),
        "attached twice"
    );

    // Attached in the UI and deleted before any reconcile: DeleteVolume
    // reads the VMs of the volume's node and refuses.
    let x = create(&e, "pvc-oob3", Some("pve2")).await;
    e.svc
        .list_volumes(Request::new(callers::attacher::list_volumes("")))
        .await
        .unwrap();
    e.api_write(
        "PUT",
        "/nodes/pve2/qemu/113/config",
        &[("scsi8", "local-lvm:vm-9999-pvc-oob3,backup=0")],
    )
    .await;
    let err = e
        .svc
        .delete_volume(Request::new(delete_req(&x)))
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
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["volid"] == "local-lvm:vm-9999-pvc-oob3"),
        "the disk was deleted"
    );
}

#[tokio::test]
async fn unpublish_from_a_protected_worker_names_protection_and_leaves_nothing_pending() {
    // An operator protects worker-3 (Proxmox's `protection: 1`) while a
    // volume is published to it.
    let cluster = CLUSTER.replace(
        "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
        "CSI: [VM.Audit, VM.Config.Disk, VM.Config.Options, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
    );
    let e = env_from(&cluster).await;
    let v = create(&e, "pvc-prot", Some("pve2")).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-3")))
        .await
        .unwrap();
    e.api_write("PUT", "/nodes/pve2/qemu/113/config", &[("protection", "1")])
        .await;

    let err = e
        .svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-3")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    for says in ["VM 113", "protection", "qm set 113 --protection 0"] {
        assert!(err.message().contains(says), "{says:?}: {}", err.message());
    }
    let vm = e.vm(113).await;
    assert!(
        vm["config"]["scsi1"]
            .as_str()
            .is_some_and(|l| l.starts_with("local-lvm:vm-9999-pvc-prot")),
        "the volume stays attached: {vm}"
    );
    assert!(
        vm["pending"].as_object().unwrap().is_empty()
            && vm["pending_delete"].as_object().unwrap().is_empty(),
        "nothing left pending: {vm}"
    );
    assert_eq!(
        vm["config"]["protection"], "1",
        "the operator's flag is kept"
    );

    // A new attach would be a disk the driver could not take off again
    // (nor revert, were its hot-plug to fail): refused as well.
    let other = create(&e, "pvc-prot-2", Some("pve2")).await;
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&other, "worker-3")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("protection"), "{}", err.message());
    let vm = e.vm(113).await;
    assert!(vm["config"].get("scsi2").is_none(), "{vm}");
    assert!(vm["pending"].as_object().unwrap().is_empty(), "{vm}");

    // Cleared by the operator: the retry detaches.
    e.api_write(
        "PUT",
        "/nodes/pve2/qemu/113/config",
        &[("delete", "protection")],
    )
    .await;
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-3")))
        .await
        .unwrap();
    let vm = e.vm(113).await;
    assert!(vm["config"].get("scsi1").is_none(), "{vm}");
    assert!(vm["config"].get("protection").is_none(), "{vm}");
}

#[tokio::test]
async fn go_era_classes_with_ext2_and_ext3_provision_and_publish() {
    // The Go driver formats any fsType its image has a mkfs for; classes
    // with ext3 or ext2 exist (docs/migrating.md).
    let e = env().await;
    for fs in ["ext3", "ext2"] {
        let name = format!("pvc-{fs}");
        let v = e
            .svc
            .create_volume(Request::new(create_req(
                &name,
                1 << 30,
                &[("storage", "local-lvm"), ("csi.storage.k8s.io/fstype", fs)],
                Some("pve2"),
            )))
            .await
            .unwrap_or_else(|s| panic!("{fs}: {s:?}"))
            .into_inner()
            .volume
            .unwrap();
        e.svc
            .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
            .await
            .unwrap_or_else(|s| panic!("{fs}: {s:?}"));
    }
    let err = e
        .svc
        .create_volume(Request::new(create_req(
            "pvc-btrfs",
            1 << 30,
            &[
                ("storage", "local-lvm"),
                ("csi.storage.k8s.io/fstype", "btrfs"),
            ],
            Some("pve2"),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("\"btrfs\" is not supported; allowed: ext4, xfs, ext3, ext2"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn an_old_pv_with_its_class_parameters_in_the_volume_context_publishes() {
    // Go ≤ v0.9 copied the class's parameters into the volume context,
    // `discard` among them with whatever value the class had; Go never read it.
    let e = env().await;
    let mut v = create(&e, "pvc-old", Some("pve2")).await;
    v.volume_context.insert("discard".into(), "true".into());
    let ok = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.publish_context.contains_key("wwn"), "{ok:?}");
    let line = e.vm(112).await["config"]["scsi1"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(line.starts_with("local-lvm:vm-9999-pvc-old"), "{line}");
    // The class's ssd=1 brings discard=on; the context's "true" is left unset.
    assert!(line.contains(",discard=on,"), "{line}");
    assert!(!line.contains("discard=true"), "{line}");
}

/// lsi and pvscsi address a disk by its SCSI target, at LUN 0
/// (qemu-server DriveDevice.pm print_drivedevice_full): the publish context
/// says where the guest finds it.
#[tokio::test]
async fn the_publish_context_gives_the_guests_scsi_address_for_each_controller_type() {
    for (scsihw, slots) in [
        ("pvscsi", [("0", "1"), ("0", "2")]),
        ("lsi", [("0", "1"), ("0", "2")]),
    ] {
        let cluster = CLUSTER.replace(
            "{ vmid: 111, node: pve1, name: worker-1, config: { scsihw: virtio-scsi-pci } }",
            &format!("{{ vmid: 111, node: pve1, name: worker-1, config: {{ scsihw: {scsihw} }} }}"),
        );
        let e = env_from(&cluster).await;
        for (i, (lun, target)) in slots.iter().enumerate() {
            let v = create(&e, &format!("pvc-{scsihw}-{i}"), Some("pve1")).await;
            let ctx = e
                .svc
                .controller_publish_volume(Request::new(publish_req(&v, "worker-1")))
                .await
                .unwrap()
                .into_inner()
                .publish_context;
            assert_eq!(
                (ctx["lun"].as_str(), ctx["target"].as_str()),
                (*lun, *target),
                "{scsihw}: {ctx:?}"
            );
            let config = &e.vm(111).await["config"];
            let key = format!("scsi{target}");
            assert!(
                config[&key]
                    .as_str()
                    .unwrap_or_default()
                    .contains(&v.volume_id.rsplit('/').next().unwrap().to_string()),
                "{scsihw}: {config}"
            );
        }
    }
}
