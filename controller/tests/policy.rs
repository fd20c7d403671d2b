//! Locked-down clusters: privileges Proxmox checks inside its workers, and
//! datacenter.cfg tag policies (pvesim models both as qemu-server 9.2 does).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::{Code, Request};

/// Worker-2 holds a volume made before the ACL was narrowed: the documented
/// CSI role on `/`, and on local-lvm a narrower one without
/// Datastore.AllocateSpace, which replaces it there.
const NARROWED: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }]
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
vms:
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci, scsi1: "local-lvm:vm-9999-pvc-pre,size=1G" } }
volumes:
  - { volid: "local-lvm:vm-9999-pvc-pre", node: pve2, size: 1073741824 }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
  CSI-NOSPACE: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
  - { path: /storage/local-lvm, roles: [CSI-NOSPACE], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
"#;

#[tokio::test]
async fn a_privilege_refused_inside_a_task_is_failed_precondition_and_not_retried() {
    let e = env_from(NARROWED).await;
    e.admin("DELETE", "counters", "").await;

    let v = pv_id("region-1/pve2/local-lvm/vm-9999-pvc-pre");
    let err = e
        .svc
        .controller_expand_volume(Request::new(callers::resizer::controller_expand(
            &v,
            2 << 30,
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("lacks Datastore.AllocateSpace on /storage/local-lvm"),
        "{}",
        err.message()
    );
    // Proxmox's worker refused it once: one resize, no retry, the disk as it was.
    let counters = e.admin("GET", "counters", "").await;
    assert_eq!(
        counters["PUT /nodes/{node}/qemu/{vmid}/resize"], 1,
        "{counters}"
    );
    assert_eq!(
        e.vm(112).await["config"]["scsi1"],
        "local-lvm:vm-9999-pvc-pre,size=1G"
    );
}

/// The default lab with the documented copy role (no Sys.Modify on `/`),
/// a datacenter.cfg tag `policy` (YAML lines) and `vms` added.
fn tag_policy(policy: &str, vms: &str) -> String {
    let cluster = CLUSTER.replace(
        "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
        &format!("CSI: {COPY_ROLE}"),
    );
    let cluster = cluster.replace("volumes:\n", &format!("{vms}volumes:\n"));
    format!("{cluster}{policy}\n")
}

/// CreateSnapshot of a new volume on worker-2: the answer.
async fn snapshot(e: &Env) -> Result<proxmox_csi_proto::csi::v1::Snapshot, tonic::Status> {
    let v = create(e, "pvc-a", Some("pve2")).await;
    e.admin("DELETE", "counters", "").await;
    e.svc
        .create_snapshot(Request::new(snap_req("snapshot-1", &v.volume_id)))
        .await
        .map(|r| r.into_inner().snapshot.unwrap())
}

fn vmids(state: &serde_json::Value) -> Vec<u64> {
    state
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["vmid"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn copy_vms_are_made_under_a_tag_policy_that_lists_the_driver_tags() {
    // qemu-server 9.2's create_vm refuses any tags under such a policy (it
    // checks them against `{}`): the VM is made, then tagged by an update.
    let e = env_from(&tag_policy(
        "user-tag-access: { user-allow: list, user-allow-list: [proxmox-csi, csi-snapshot] }",
        "",
    ))
    .await;
    let snap = snapshot(&e).await.unwrap();
    let vmid = copy_vmid(&snap.snapshot_id);
    let vm = e.vm(vmid).await;
    assert_eq!(vm["config"]["tags"], "proxmox-csi;csi-snapshot", "{vm}");
    assert_eq!(vm["config"]["protection"], "1", "{vm}");
    assert_eq!(vm["config"]["name"], "snapshot-1", "{vm}");
    let counters = e.admin("GET", "counters", "").await;
    assert_eq!(counters["POST /nodes/{node}/qemu"], 2, "{counters}");
}

#[tokio::test]
async fn a_tag_policy_that_refuses_the_driver_tags_fails_once_naming_it_and_leaves_no_vm() {
    for policy in [
        // No guest carries the driver's tags yet.
        "user-tag-access: { user-allow: existing }",
        "user-tag-access: { user-allow: none }",
        "registered-tags: [proxmox-csi]",
    ] {
        let e = env_from(&tag_policy(policy, "")).await;
        let before = vmids(&e.admin("GET", "vms", "").await);
        let err = snapshot(&e).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{policy}: {err:?}");
        assert!(
            err.message()
                .contains("tag policy (datacenter.cfg user-tag-access or registered-tags)")
                && err.message().contains("Sys.Modify for modifying tag"),
            "{policy}: {}",
            err.message()
        );
        assert_eq!(
            vmids(&e.admin("GET", "vms", "").await),
            before,
            "{policy}: a VM was left"
        );
    }
}

#[tokio::test]
async fn existing_driver_tags_admit_new_copy_vms_under_the_existing_policy() {
    // A copy VM of an earlier version: its tags exist, its name tag is
    // the old per-volume one, which new VMs no longer need.
    let old = "  - { vmid: 300, node: pve1, name: snapshot-old, config: { tags: \"proxmox-csi;csi-snapshot;csi-name.snapshot-old\", protection: \"1\" } }\n";
    let e = env_from(&tag_policy(
        "user-tag-access: { user-allow: existing }",
        old,
    ))
    .await;
    let snap = snapshot(&e).await.unwrap();
    let vmid = copy_vmid(&snap.snapshot_id);
    assert_eq!(
        e.vm(vmid).await["config"]["tags"],
        "proxmox-csi;csi-snapshot"
    );
}

/// Shared RBD through the kernel client: worker-1 on pve1, worker-2 on pve2.
const KRBD: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }, { name: pve3 }]
storages:
  - { id: ceph, type: rbd, shared: true, krbd: true, total: 1099511627776 }
vms:
  - { vmid: 111, node: pve1, name: worker-1, config: { scsihw: virtio-scsi-pci } }
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci } }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
"#;

/// A krbd image stays mapped on every node a VM took it on (Proxmox
/// unmaps on VM stop or where the image is freed, never on hot-unplug), and
/// `rbd rm` fails while another node maps it: a volume that moved between
/// nodes is still deleted, by the controller that moved it and by one that
/// knows nothing of it (a restart).
#[tokio::test]
async fn a_krbd_volume_that_moved_between_nodes_is_deleted() {
    for restarted in [false, true] {
        let e = env_from(KRBD).await;
        let v = create_in(&e, "pvc-moved", &[("storage", "ceph")], None).await;
        for worker in ["worker-2", "worker-1"] {
            e.svc
                .controller_publish_volume(Request::new(publish_req(&v, worker)))
                .await
                .unwrap();
            e.svc
                .controller_unpublish_volume(Request::new(unpublish_req(&v, worker)))
                .await
                .unwrap();
        }
        e.admin("DELETE", "counters", "").await;
        let svc = if restarted {
            proxmox_csi_controller::csi::controller::ControllerService(std::sync::Arc::new(
                controller_on(&e),
            ))
        } else {
            e.svc.clone()
        };
        svc.delete_volume(Request::new(delete_req(&v)))
            .await
            .unwrap();
        let volumes = e.admin("GET", "volumes", "").await;
        assert!(
            !volumes.to_string().contains("pvc-moved"),
            "restarted {restarted}: the image is still there: {volumes}"
        );
        let deletes = e.admin("GET", "counters", "").await
            ["DELETE /nodes/{node}/storage/{storage}/content/{volume}"]
            .as_u64()
            .unwrap();
        // Mapped on pve2 and pve1: the first free unmaps one, the next removes it.
        assert!(
            deletes <= if restarted { 3 } else { 2 },
            "restarted {restarted}: {deletes} deletes"
        );
    }
}

#[tokio::test]
async fn a_krbd_volume_is_deleted_on_the_node_that_last_held_it() {
    let e = env_from(KRBD).await;
    let v = create_in(&e, "pvc-held", &[("storage", "ceph")], None).await;
    e.svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap();
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2")))
        .await
        .unwrap();
    e.admin("DELETE", "counters", "").await;
    e.svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap();
    let counters = e.admin("GET", "counters", "").await;
    assert_eq!(
        counters["DELETE /nodes/{node}/storage/{storage}/content/{volume}"], 1,
        "{counters}"
    );
    assert!(
        !e.admin("GET", "volumes", "")
            .await
            .to_string()
            .contains("pvc-held")
    );
}

/// docs/proxmox-role.md's narrowed ACLs: the minimal role on the storage
/// and on the worker VM only, nothing on `/`.
const NARROWED_ROLE: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }]
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
  - { id: other, type: lvmthin, total: 107374182400 }
