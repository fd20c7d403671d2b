//! ZFS replication against pvesim: a holder VM per volume with its jobs,
//! the holder following the pod's node, growth offline, and nothing left
//! after a delete.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use serde_json::Value;
use testkit::requests::created;
use tonic::{Code, Request};

const CLUSTER: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }, { name: pve3 }]
storages:
  - { id: local-zfs, type: zfspool, total: 107374182400 }
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
vms:
  - { vmid: 111, node: pve1, name: worker-1, config: { scsihw: virtio-scsi-pci } }
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci } }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Replicate, VM.Migrate, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
"#;

const PARAMS: &[(&str, &str)] = &[
    ("storage", "local-zfs"),
    ("replicate", "true"),
    ("replicateZones", "pve1,pve2"),
    ("replicateSchedule", "*/5"),
];

async fn jobs(e: &Env) -> Vec<Value> {
    e.api("/cluster/replication")
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn holder_of(v: &csi::Volume) -> u64 {
    let disk = v.volume_id.rsplit('/').next().unwrap();
    disk.split('-').nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn replicated_volume_lives_in_a_holder_that_follows_the_pod() {
    let e = env_from(CLUSTER).await;
    let req = create_req("pvc-r", 1 << 30, PARAMS, Some("pve1"));
    let v = created(&e.svc, req.clone()).await;
    let h = holder_of(&v);
    assert_eq!(v.volume_id, format!("region-1//local-zfs/vm-{h}-pvc-r"));
    let zones: Vec<&str> = v
        .accessible_topology
        .iter()
        .map(|t| t.segments["topology.kubernetes.io/zone"].as_str())
        .collect();
    assert_eq!(zones, ["pve1", "pve2"]);
    let holder = e.vm(h as u32).await;
    assert_eq!(holder["node"], "pve1");
    assert_eq!(holder["running"], false);
    assert_eq!(holder["config"]["name"], "pvc-r");
    assert_eq!(holder["config"]["tags"], "proxmox-csi;csi-replicated");
    assert_eq!(
        holder["config"]["scsi0"],
        format!("local-zfs:vm-{h}-pvc-r,backup=1,replicate=1,size=1G")
    );
    let j = jobs(&e).await;
    assert_eq!(j.len(), 1, "{j:?}");
    assert_eq!(
        (
            j[0]["id"].as_str(),
            j[0]["target"].as_str(),
            j[0]["schedule"].as_str()
        ),
        (Some(format!("{h}-1").as_str()), Some("pve2"), Some("*/5"))
    );
    assert_eq!(j[0]["comment"], "CSI Replication for Persistent Volume");

    // Idempotent: the same volume, one holder, one job.
    let again = created(&e.svc, req).await;
    assert_eq!(again, v);
    assert_eq!(jobs(&e).await.len(), 1);
    let named: Vec<Value> = e
        .admin("GET", "vms", "")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["config"]["name"] == "pvc-r")
        .cloned()
        .collect();
    assert_eq!(named.len(), 1);

    // A pod on pve2: the holder moves there first, then the disk attaches.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap();
    assert_eq!(e.vm(h as u32).await["node"], "pve2");
    let w2 = e.vm(112).await;
    assert!(
        w2["config"]["scsi1"]
            .as_str()
            .unwrap()
            .starts_with(&format!("local-zfs:vm-{h}-pvc-r,")),
        "{w2}"
    );
    // The holder is not an attachment: the volume is on one worker only.
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-1")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("attached to VM 112"),
        "{}",
        err.message()
    );
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2")))
        .await
        .unwrap();
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-1")))
        .await
        .unwrap();
    assert_eq!(e.vm(h as u32).await["node"], "pve1");
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-1")))
        .await
        .unwrap();

    // Offline growth through the holder.
    let grow = expand_req(&v, 2 << 30);
    let grown = e
        .svc
        .controller_expand_volume(Request::new(grow))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 2 << 30);
    assert!(
        e.vm(h as u32).await["config"]["scsi0"]
            .as_str()
            .unwrap()
            .contains("size=2G")
    );

    // Listed with its zone-less handle.
    let listed = e
        .svc
        .list_volumes(Request::new(callers::attacher::list_volumes("")))
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .entries
            .iter()
            .any(|x| x.volume.as_ref().unwrap().volume_id == v.volume_id),
        "{listed:?}"
    );

    // Delete: holder, jobs and disk are gone; a repeat is fine.
    for _ in 0..2 {
        e.svc
            .delete_volume(Request::new(delete_req(&v)))
            .await
            .unwrap();
    }
    assert_eq!(
        e.admin_answer("GET", &format!("vms/{h}"), "").await.0,
        reqwest::StatusCode::NOT_FOUND
    );
    assert!(jobs(&e).await.is_empty());
    let vols = e.admin("GET", "volumes", "").await;
    assert!(
        !vols
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["volid"].as_str().unwrap().contains("pvc-r")),
        "{vols}"
    );
    for w in [111, 112] {
        let vm = e.vm(w).await;
        assert_eq!(vm["pending"], serde_json::json!({}));
        assert!(
            !vm["config"]
                .as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with("unused") || k == "scsi1"),
            "{vm}"
        );
    }
}

