//! One test per Proxmox semantic pvesim promises (see proxmox-api.md §12):
//! cluster endpoints: storage replication jobs (`/cluster/replication`).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use common::{Client, start};

#[tokio::test]
async fn replication_jobs_for_local_zfs() {
    let sim = start().await;
    let admin = Client::new(&sim, common::ADMIN);
    // A ZFS disk owned by the guest makes it replicatable.
    admin
        .call(
            "POST",
            "/nodes/pve2/storage/local-zfs/content",
            &[
                ("filename", "vm-112-disk-5"),
                ("vmid", "112"),
                ("size", "1G"),
            ],
        )
        .await
        .ok();
    let r = admin
        .call(
            "POST",
            "/cluster/replication",
            &[("id", "112-0"), ("type", "local"), ("target", "pve1")],
        )
        .await;
    assert_eq!(
        r.reason, "missing replicate feature on volume 'local-lvm:vm-112-disk-0'",
        "lvm-thin root disk"
    );
    let upid = admin
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi0", "local-zfs:vm-112-disk-5")],
        )
        .await
        .ok();
    admin.wait_task(upid.as_str().unwrap()).await;
    // The running VM keeps the old root disk until a restart; stop it to apply.
    admin
        .call("PUT", "/pvesim/vms/112/running", &[("value", "0")])
        .await;
    admin
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/config",
            &[("description", "apply")],
        )
        .await
        .ok();
    assert!(
        admin.config("pve2", 112, true).await["scsi0"]
            .as_str()
            .unwrap()
            .starts_with("local-zfs:")
    );
    let r = admin
        .call(
            "POST",
            "/cluster/replication",
            &[("id", "112-0"), ("type", "local"), ("target", "pve2")],
        )
        .await;
    assert_eq!(r.reason, "Source and target must not be identical");
    admin
        .call(
            "POST",
            "/cluster/replication",
            &[
                ("id", "112-0"),
                ("type", "local"),
                ("target", "pve1"),
                ("schedule", "*/15"),
            ],
        )
        .await
        .ok();
    let r = admin
        .call(
            "POST",
            "/cluster/replication",
            &[("id", "112-0"), ("type", "local"), ("target", "pve1")],
        )
        .await;
    assert_eq!(r.reason, "replication job '112-0' already exists");
    let jobs = admin
        .get("/nodes/pve2/replication", &[("guest", "112")])
        .await
        .ok();
    assert_eq!(jobs[0]["target"], "pve1");
    let r = admin.call("DELETE", "/nodes/pve2/qemu/112", &[]).await;
    assert_eq!(
        r.reason,
        "There is a replication job '112-0' for guest '112' - Please remove that first."
    );
    let job = admin.get("/cluster/replication/112-0", &[]).await.ok();
    let r = admin
        .call(
            "PUT",
            "/cluster/replication/112-0",
            &[("rate", "10"), ("digest", "00")],
        )
        .await;
    assert_eq!(
        r.reason,
        "detected modified configuration - file changed by other user? Try again."
    );
    admin
        .call(
            "PUT",
            "/cluster/replication/112-0",
            &[("rate", "10"), ("digest", job["digest"].as_str().unwrap())],
        )
        .await
        .ok();
    admin
        .call("DELETE", "/cluster/replication/112-0", &[])
        .await
        .ok();
    // Marked first, removed by the scheduler a little later.
    assert_eq!(
        admin.get("/cluster/replication/112-0", &[]).await.ok()["remove_job"],
        "full"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        admin.get("/cluster/replication/112-0", &[]).await.reason,
        "no such job '112-0'"
    );
}
