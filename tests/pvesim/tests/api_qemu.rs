//! One test per Proxmox semantic pvesim promises (see proxmox-api.md §12):
//! VM config and life cycle: digest and lock, stopped VMs, resize, create,
//! move and destroy (qemu-server).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::{Duration, Instant};

use common::{Client, TOKEN, attach, start};

#[tokio::test]
async fn digest_lock_and_lock_timeout() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("name", "w"), ("digest", "0000")],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (500, "checksum mismatch (file change by other user?)")
    );

    c.call("PUT", "/pvesim/vms/112/lock", &[("value", "backup")])
        .await;
    let r = c
        .call("POST", "/nodes/pve2/qemu/112/config", &[("name", "w")])
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (500, "VM is locked (backup)")
    );
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("name", "w"), ("skiplock", "1")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["skiplock"],
        "Only root may use this option."
    );
    c.call("DELETE", "/pvesim/vms/112/lock", &[]).await;

    // Another writer holds the config lock longer than we wait.
    assert_eq!(
        sim.ctx.cluster().knobs.lock_timeout_ms,
        10_000,
        "Proxmox waits 10 s"
    );
    c.knobs(r#"{"lock_timeout_ms": 300}"#).await;
    c.call("POST", "/pvesim/vms/112/hold-lock", &[("seconds", "1")])
        .await;
    let started = Instant::now();
    let r = c
        .call("PUT", "/nodes/pve2/qemu/112/config", &[("name", "w")])
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (
            500,
            "can't lock file '/var/lock/qemu-server/lock-112.conf' - got timeout"
        )
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    // POST returns a UPID; the task fails with the same text.
    c.call("POST", "/pvesim/vms/112/hold-lock", &[("seconds", "1")])
        .await;
    let upid = c
        .call("POST", "/nodes/pve2/qemu/112/config", &[("name", "w")])
        .await
        .ok();
    let st = c.wait_task(upid.as_str().unwrap()).await;
    assert_eq!(
        st["exitstatus"],
        "can't lock file '/var/lock/qemu-server/lock-112.conf' - got timeout"
    );
}