#[tokio::test]
async fn replication_parameters_are_checked() {
    let e = env_from(CLUSTER).await;
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![
                ("storage", "local-lvm"),
                ("replicate", "true"),
                ("replicateZones", "pve1,pve2"),
            ],
            "parameters.replicate: storage \"local-lvm\" is a lvmthin storage; replication needs a local zfspool storage",
        ),
        (
            vec![("storage", "local-zfs"), ("replicate", "true")],
            "parameters.replicateZones: is required with replicate=true",
        ),
        (
            vec![
                ("storage", "local-zfs"),
                ("replicate", "true"),
                ("replicateZones", "pve1,pve9"),
            ],
            "parameters.replicateZones: storage \"local-zfs\" is not available on [\"pve9\"]",
        ),
    ];
    for (params, want) in cases {
        let err = e
            .svc
            .create_volume(Request::new(create_req("pvc-x", 1 << 30, &params, None)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().starts_with(want),
            "want {want:?}, got {:?}",
            err.message()
        );
    }

    let e = env_from(&CLUSTER.replace("VM.Replicate, ", "")).await;
    let err = e
        .svc
        .create_volume(Request::new(create_req(
            "pvc-y",
            1 << 30,
            PARAMS,
            Some("pve1"),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("grant VM.Replicate to the CSI role"),
        "{}",
        err.message()
    );
}

/// A volume the Go driver replicated: its holder is untagged, named after
/// the PV, holds the disk on `scsi1` with `replicate=1,backup=1` and Go's
/// LUN-derived WWN (proxmox-csi-plugin pkg/csi/utils.go prepareReplication,
/// createReplication, attachVolume), with one job per other zone
/// (`<holder>-<index>`, "CSI Replication for Persistent Volume").
const GO_CLUSTER_EXTRA: &str = r#"
  - { vmid: 10000, node: pve1, name: pvc-g, running: false, config: { boot: order=scsi0, agent: "0", machine: pc, cores: 1, memory: 512, scsihw: virtio-scsi-single, scsi1: "local-zfs:vm-10000-pvc-g,backup=1,replicate=1,wwn=0x5056432d49443031,size=1G" } }
volumes:
  - { volid: "local-zfs:vm-10000-pvc-g", node: pve1, size: 1073741824 }
"#;

#[tokio::test]
async fn a_go_driver_replicated_volume_is_taken_over_by_its_shape() {
    let cluster = CLUSTER.replacen("\nusers:", &format!("{GO_CLUSTER_EXTRA}users:"), 1);
    let e = env_from(&cluster).await;
    e.api_write(
        "POST",
        "/cluster/replication",
        &[
            ("id", "10000-1"),
            ("type", "local"),
            ("target", "pve2"),
            ("schedule", "*/15"),
            ("comment", "CSI Replication for Persistent Volume"),
        ],
    )
    .await;
    // The handle Go's CreateVolume answered (VolumeSharedID: no zone) and
    // the context its StorageParameters.ToMap rendered.
    let v = csi::Volume {
        volume_id: "region-1//local-zfs/vm-10000-pvc-g".into(),
        capacity_bytes: 1 << 30,
        volume_context: [
            ("storage", "local-zfs"),
            ("backup", "0"),
            ("iothread", "1"),
            ("replicate", "1"),
            ("replicateZones", "pve1,pve2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    // The holder is not an attachment: publishing elsewhere moves it.
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap();
    assert_eq!(e.vm(10000).await["node"], "pve2");
    assert!(
        e.vm(112).await["config"]["scsi1"]
            .as_str()
            .unwrap()
            .starts_with("local-zfs:vm-10000-pvc-g,"),
    );
    let err = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-1")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("attached to VM 112"),
        "{}",
        err.message()
    );
    // After a detach the holder is still known: the next publish moves it back.
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2")))
        .await
        .unwrap();
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-1")))
        .await
        .unwrap();
    assert_eq!(e.vm(10000).await["node"], "pve1");
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-1")))
        .await
        .unwrap();

    // Offline growth goes through the holder's own slot, scsi1.
    e.svc
        .controller_expand_volume(Request::new(expand_req(&v, 2 << 30)))
        .await
        .unwrap();
    let holder = e.vm(10000).await;
    assert!(
        holder["config"]["scsi1"]
            .as_str()
            .unwrap()
            .contains("size=2G"),
        "{holder}"
    );
    assert!(holder["config"].get("scsi0").is_none(), "{holder}");

    let listed = e
        .svc
        .list_volumes(Request::new(callers::attacher::list_volumes("")))
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .entries
            .iter()
            .any(|x| x.volume.as_ref().unwrap().volume_id == v.volume_id),
        "{listed:?}"
    );

    // Delete: the holder, its job and the disk go, as Go's deleteReplication.
    e.svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap();
    assert_eq!(
        e.admin_answer("GET", "vms/10000", "").await.0,
        reqwest::StatusCode::NOT_FOUND
    );
    assert!(jobs(&e).await.is_empty());
    let vols = e.admin("GET", "volumes", "").await;
    assert!(
        !vols
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["volid"].as_str().unwrap().contains("pvc-g")),
        "{vols}"
    );
}

/// An HA-managed holder: Proxmox answers its migration with a `hamigrate`
/// task that ends before the HA manager moves the VM. The publish attaches
/// only once the holder is on the pod's node.
#[tokio::test]
async fn an_ha_managed_holder_is_attached_only_after_the_ha_manager_moved_it() {
    let e = env_from(CLUSTER).await;
    let v = created(&e.svc, create_req("pvc-ha", 1 << 30, PARAMS, Some("pve1"))).await;
    let h = holder_of(&v);
    e.admin("PUT", &format!("vms/{h}/ha"), "").await;
    e.knobs(r#"{"ha_migrate_ms": 1500}"#).await;
    let started = std::time::Instant::now();
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1500),
        "the publish did not wait for the HA manager"
    );
    assert_eq!(e.vm(h as u32).await["node"], "pve2");
    let w2 = e.vm(112).await;
    assert!(
        w2["config"]["scsi1"]
            .as_str()
            .is_some_and(|l| l.starts_with(&format!("local-zfs:vm-{h}-pvc-ha,"))),
        "{w2}"
    );
    // A deadline shorter than the move: Unavailable, naming HA; no second
    // request to the HA manager while it moves the holder.
    e.knobs(r#"{"ha_migrate_ms": 3000}"#).await;
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2")))
        .await
        .unwrap();
    e.admin("DELETE", "counters", "").await;
    let mut req = Request::new(publish_req(&v, "worker-1"));
    req.metadata_mut()
        .insert("grpc-timeout", "1S".parse().unwrap());
    let err = e.svc.controller_publish_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("HA-managed"), "{}", err.message());
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-1")))
        .await
        .unwrap();
    assert_eq!(e.vm(h as u32).await["node"], "pve1");
    let counters = e.admin("GET", "counters", "").await;
    assert_eq!(
        counters["POST /nodes/{node}/qemu/{vmid}/migrate"], 1,
        "{counters}"
    );
}
