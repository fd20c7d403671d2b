//! What a cluster moving from the Go driver brings, against pvesim: its
//! StorageClass values (Go's booleans), `UNSAFEMOUNT=true`, PVs with
//! `spec.csi.readOnly`, VolumeAttributesClass limits of 0. Each with the Go
//! driver's meaning (proxmox-csi-plugin pkg/csi/parameters.go,
//! controller.go ControllerPublishVolume, utils.go updateVolume).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::Request;

fn drive_of(cfg: &serde_json::Value, volume: &str) -> String {
    cfg["config"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|v| v.as_str())
        .find(|v| v.contains(volume))
        .unwrap_or_else(|| panic!("no drive holds {volume}: {cfg}"))
        .to_string()
}

#[tokio::test]
async fn go_booleans_take_gos_meaning_at_attach() {
    let e = env().await;
    // `True` is ParseBool's; `yes` is not, and Go takes it as false.
    let v = create_in(
        &e,
        "pvc-b",
        &[("storage", "local-lvm"), ("ssd", "True"), ("backup", "yes")],
        Some("pve2"),
    )
    .await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    let line = drive_of(&e.vm(112).await, "vm-9999-pvc-b");
    let opts: Vec<&str> = line.split(',').collect();
    assert!(
        opts.contains(&"ssd=1") && opts.contains(&"discard=on") && opts.contains(&"backup=0"),
        "{line}"
    );
}

#[tokio::test]
async fn unsafemount_leaves_backup_to_proxmox() {
    let e = env_with(|mut c| {
        c.unsafe_mount = true;
        c
    })
    .await;
    let v = create(&e, "pvc-u", Some("pve2")).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    let line = drive_of(&e.vm(112).await, "vm-9999-pvc-u");
    assert!(!line.contains("backup="), "{line}");
    assert!(line.contains("iothread=1"), "{line}");
}

#[tokio::test]
async fn a_read_only_pv_attaches_as_the_go_driver_attached_it() {
    let e = env().await;
    let caps = e
        .svc
        .controller_get_capabilities(Request::new(
            callers::identity::controller_get_capabilities(),
        ))
        .await
        .unwrap()
        .into_inner();
    let publish_readonly = csi::controller_service_capability::rpc::Type::PublishReadonly as i32;
    assert!(
        !caps.capabilities.iter().any(|c| matches!(
            &c.r#type,
            Some(csi::controller_service_capability::Type::Rpc(r)) if r.r#type == publish_readonly
        )),
        "PUBLISH_READONLY is not advertised, as by the Go driver: {caps:?}"
    );
    // So the attacher sends readonly=false for a static PV with readOnly,
    // and the disk is attached read-write, which its stage needs.
    let v = create(&e, "pvc-ro", Some("pve2")).await;
    let mut pv = pv_of(&v);
    pv.read_only = true;
    let req = callers::attacher::controller_publish(&pv, "worker-2/112");
    assert!(!req.readonly);
    e.svc
        .controller_publish_volume(Request::new(req))
        .await
        .unwrap();
    let line = drive_of(&e.vm(112).await, "vm-9999-pvc-ro");
    assert!(!line.split(',').any(|o| o == "ro=1"), "{line}");
}

#[tokio::test]
async fn a_class_limit_of_zero_keeps_the_disks_limit() {
    let e = env().await;
    let v = create_in(
        &e,
        "pvc-z",
        &[
            ("storage", "local-lvm"),
            ("diskIOPS", "300"),
            ("diskMBps", "40"),
        ],
        Some("pve2"),
    )
    .await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    e.svc
        .controller_modify_volume(Request::new(callers::resizer::controller_modify(
            &pv_of(&v),
            &[
                ("diskIOPS", "0"),
                ("diskMBps", "80"),
                ("replicateSchedule", "*/5"),
            ],
        )))
        .await
        .unwrap();
    let line = drive_of(&e.vm(112).await, "vm-9999-pvc-z");
    let opts: Vec<&str> = line.split(',').collect();
    assert!(
        opts.contains(&"iops_rd=300")
            && opts.contains(&"iops_wr=300")
            && opts.contains(&"mbps_rd=80"),
        "{line}"
    );
}

