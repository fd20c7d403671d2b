//! Thick LVM with volume chains (PVE 9's `snapshot-as-volume-chain`),
//! against pvesim: qcow2 volumes as the Go driver makes them since its
//! volume-chain support (`storageFormat: qcow2`, `vm-9999-pvc-….qcow2`), on
//! a shared LVM whose LVs are active only where they were made or taken
//! (pve-storage LVMPlugin.pm alloc_image, activate_volume, list_images,
//! volume_size_info; API2/Storage/Content.pm info).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::{Code, Request};

/// The default lab with a shared thick LVM `san` with volume chains, a
/// shared thick LVM `thick` without, a Go driver's qcow2 volume on `san`,
/// and the copy VMs' privileges.
fn cluster() -> String {
    CLUSTER
        .replace(
            "  - { id: nfs,",
            "  - { id: san, type: lvm, total: 1099511627776, shared: true, snapshot-as-volume-chain: true }\n  \
             - { id: thick, type: lvm, total: 1099511627776, shared: true }\n  - { id: nfs,",
        )
        .replace(
            "volumes:\n",
            "volumes:\n  - { volid: \"san:vm-9999-pvc-go.qcow2\", size: 1073741824, format: qcow2 }\n",
        )
        .replace(
            "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
            &format!("CSI: {COPY_ROLE}"),
        )
}

fn volume_on(volumes: &serde_json::Value, volid: &str) -> Option<serde_json::Value> {
    volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["volid"] == volid)
        .cloned()
}

/// A qcow2 class on a volume chain: the disk is a `.qcow2` LV made on the
/// requested node; attached on another node, where Proxmox answers for it
/// as for a missing volume, it is found through the storage's listing;
/// grown; never copied into a snapshot or clone; deleted.
#[tokio::test]
async fn qcow2_volumes_live_on_a_shared_volume_chain() {
    let e = env_from(&cluster()).await;
    let qcow2 = [("storage", "san"), ("storageFormat", "qcow2")];
    let v = create_in(&e, "pvc-q", &qcow2, Some("pve1")).await;
    assert!(
        v.volume_id.starts_with("region-1//san/vm-9999-pvc-q") && v.volume_id.ends_with(".qcow2"),
        "{}",
        v.volume_id
    );
    let volid = format!("san:{}", v.volume_id.rsplit('/').next().unwrap());
    let listed = volume_on(&e.admin("GET", "volumes", "").await, &volid).unwrap();
    assert_eq!(listed["format"], "qcow2", "{listed}");
    // The provisioner's retry: the same volume.
    let again = create_in(&e, "pvc-q", &qcow2, Some("pve1")).await;
    assert_eq!(again.volume_id, v.volume_id);
    assert_eq!(again.capacity_bytes, 1 << 30);

    // worker-2 runs on pve2, where the LV is not active: Proxmox's info
    // answers "no format" there, the listing has it.
    let info = e
        .api(&format!("nodes/pve2/storage/san/content/{volid}"))
        .await;
    assert!(info.is_null(), "pve2 reads the inactive LV's size: {info}");
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    let cfg = e.vm(112).await;
    let line = cfg["config"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|l| l.as_str())
        .find(|l| l.starts_with(&volid))
        .unwrap_or_else(|| panic!("not attached: {cfg}"))
        .to_string();
    assert!(line.contains("serial="), "{line}");
    e.svc
        .controller_expand_volume(Request::new(expand_req(&v, 2 << 30)))
        .await
        .unwrap();
    let listed = volume_on(&e.admin("GET", "volumes", "").await, &volid).unwrap();
    assert_eq!(listed["size"], 2u64 << 30, "{listed}");

    // Never copied: a snapshot, a clone.
    let err = e
        .svc
        .create_snapshot(Request::new(snap_req("snapshot-q", &v.volume_id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("qcow2") && err.message().contains("thick LVM"),
        "{err:?}"
    );
    let clone = from_source(
        csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
            volume_id: v.volume_id.clone(),
        }),
        "pvc-qc",
        2 << 30,
        &qcow2,
        Some("pve2"),
    );
    let err = e.svc.create_volume(Request::new(clone)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(e.admin("GET", "vms", "").await.as_array().unwrap().len() == 3);

    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2/112")))
        .await
        .unwrap();
    e.svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap();
    assert_eq!(
        volume_on(&e.admin("GET", "volumes", "").await, &volid),
        None
    );
}

/// Thick LVM without volume chains takes raw only: the class is refused
/// with the parameter and the storage option named, nothing allocated.
#[tokio::test]
async fn qcow2_on_thick_lvm_without_volume_chains_is_refused() {
    let e = env_from(&cluster()).await;
    let err = e
        .svc
        .create_volume(Request::new(create_req(
            "pvc-t",
            1 << 30,
            &[("storage", "thick"), ("storageFormat", "qcow2")],
            Some("pve1"),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("storageFormat")
            && err.message().contains("snapshot-as-volume-chain"),
        "{err:?}"
    );
    let volumes = e.admin("GET", "volumes", "").await;
    assert!(
        !volumes.to_string().contains("thick:"),
        "allocated: {volumes}"
    );
}

/// The Go driver's qcow2 volume (`region//san/vm-9999-pvc-go.qcow2`)
/// attaches as it is.
#[tokio::test]
async fn a_go_drivers_qcow2_volume_attaches() {
    let e = env_from(&cluster()).await;
    let go = csi::Volume {
        volume_id: "region-1//san/vm-9999-pvc-go.qcow2".into(),
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    e.svc
        .controller_publish_volume(Request::new(publish_req(&go, "worker-1/111")))
        .await
        .unwrap();
    let cfg = e.vm(111).await;
    assert!(
        cfg["config"].as_object().unwrap().values().any(|l| l
            .as_str()
            .is_some_and(|l| l.starts_with("san:vm-9999-pvc-go.qcow2,"))),
        "{cfg}"
    );
}

/// A raw volume's snapshot on a volume chain is a raw disk: Proxmox would
/// make it qcow2 there, an LV whose size only the node it is active on reads.
#[tokio::test]
async fn a_snapshot_on_a_volume_chain_is_raw() {
    let e = env_from(&cluster()).await;
    let v = create_in(&e, "pvc-r", &[("storage", "san")], Some("pve1")).await;
    assert!(!v.volume_id.ends_with(".qcow2"), "{}", v.volume_id);
    let seen = until_ready(&e, "snapshot-r", &v.volume_id).await;
    let snap = seen.last().unwrap();
    let volumes = e.admin("GET", "volumes", "").await;
    let copies: Vec<&serde_json::Value> = volumes
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["volid"].as_str().unwrap().starts_with("san:vm-1"))
        .collect();
    assert_eq!(copies.len(), 1, "{volumes}");
    assert_eq!(copies[0]["format"], "raw", "{}", copies[0]);
    assert!(
        !copies[0]["volid"].as_str().unwrap().ends_with(".qcow2"),
        "{}",
        copies[0]
    );
    // Restored from it on the other node.
    let restore = from_source(
        csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        }),
        "pvc-rr",
        1 << 30,
        &[("storage", "san")],
        Some("pve2"),
    );
    let restored = until_created(&e, restore).await;
    assert!(
        restored.volume_id.starts_with("region-1//san/"),
        "{}",
        restored.volume_id
    );
}