#[tokio::test]
async fn a_stopped_vm_takes_changes_at_once() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.call(
        "POST",
        "/nodes/pve1/storage/local-lvm/content",
        &[
            ("filename", "vm-9999-pvc-s"),
            ("vmid", "9999"),
            ("size", "2G"),
        ],
    )
    .await
    .ok();
    let upid = c
        .call(
            "POST",
            "/nodes/pve1/qemu/111/config",
            &[("scsi1", "local-lvm:vm-9999-pvc-s,backup=0")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    assert_eq!(
        c.config("pve1", 111, true).await["scsi1"],
        "local-lvm:vm-9999-pvc-s,backup=0,size=2G"
    );
    // The VM is on pve1, not pve2.
    let r = c.get("/nodes/pve2/qemu/111/config", &[]).await;
    assert_eq!(
        r.reason,
        "Configuration file 'nodes/pve2/qemu-server/111.conf' does not exist"
    );
}

#[tokio::test]
async fn resize_grows_and_never_shrinks() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.call(
        "POST",
        "/nodes/pve2/storage/local-lvm/content",
        &[
            ("filename", "vm-9999-pvc-r"),
            ("vmid", "9999"),
            ("size", "1G"),
        ],
    )
    .await
    .ok();
    attach(&c, "scsi1", "local-lvm:vm-9999-pvc-r").await;
    let upid = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/resize",
            &[("disk", "scsi1"), ("size", "+1G")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    assert!(
        c.config("pve2", 112, true).await["scsi1"]
            .as_str()
            .unwrap()
            .contains("size=2G")
    );
    let v = c
        .get("/nodes/pve2/storage/local-lvm/content/vm-9999-pvc-r", &[])
        .await
        .ok();
    assert_eq!(v["size"], 2u64 << 30);
    let upid = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/resize",
            &[("disk", "scsi1"), ("size", "1G")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "shrinking disks is not supported"
    );
    let upid = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/resize",
            &[("disk", "scsi7"), ("size", "3G")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "disk 'scsi7' does not exist"
    );
}

#[tokio::test]
async fn vms_are_created_moved_and_destroyed() {
    let sim = start().await;
    let admin = Client::new(&sim, common::ADMIN);
    let upid = admin
        .call(
            "POST",
            "/nodes/pve1/qemu",
            &[("vmid", "9999"), ("name", "csi-holder")],
        )
        .await
        .ok();
    assert_eq!(
        admin.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let r = admin
        .call("POST", "/nodes/pve2/qemu", &[("vmid", "9999")])
        .await;
    // qemu-server create_vm wraps pve-cluster check_vmid_unused's text.
    assert_eq!(
        r.reason,
        "unable to create VM 9999 - VM 9999 already exists on node 'pve1'"
    );
    // Storage move: the source stays as unused0.
    admin
        .call(
            "POST",
            "/nodes/pve1/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-m"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await
        .ok();
    let upid = admin
        .call(
            "POST",
            "/nodes/pve1/qemu/9999/config",
            &[("scsi1", "local-lvm:vm-9999-pvc-m")],
        )
        .await
        .ok();
    admin.wait_task(upid.as_str().unwrap()).await;
    let upid = admin
        .call(
            "POST",
            "/nodes/pve1/qemu/9999/move_disk",
            &[("disk", "scsi1"), ("storage", "nfs")],
        )
        .await
        .ok();
    assert_eq!(
        admin.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let cfg = admin.config("pve1", 9999, true).await;
    assert!(
        cfg["scsi1"]
            .as_str()
            .unwrap()
            .starts_with("nfs:9999/vm-9999-pvc-m.raw"),
        "{cfg}"
    );
    assert_eq!(cfg["unused0"], "local-lvm:vm-9999-pvc-m");
    let r = admin
        .call(
            "POST",
            "/nodes/pve1/qemu/9999/move_disk",
            &[("disk", "scsi1")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["storage"],
        "both 'storage' and 'target-vmid' missing, either needs to be set"
    );
    // Reassign to another VM on the same node renames the volume.
    let upid = admin
        .call(
            "POST",
            "/nodes/pve1/qemu/9999/move_disk",
            &[
                ("disk", "scsi1"),
                ("target-vmid", "111"),
                ("target-disk", "scsi5"),
            ],
        )
        .await
        .ok();
    let st = admin.wait_task(upid.as_str().unwrap()).await;
    assert_eq!(st["exitstatus"], "OK", "{st}");
    assert!(
        st["upid"]
            .as_str()
            .unwrap()
            .contains(":qmmove:9999-scsi1>111-scsi5:")
    );
    assert!(
        admin.config("pve1", 111, true).await["scsi5"]
            .as_str()
            .unwrap()
            .starts_with("nfs:111/vm-111-disk-0.raw")
    );
    // Offline migration carries local disks along.
    let upid = admin
        .call(
            "POST",
            "/nodes/pve1/qemu/111/migrate",
            &[("target", "pve3")],
        )
        .await
        .ok();
    assert_eq!(
        admin.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    assert_eq!(
        admin
            .get("/nodes/pve3/storage/local-lvm/content/vm-111-disk-0", &[])
            .await
            .status,
        200
    );
    assert_eq!(
        admin.get("/nodes/pve3/qemu/111/config", &[]).await.status,
        200
    );
    // Destroy frees every owned volume, unused ones included.
    let upid = admin
        .call("DELETE", "/nodes/pve1/qemu/9999", &[])
        .await
        .ok();
    assert_eq!(
        admin.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    assert_eq!(
        admin
            .get("/nodes/pve1/storage/local-lvm/content/vm-9999-pvc-m", &[])
            .await
            .status,
        500
    );
    let r = admin.call("DELETE", "/nodes/pve2/qemu/112", &[]).await;
    assert_eq!(r.reason, "VM 112 is running - destroy failed");
}
