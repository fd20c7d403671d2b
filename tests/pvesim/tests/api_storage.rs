//! One test per Proxmox semantic pvesim promises (see proxmox-api.md §12):
//! storage endpoints: allocation, the storage lock, offline storages,
//! snapshots and imports (pve-storage).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use common::{Client, TOKEN, start};
use serde_json::json;

#[tokio::test]
async fn allocation_follows_the_storage_plugins() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let alloc = |storage: &'static str, name: &'static str, size: &'static str| {
        let c = c.clone();
        async move {
            c.call(
                "POST",
                &format!("/nodes/pve2/storage/{storage}/content"),
                &[("filename", name), ("vmid", "9999"), ("size", size)],
            )
            .await
        }
    };
    assert_eq!(
        alloc("local-lvm", "vm-9999-pvc-a", "1G").await.ok(),
        json!("local-lvm:vm-9999-pvc-a")
    );
    // Plain digits are KiB; lvm-thin rounds up to 4 MiB.
    assert_eq!(
        alloc("local-lvm", "vm-9999-pvc-b", "1025").await.ok(),
        json!("local-lvm:vm-9999-pvc-b")
    );
    let v = c
        .get(
            "/nodes/pve2/storage/local-lvm/content/local-lvm:vm-9999-pvc-b",
            &[],
        )
        .await
        .ok();
    assert_eq!(v["size"], 4 << 20);
    let r = alloc("local-lvm", "pvc-c", "1G").await;
    assert_eq!(r.reason, "illegal name 'pvc-c' - should be 'vm-9999-*'");
    let r = alloc("local-lvm", "vm-9999-pvc-a", "1G").await;
    assert!(
        r.reason
            .contains("Logical Volume \"vm-9999-pvc-a\" already exists"),
        "{r:?}"
    );
    assert_eq!(
        alloc("nfs", "vm-9999-pvc-d.raw", "2G").await.ok(),
        json!("nfs:9999/vm-9999-pvc-d.raw")
    );
    assert_eq!(
        alloc("nfs", "vm-9999-pvc-e", "2G").await.reason,
        "unable to parse volume filename 'vm-9999-pvc-e'"
    );
    let r = alloc("local-zfs", "vm-9999-pvc-f", "1G").await;
    assert_eq!(r.status, 200);
    let r = c
        .call(
            "POST",
            "/nodes/pve3/storage/local-zfs/content",
            &[("filename", "vm-9999-x"), ("vmid", "9999"), ("size", "1G")],
        )
        .await;
    assert_eq!(
        r.reason,
        "storage 'local-zfs' is not available on node 'pve3'"
    );
    // Existence check of one volume, without listing the storage.
    let r = c
        .get("/nodes/pve2/storage/local-lvm/content/vm-9999-nope", &[])
        .await;
    // pve-storage LVMPlugin.pm volume_size_info: "can't get size of '$path'" and lvs' last stderr line.
    assert_eq!(
        (r.status, r.reason.as_str()),
        (
            500,
            "can't get size of '/dev/pve/vm-9999-nope':   Failed to find logical volume \"pve/vm-9999-nope\""
        )
    );
    let r = c
        .get(
            "/nodes/pve2/storage/local-lvm/content/nfs:vm-9999-pvc-a",
            &[],
        )
        .await;
    assert_eq!(
        r.body["errors"]["volume"],
        "storage ID mismatch (nfs != local-lvm)\n"
    );
    // Shared storage holds one volume for every node.
    let v = c
        .get("/nodes/pve1/storage/nfs/content", &[("vmid", "9999")])
        .await
        .ok();
    assert_eq!(v[0]["volid"], "nfs:9999/vm-9999-pvc-d.raw");
    // Delete is a task; a missing lvm-thin volume still ends OK.
    for _ in 0..2 {
        let upid = c
            .call(
                "DELETE",
                "/nodes/pve2/storage/local-lvm/content/local-lvm:vm-9999-pvc-a",
                &[],
            )
            .await
            .ok();
        let upid = upid.as_str().unwrap().to_string();
        assert!(upid.contains(":imgdel:9999@local-lvm:"), "{upid}");
        assert_eq!(c.wait_task(&upid).await["exitstatus"], "OK");
    }
}