/// A static PV on shared storage whose handle names the node it was made
/// on (the Go driver's FAQ writes `region/zone/storage/disk`), used by a VM
/// on another node: the zone is a hint there, as in Go's checkVolume.
#[tokio::test]
async fn a_shared_volume_follows_a_vm_on_another_node_than_its_handles_zone() {
    let cluster = CLUSTER.replace(
        "volumes:\n",
        "volumes:\n  - { volid: \"nfs:vm-9999-pvc-static\", size: 1073741824 }\n",
    );
    let e = env_from(&cluster).await;
    let v = csi::Volume {
        volume_id: "region-1/pve1/nfs/vm-9999-pvc-static".into(),
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    // worker-2 (VM 112) runs on pve2.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    assert!(drive_of(&e.vm(112).await, "vm-9999-pvc-static").starts_with("nfs:vm-9999-pvc-static"));
    // On local storage the zone stays a fact.
    let local = csi::Volume {
        volume_id: "region-1/pve1/local-lvm/vm-9999-pvc-local".into(),
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&local, "worker-2/112")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("local storage of Proxmox node pve1"),
        "{err:?}"
    );
}

/// The Go driver's restore larger than its snapshot, made and never
/// published before the switch: a copy of the snapshot's size whose context
/// asks for more (pkg/csi/controller.go CreateVolume: `resizeRequired`,
/// `resizeSizeBytes`). Its first attach grows the disk, once, and tells the
/// node to grow the filesystem; a value that is no size is ignored.
#[tokio::test]
async fn a_go_restore_not_yet_published_grows_at_its_first_attach() {
    let cluster = CLUSTER.replace(
        "volumes:\n",
        "volumes:\n  - { volid: \"local-lvm:vm-9999-pvc-restored\", node: pve2, size: 1073741824 }\n  - { volid: \"local-lvm:vm-9999-pvc-odd\", node: pve2, size: 1073741824 }\n",
    );
    let e = env_from(&cluster).await;
    let go_restore = |disk: &str, wanted: &str| csi::Volume {
        volume_id: format!("region-1/pve2/local-lvm/{disk}"),
        capacity_bytes: 2 << 30,
        // StorageParameters.ToMap of the class, then the two keys.
        volume_context: [
            ("storage", "local-lvm"),
            ("backup", "0"),
            ("iothread", "1"),
            ("replicate", "0"),
            ("resizeRequired", "true"),
            ("resizeSizeBytes", wanted),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    let size_of = |volumes: &serde_json::Value, volid: &str| {
        volumes
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["volid"] == volid)
            .unwrap()["size"]
            .as_u64()
            .unwrap()
    };
    let restored = go_restore("vm-9999-pvc-restored", "2147483648");
    e.admin("DELETE", "counters", "").await;
    let ctx = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&restored, "worker-2/112")))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(
        ctx.get("resizeRequired").map(String::as_str),
        Some("true"),
        "{ctx:?}"
    );
    let volumes = e.admin("GET", "volumes", "").await;
    assert_eq!(size_of(&volumes, "local-lvm:vm-9999-pvc-restored"), 2 << 30);
    // The attacher's retry: attached and grown already, nothing more.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&restored, "worker-2/112")))
        .await
        .unwrap();
    let counters = e.admin("GET", "counters", "").await;
    let resizes: u64 = counters
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.contains("/resize"))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    assert_eq!(resizes, 1, "{counters}");

    let odd = go_restore("vm-9999-pvc-odd", "2Gi");
    e.svc
        .controller_publish_volume(Request::new(publish_req(&odd, "worker-2/112")))
        .await
        .unwrap();
    let volumes = e.admin("GET", "volumes", "").await;
    assert_eq!(size_of(&volumes, "local-lvm:vm-9999-pvc-odd"), 1 << 30);
}

/// A Kubernetes node without a zone label (Go driver PR #641): its
/// requirement names the region alone; a volume on shared storage gets the
/// region alone as its topology and attaches to it.
#[tokio::test]
async fn a_node_without_a_zone_label_gets_shared_volumes() {
    let cluster = CLUSTER.replace(
        "  - { id: nfs,",
        "  - { id: ceph, type: rbd, total: 1099511627776, shared: true }\n  - { id: nfs,",
    );
    let e = env_from(&cluster).await;
    let v = create_in(&e, "pvc-nz", &[("storage", "ceph")], None).await;
    assert_eq!(v.accessible_topology.len(), 1, "{v:?}");
    assert_eq!(
        v.accessible_topology[0].segments,
        [(
            "topology.kubernetes.io/region".to_string(),
            "region-1".to_string()
        )]
        .into()
    );
    assert!(
        v.volume_id.starts_with("region-1//ceph/"),
        "{}",
        v.volume_id
    );
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
}