vms:
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci } }
  - { vmid: 300, node: pve2, name: someone-else, config: { scsihw: virtio-scsi-pci } }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /storage/local-lvm, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
  - { path: /vms/112, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
"#;

#[tokio::test]
async fn the_documented_narrowed_acls_run_a_volumes_whole_life() {
    whole_life(NARROWED_ROLE).await;
}

/// docs/support.md's oldest Proxmox VE: the same life on 8.4, whose
/// qemu-server (8.4.10, Proxmox 8's last) waits and answers otherwise on
/// an unplug.
#[tokio::test]
async fn a_volumes_whole_life_runs_on_proxmox_ve_8() {
    whole_life(&format!(
        "version: 8.4.14\nqemu-server: 8.4.10\n{NARROWED_ROLE}"
    ))
    .await;
}

/// Create, publish, expand, unpublish and delete under `cluster`; a storage
/// outside its ACLs is refused with what to grant.
async fn whole_life(cluster: &str) {
    let e = env_from(cluster).await;
    let v = create_in(&e, "pvc-narrow", &[("storage", "local-lvm")], Some("pve2")).await;
    let pc = e
        .svc
        .controller_publish_volume(Request::new(publish_req(&v, "worker-2")))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let slot = format!("scsi{}", pc["lun"]);
    assert!(
        e.vm(112).await["config"][&slot]
            .as_str()
            .is_some_and(|l| l.starts_with("local-lvm:vm-9999-pvc-narrow")),
        "{pc:?}"
    );
    e.svc
        .controller_expand_volume(Request::new(expand_req(&v, 2 << 30)))
        .await
        .unwrap();
    e.svc
        .controller_unpublish_volume(Request::new(unpublish_req(&v, "worker-2")))
        .await
        .unwrap();
    e.svc
        .delete_volume(Request::new(delete_req(&v)))
        .await
        .unwrap();
    assert!(
        !e.admin("GET", "volumes", "")
            .await
            .to_string()
            .contains("pvc-narrow"),
        "the volume is still there"
    );
    // A storage outside the ACLs is refused with what to grant.
    let err = e
        .svc
        .create_volume(Request::new(create_req(
            "pvc-other",
            1 << 30,
            &[("storage", "other")],
            Some("pve2"),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains("parameters.storage: storage \"other\""),
        "{}",
        err.message()
    );
}

/// A clone on krbd that was attached on other nodes: destroying its copy VM
/// cannot free the image (still mapped elsewhere) and Proxmox only warns;
/// the disk left is deleted through the nodes that map it.
#[tokio::test]
async fn a_krbd_clone_leaves_no_image_behind_its_copy_vm() {
    let cluster = KRBD.replace(
        "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
        &format!("CSI: {COPY_ROLE}"),
    );
    let e = env_from(&cluster).await;
    let src = create_in(&e, "pvc-src", &[("storage", "ceph")], None).await;
    let clone = until_created(
        &e,
        from_source(
            proxmox_csi_proto::csi::v1::volume_content_source::Type::Volume(
                proxmox_csi_proto::csi::v1::volume_content_source::VolumeSource {
                    volume_id: src.volume_id.clone(),
                },
            ),
            "pvc-clone",
            1 << 30,
            &[("storage", "ceph")],
            None,
        ),
    )
    .await;
    for worker in ["worker-2", "worker-1"] {
        e.svc
            .controller_publish_volume(Request::new(publish_req(&clone, worker)))
            .await
            .unwrap();
        e.svc
            .controller_unpublish_volume(Request::new(unpublish_req(&clone, worker)))
            .await
            .unwrap();
    }
    let disk = clone.volume_id.rsplit('/').next().unwrap().to_string();
    e.svc
        .delete_volume(Request::new(delete_req(&clone)))
        .await
        .unwrap();
    let volumes = e.admin("GET", "volumes", "").await;
    assert!(
        !volumes.to_string().contains(&disk),
        "the image was left: {volumes}"
    );
    let vms = e.admin("GET", "vms", "").await;
    assert!(
        !vms.as_array()
            .unwrap()
            .iter()
            .any(|v| v["config"]["name"] == "pvc-clone"),
        "the copy VM was left"
    );
}