#[tokio::test]
async fn allocations_wait_for_the_storage_lock() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.knobs(r#"{"lock_timeout_ms": 300}"#).await;
    c.call(
        "POST",
        "/pvesim/storages/local-lvm/hold-lock",
        &[("seconds", "1")],
    )
    .await;
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-l"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (
            500,
            "can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout"
        )
    );
    c.call(
        "POST",
        "/pvesim/storages/nfs/hold-lock",
        &[("seconds", "1")],
    )
    .await;
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/nfs/content",
            &[
                ("filename", "vm-9999-pvc-l.raw"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await;
    assert_eq!(
        r.reason,
        "cfs-lock 'storage-nfs' error: got lock request timeout"
    );
    // Once free, allocations of different names both succeed.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        c.call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-l"),
                ("vmid", "9999"),
                ("size", "1G")
            ]
        )
        .await
        .status,
        200
    );
}

/// An NFS storage whose server stops answering: inactive in the listing,
/// and every activation fails as pve-storage's activate_storage does.
#[tokio::test]
async fn an_nfs_storage_can_go_offline() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    const ALLOC: &[(&str, &str)] = &[
        ("filename", "vm-9999-pvc-n.raw"),
        ("vmid", "9999"),
        ("size", "1G"),
    ];
    let alloc = || c.call("POST", "/nodes/pve2/storage/nfs/content", ALLOC);
    c.call("PUT", "/pvesim/storages/nfs/online?value=0", &[])
        .await;
    let list = c.get("/nodes/pve2/storage", &[]).await.ok();
    let nfs = list
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["storage"] == "nfs")
        .unwrap()
        .clone();
    assert_eq!(
        (nfs["active"].clone(), nfs["total"].clone()),
        (json!(0), json!(0))
    );
    let r = alloc().await;
    assert_eq!(r.status, 500);
    assert_eq!(r.reason, "storage 'nfs' is not online");
    // A storage without a connection check cannot be offline.
    c.call("PUT", "/pvesim/storages/local-lvm/online?value=0", &[])
        .await;
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-l"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await;
    assert_eq!(r.status, 200);
    c.call("PUT", "/pvesim/storages/nfs/online?value=1", &[])
        .await;
    assert_eq!(alloc().await.status, 200);
}

#[tokio::test]
async fn snapshots_and_imports() {
    let sim = start().await;
    let admin = Client::new(&sim, common::ADMIN);
    // lvm-thin can snapshot: VM 112's root disk is there.
    let upid = admin
        .call(
            "POST",
            "/nodes/pve2/qemu/112/snapshot",
            &[("snapname", "s1")],
        )
        .await
        .ok();
    assert_eq!(
        admin.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let list = admin.get("/nodes/pve2/qemu/112/snapshot", &[]).await.ok();
    assert_eq!(list[0]["name"], "s1");
    assert_eq!(admin.config("pve2", 112, true).await["parent"], "s1");
    // A raw file on NFS cannot.
    admin
        .call(
            "POST",
            "/nodes/pve2/storage/nfs/content",
            &[
                ("filename", "vm-112-disk-9.raw"),
                ("vmid", "112"),
                ("size", "1G"),
            ],
        )
        .await
        .ok();
    admin
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/config",
            &[("scsi3", "nfs:112/vm-112-disk-9.raw")],
        )
        .await
        .ok();
    let r = admin
        .call(
            "POST",
            "/nodes/pve2/qemu/112/snapshot",
            &[("snapname", "s2")],
        )
        .await;
    assert_eq!(r.reason, "snapshot feature for 'scsi3' is not available");
    let upid = admin
        .call("DELETE", "/nodes/pve2/qemu/112/snapshot/s1", &[])
        .await
        .ok();
    assert_eq!(
        admin.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    assert!(
        admin
            .config("pve2", 112, true)
            .await
            .get("parent")
            .is_none()
    );
    // import-from copies a volume into a new disk of the VM.
    let upid = admin
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi4", "local-lvm:0,import-from=nfs:112/vm-112-disk-9.raw")],
        )
        .await
        .ok();
    assert_eq!(
        admin.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let cfg = admin.config("pve2", 112, true).await;
    // vm-112-disk-1 exists already: the next free name is taken.
    assert_eq!(cfg["scsi4"], "local-lvm:vm-112-disk-2,size=1G", "{cfg}");
}
