//! One test per Proxmox semantic pvesim promises (see proxmox-api.md §12).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::{Duration, Instant};

use common::{Client, NARROW, TOKEN, start};
use serde_json::json;

#[tokio::test]
async fn envelope_reason_phrase_auth_and_unknown_routes() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let v = c.get("/version", &[]).await.ok();
    assert_eq!(v["version"], "9.0.3");
    assert_eq!(v["release"], "9.0");

    let anon = Client::anonymous(&sim).get("/version", &[]).await;
    assert_eq!((anon.status, anon.reason.as_str()), (401, "No ticket"));
    let mut bad = Client::new(&sim, "kubernetes-csi@pve!nope");
    let r = bad.get("/version", &[]).await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (401, "Authentication failed!")
    );
    bad = Client::new(&sim, "kubernetes-csi@pve!csi");
    assert_eq!(bad.get("/version", &[]).await.status, 200);

    let r = c.get("/nodes/pve1/frobnicate", &[]).await;
    assert_eq!(r.status, 501);
    assert_eq!(
        r.reason,
        "Method 'GET /nodes/pve1/frobnicate' not implemented"
    );
    // Errors carry the message in the reason phrase and in the body.
    let r = c.get("/nodes/pve2/qemu/999/config", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.reason,
        "Configuration file 'nodes/pve2/qemu-server/999.conf' does not exist"
    );
    assert_eq!(
        r.body["message"],
        "Configuration file 'nodes/pve2/qemu-server/999.conf' does not exist\n"
    );
    assert_eq!(r.body["data"], serde_json::Value::Null);
    // nextid is a string; booleans are 0/1.
    assert_eq!(c.get("/cluster/nextid", &[]).await.ok(), json!("100"));
    let nodes = c.get("/nodes/pve2/storage", &[]).await.ok();
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["shared"] == 0 || s["shared"] == 1)
    );
    let r = c.get("/cluster/nextid", &[("vmid", "112")]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["errors"]["vmid"], "VM 112 already exists");
}

#[tokio::test]
async fn parameters_are_checked_against_the_schema() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-a"),
                ("vmid", "9999"),
                ("size", "1G"),
                ("bogus", "1"),
            ],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (400, "Parameter verification failed.")
    );
    assert_eq!(
        r.body["errors"]["bogus"],
        "property is not defined in schema and the schema does not allow additional properties"
    );
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[("vmid", "abc"), ("size", "1G")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["filename"],
        "property is missing and it is not optional"
    );
    assert_eq!(
        r.body["errors"]["vmid"],
        "type check ('integer') failed - got 'abc'"
    );
    let r = c
        .get("/nodes/pve2/qemu/112/config", &[("current", "true")])
        .await;
    assert_eq!(
        r.body["errors"]["current"],
        "type check ('boolean') failed - got 'true'"
    );
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi31", "local-lvm:1")],
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi1", "local-lvm:vm-112-disk-1,wwn=0x123")],
        )
        .await;
    assert!(
        r.body["errors"]["scsi1"]
            .as_str()
            .unwrap()
            .contains("scsi1.wwn: value does not match the regex pattern"),
        "{r:?}"
    );
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi1", "local-lvm:vm-112-disk-1,colour=red")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["scsi1"],
        "invalid format - invalid key in comma-separated list property: colour\n"
    );
    // A path parameter repeated in the body with another value.
    let r = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/config",
            &[("node", "pve1"), ("name", "x")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["node"],
        "duplicate parameter (already defined in URI) with conflicting values!"
    );
    // A GET with a body.
    let raw = reqwest::Client::new()
        .get(format!("http://{}/api2/json/version", sim.addr))
        .header(
            "Authorization",
            format!("PVEAPIToken={TOKEN}={}", common::SECRET),
        )
        .body("x=1")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 501);
}

#[tokio::test]
async fn privileges_come_from_acls() {
    let sim = start().await;
    let narrow = Client::new(&sim, NARROW);
    let r = narrow
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-a"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (
            403,
            "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"
        )
    );
    let r = narrow
        .call("POST", "/nodes/pve2/qemu/112/config", &[("name", "x")])
        .await;
    assert_eq!(r.status, 403);
    assert!(
        r.reason
            .starts_with("Permission check failed (/vms/112, VM.Config.Disk|VM.Config.CDROM"),
        "{}",
        r.reason
    );
    // Reading is allowed with the Reader role.
    assert_eq!(
        narrow.get("/nodes/pve2/qemu/112/config", &[]).await.status,
        200
    );
    // The copy endpoint is root@pam only, whatever the token may do.
    let c = Client::new(&sim, TOKEN);
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content/vm-112-disk-1",
            &[("target", "vm-9999-copy")],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (403, "Permission check failed (user != root@pam)")
    );
}

/// A storage's listing shows only the images the caller may access
/// (Storage.pm check_volume_access); an ACL on a narrower path replaces
/// the inherited one (AccessControl.pm roles), NoAccess takes all.
#[tokio::test]
async fn listings_and_narrower_acls_follow_proxmox() {
    let sim = start().await;
    let list = |who: &'static str| {
        let sim = &sim;
        async move {
            Client::new(sim, who)
                .get("/nodes/pve2/storage/local-lvm/content", &[])
                .await
                .ok()
                .as_array()
                .unwrap()
                .len()
        }
    };
    // Reader: Datastore.Audit without VM.Config.Disk on the owners.
    assert_eq!(list(NARROW).await, 0);
    assert_eq!(list(TOKEN).await, 2);

    let narrowed = common::CLUSTER.replace(
        "  - { path: /, roles: [Administrator], users: [admin@pve] }",
        "  - { path: /, roles: [Administrator], users: [admin@pve] }\n  - { path: /storage/local-lvm, roles: [Reader], users: [kubernetes-csi@pve], tokens: [\"kubernetes-csi@pve!csi\"] }\n  - { path: /vms/112, roles: [NoAccess], users: [kubernetes-csi@pve], tokens: [\"kubernetes-csi@pve!csi\"] }",
    );
    let sim = common::start_with(&narrowed).await;
    let c = Client::new(&sim, TOKEN);
    let alloc = |storage: &'static str| {
        let c = &c;
        async move {
            c.call(
                "POST",
                &format!("/nodes/pve2/storage/{storage}/content"),
                &[
                    ("filename", "vm-9999-pvc-n"),
                    ("vmid", "9999"),
                    ("size", "1G"),
                ],
            )
            .await
        }
    };
    // The role on / no longer reaches local-lvm, still reaches local-zfs.
    let r = alloc("local-lvm").await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (
            403,
            "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"
        )
    );
    assert_eq!(alloc("local-zfs").await.status, 200);
    assert_eq!(c.get("/nodes/pve2/qemu/112/config", &[]).await.status, 403);
    assert_eq!(c.get("/nodes/pve1/qemu/111/config", &[]).await.status, 200);
}

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

async fn attach(c: &Client, key: &str, value: &str) -> serde_json::Value {
    let upid = c
        .call("POST", "/nodes/pve2/qemu/112/config", &[(key, value)])
        .await
        .ok();
    c.wait_task(upid.as_str().unwrap()).await
}

#[tokio::test]
async fn hotplug_attach_and_detach_on_a_running_vm() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.call(
        "POST",
        "/nodes/pve2/storage/local-lvm/content",
        &[
            ("filename", "vm-9999-pvc-a"),
            ("vmid", "9999"),
            ("size", "1G"),
        ],
    )
    .await
    .ok();
    let before = c.config("pve2", 112, false).await["digest"].clone();
    let st = attach(&c, "scsi1", "local-lvm:vm-9999-pvc-a,wwn=0x5000C500A1B2C3D4,serial=pvc-a,ssd=on,discard=on,backup=0,iothread=1").await;
    assert_eq!(st["exitstatus"], "OK", "{st}");
    assert!(
        st["upid"]
            .as_str()
            .unwrap()
            .ends_with(":qmconfig:112:kubernetes-csi@pve!csi:")
    );
    assert_eq!(st["user"], "kubernetes-csi@pve");
    assert_eq!(st["tokenid"], "csi");
    let cfg = c.config("pve2", 112, true).await;
    // Canonical: volume first, keys sorted, booleans 1/0, size from the volume.
    assert_eq!(
        cfg["scsi1"],
        "local-lvm:vm-9999-pvc-a,backup=0,discard=on,iothread=1,serial=pvc-a,size=1G,ssd=1,wwn=0x5000C500A1B2C3D4"
    );
    assert_ne!(cfg["digest"], before);
    let pending = c.get("/nodes/pve2/qemu/112/pending", &[]).await.ok();
    assert!(
        pending
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.get("pending").is_none()),
        "{pending}"
    );

    // Detach a disk owned by another VMID: it leaves the config, no unusedN.
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("delete", "scsi1")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let cfg = c.config("pve2", 112, true).await;
    assert!(
        cfg.get("scsi1").is_none() && cfg.get("unused0").is_none(),
        "{cfg}"
    );
    assert!(
        c.get("/nodes/pve2/storage/local-lvm/content/vm-9999-pvc-a", &[])
            .await
            .status
            == 200
    );

    // A disk the VM owns becomes unused0; with force it is freed.
    assert_eq!(
        attach(&c, "scsi2", "local-lvm:vm-112-disk-1").await["exitstatus"],
        "OK"
    );
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("delete", "scsi2")],
        )
        .await
        .ok();
    c.wait_task(upid.as_str().unwrap()).await;
    assert_eq!(
        c.config("pve2", 112, true).await["unused0"],
        "local-lvm:vm-112-disk-1"
    );
    c.call(
        "PUT",
        "/nodes/pve2/qemu/112/unlink",
        &[("idlist", "unused0"), ("force", "1")],
    )
    .await
    .ok();
    assert_eq!(
        c.get("/nodes/pve2/storage/local-lvm/content/vm-112-disk-1", &[])
            .await
            .status,
        500
    );

    // Deleting a key that is not set only logs a line; the task ends OK.
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("delete", "scsi9")],
        )
        .await
        .ok();
    let upid = upid.as_str().unwrap().to_string();
    assert_eq!(c.wait_task(&upid).await["exitstatus"], "OK");
    let log = c
        .get(&format!("/nodes/pve2/tasks/{upid}/log"), &[])
        .await
        .ok();
    assert_eq!(
        log[0]["t"],
        "cannot delete 'scsi9' - not set in current configuration!"
    );
    assert_eq!(log[1]["t"], "TASK OK");

    // Attaching a volume that does not exist fails inside the task, at
    // activate_volumes, with each plugin's text (qemu-server Qemu.pm
    // create_disks; LvmThinPlugin.pm $activate_lv, ZFSPoolPlugin.pm
    // zfs_wait_for_zvol_link inside a worker, Plugin.pm activate_volume).
    for (volid, want) in [
        (
            "local-lvm:vm-9999-nothere",
            "no such logical volume pve/vm-9999-nothere",
        ),
        (
            "local-zfs:vm-9999-nothere",
            "timeout: no zvol device link for 'vm-9999-nothere' found after 300 sec.",
        ),
        (
            "nfs:9999/vm-9999-nothere.raw",
            "volume 'nfs:9999/vm-9999-nothere.raw' does not exist",
        ),
    ] {
        let st = attach(&c, "scsi3", volid).await;
        assert_eq!(st["exitstatus"], want);
    }
    // A grow by 1 KiB: the config keeps the size asked for (Qemu.pm
    // resize_vm), the LV is rounded up to a whole 4 MiB extent (lvextend).
    let upid = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/resize",
            &[("disk", "scsi0"), ("size", "+1K")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let line = c.config("pve2", 112, false).await["scsi0"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(line.contains("size=33554433K"), "{line}");
    let info = c
        .get("/nodes/pve2/storage/local-lvm/content/vm-112-disk-0", &[])
        .await
        .ok();
    assert_eq!(info["size"], (32u64 << 30) + (4 << 20));
}

#[tokio::test]
async fn a_failed_hotplug_stays_pending() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.call(
        "POST",
        "/nodes/pve2/storage/local-lvm/content",
        &[
            ("filename", "vm-9999-pvc-a"),
            ("vmid", "9999"),
            ("size", "1G"),
        ],
    )
    .await
    .ok();
    c.knobs(r#"{"fail_hotplugs": 1}"#).await;
    let st = attach(&c, "scsi1", "local-lvm:vm-9999-pvc-a").await;
    assert_eq!(
        st["exitstatus"],
        "400 Parameter verification failed. scsi1: hotplug problem - error on hotplug device 'scsi1'"
    );
    assert!(c.config("pve2", 112, true).await.get("scsi1").is_none());
    // Without current=1 the pending value already shows.
    assert!(
        c.config("pve2", 112, false).await["scsi1"]
            .as_str()
            .unwrap()
            .starts_with("local-lvm:vm-9999-pvc-a")
    );
    let pending = c.get("/nodes/pve2/qemu/112/pending", &[]).await.ok();
    assert!(
        pending
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["key"] == "scsi1" && p.get("pending").is_some())
    );
    // Revert drops the pending change.
    c.call("PUT", "/nodes/pve2/qemu/112/config", &[("revert", "scsi1")])
        .await
        .ok();
    // The synchronous PUT answers 400 with the per-key error.
    c.knobs(r#"{"fail_hotplugs": 1}"#).await;
    let r = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/config",
            &[("scsi2", "local-lvm:vm-9999-pvc-a")],
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["errors"]["scsi2"],
        "hotplug problem - error on hotplug device 'scsi2'"
    );
    c.call("PUT", "/nodes/pve2/qemu/112/config", &[("revert", "scsi2")])
        .await
        .ok();
    let pending = c.get("/nodes/pve2/qemu/112/pending", &[]).await.ok();
    assert!(
        pending
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.get("pending").is_none()),
        "{pending}"
    );
}

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
async fn tasks_can_fail_after_their_upid() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.knobs(r#"{"fail_tasks": 1}"#).await;
    let st = attach(&c, "name", "renamed").await;
    assert_eq!(st["status"], "stopped");
    assert_eq!(st["exitstatus"], "task failed (injected by pvesim)");
    assert_eq!(sim.faults().failed_tasks, 1);
    assert_eq!(attach(&c, "name", "renamed").await["exitstatus"], "OK");
    let r = c.get("/nodes/pve2/tasks/UPID:bad/status", &[]).await;
    assert_eq!(r.body["errors"]["upid"], "unable to parse worker upid");
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
async fn ticket_login_with_csrf() {
    let sim = start().await;
    let http = reqwest::Client::new();
    let base = format!("http://{}/api2/json", sim.addr);
    let t: serde_json::Value = http
        .post(format!("{base}/access/ticket"))
        .form(&[("username", "root@pam"), ("password", "rootpw")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ticket = t["data"]["ticket"].as_str().unwrap();
    let csrf = t["data"]["CSRFPreventionToken"].as_str().unwrap();
    let cookie = format!("PVEAuthCookie={ticket}");
    let r = http
        .get(format!("{base}/version"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = http
        .put(format!("{base}/nodes/pve2/qemu/112/config"))
        .header("Cookie", &cookie)
        .form(&[("name", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "writes need the CSRF token");
    let r = http
        .put(format!("{base}/nodes/pve2/qemu/112/config"))
        .header("Cookie", &cookie)
        .header("CSRFPreventionToken", csrf)
        .form(&[("name", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // root@pam may copy a volume.
    let r = http
        .post(format!(
            "{base}/nodes/pve2/storage/local-lvm/content/vm-112-disk-1"
        ))
        .header("Cookie", &cookie)
        .header("CSRFPreventionToken", csrf)
        .form(&[("target", "vm-9999-copy")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let bad = http
        .post(format!("{base}/access/ticket"))
        .form(&[("username", "root@pam"), ("password", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 401);
}

#[tokio::test]
async fn knobs_counters_and_faults() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.call("DELETE", "/pvesim/counters", &[]).await;
    c.get("/version", &[]).await.ok();
    c.get("/version", &[]).await.ok();
    c.get("/nodes/pve2/qemu/112/config", &[]).await.ok();
    let n = c.get("/pvesim/counters", &[]).await.ok();
    assert_eq!(n["GET /version"], 2);
    assert_eq!(n["GET /nodes/{node}/qemu/{vmid}/config"], 1);
    c.call("DELETE", "/pvesim/counters", &[]).await;
    assert_eq!(c.get("/pvesim/counters", &[]).await.ok(), json!({}));

    c.knobs(r#"{"error_5xx_rate": 1.0}"#).await;
    let r = c.get("/version", &[]).await;
    assert_eq!((r.status, r.reason.as_str()), (595, "Connection refused"));
    c.knobs(r#"{"error_5xx_rate": 0.0, "drop_connections": 1}"#)
        .await;
    let raw = reqwest::Client::new()
        .get(format!("http://{}/api2/json/version", sim.addr))
        .header(
            "Authorization",
            format!("PVEAPIToken={TOKEN}={}", common::SECRET),
        )
        .send()
        .await;
    assert!(raw.is_err(), "the connection should have been dropped");
    assert_eq!(c.get("/version", &[]).await.status, 200);
    let faults = c.get("/pvesim/faults", &[]).await.ok();
    assert_eq!(faults["errors_5xx"], 1, "{faults}");
    assert_eq!(faults["dropped_connections"], 1, "{faults}");
    c.call("DELETE", "/pvesim/faults", &[]).await;
    assert_eq!(sim.faults(), pvesim::knobs::Faults::default());

    c.knobs(r#"{"api_latency_ms": 100}"#).await;
    let started = Instant::now();
    c.get("/version", &[]).await.ok();
    assert!(started.elapsed() >= Duration::from_millis(100));
    let r = reqwest::Client::new()
        .post(format!("http://{}/pvesim/knobs", sim.addr))
        .body(r#"{"no_such_knob": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        sim.set_knobs(r#"{"fail_task": 1}"#).is_err(),
        "a typo'd knob"
    );
}

/// A write whose answer is lost took effect: the allocation is there, and
/// a second one is refused as Proxmox refuses it.
#[tokio::test]
async fn a_lost_answer_comes_after_the_work() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.knobs(r#"{"lose_answers": 1, "lose_answers_skip": 1}"#)
        .await;
    let alloc = |name: &'static str| {
        let url = format!(
            "http://{}/api2/json/nodes/pve2/storage/local-lvm/content",
            sim.addr
        );
        async move {
            reqwest::Client::new()
                .post(url)
                .header(
                    "Authorization",
                    format!("PVEAPIToken={TOKEN}={}", common::SECRET),
                )
                .form(&[("filename", name), ("vmid", "9999"), ("size", "1G")])
                .send()
                .await
        }
    };
    // Reads are never lost; the first write is let through, the second lost.
    assert_eq!(c.get("/version", &[]).await.status, 200);
    assert!(alloc("vm-9999-pvc-x1").await.unwrap().status().is_success());
    assert!(alloc("vm-9999-pvc-x2").await.is_err(), "the answer is lost");
    assert_eq!(sim.faults().lost_answers, 1);
    let content = c
        .get("/nodes/pve2/storage/local-lvm/content", &[])
        .await
        .ok();
    let names: Vec<&str> = content
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["volid"].as_str())
        .collect();
    assert!(names.contains(&"local-lvm:vm-9999-pvc-x2"), "{names:?}");
    let again = alloc("vm-9999-pvc-x2").await.unwrap();
    assert_eq!(again.status().as_u16(), 500);
}

/// A task that did its work and ended in error anyway.
#[tokio::test]
async fn a_task_can_fail_after_its_work() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.knobs(r#"{"fail_tasks_after_work": 1}"#).await;
    let st = attach(&c, "name", "renamed").await;
    assert_eq!(
        st["exitstatus"],
        "task failed after its work (injected by pvesim)"
    );
    let cfg = c.get("/nodes/pve2/qemu/112/config", &[]).await.ok();
    assert_eq!(cfg["name"], "renamed", "the work was done: {cfg}");
    assert_eq!(sim.faults().failed_tasks_after_work, 1);
}

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

#[tokio::test]
async fn a_token_can_read_its_own_privileges() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let p = c.get("/access/permissions", &[]).await.ok();
    let root = p["/"].as_object().unwrap();
    for privilege in [
        "VM.Audit",
        "VM.Config.Disk",
        "Datastore.Allocate",
        "Datastore.AllocateSpace",
        "Datastore.Audit",
    ] {
        assert_eq!(root[privilege], 1, "{privilege}: {p}");
    }
    assert!(root.get("VM.Allocate").is_none());
    let narrow = Client::new(&sim, NARROW)
        .get("/access/permissions", &[])
        .await
        .ok();
    assert!(narrow["/"].get("VM.Config.Disk").is_none());
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

/// Hot-plug costs per disk, and the guest's eject of each disk's own
/// controller under virtio-scsi-single (qemu-server QemuServer.pm
/// qemu_devicedelverify: checks once a second, at most 15 s on PVE 9).
#[tokio::test]
async fn hotplug_costs_per_disk_and_the_guests_eject() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    for n in ["a", "b", "c"] {
        c.call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", &format!("vm-9999-pvc-{n}")),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await
        .ok();
    }
    // scsihw is not hot-pluggable: set it while the VM is stopped.
    c.call("PUT", "/pvesim/vms/112/running", &[("value", "0")])
        .await;
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsihw", "virtio-scsi-single")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    c.call("PUT", "/pvesim/vms/112/running", &[("value", "1")])
        .await;
    // qemu-server's once-a-second checks, scaled to 50 ms.
    c.knobs(r#"{"hotplug_ms_per_disk": 300, "guest_eject_ms": 75, "eject_poll_ms": 50}"#)
        .await;

    // Three disks in one write: three plugs, one after the other.
    let started = std::time::Instant::now();
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[
                ("scsi1", "local-lvm:vm-9999-pvc-a"),
                ("scsi2", "local-lvm:vm-9999-pvc-b"),
                ("scsi3", "local-lvm:vm-9999-pvc-c"),
            ],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let plugged = started.elapsed();
    assert!(
        plugged >= std::time::Duration::from_millis(900),
        "{plugged:?}"
    );

    // An unplug waits for the guest's eject, in whole polls.
    let started = std::time::Instant::now();
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("delete", "scsi1")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );

    // A guest that does not eject within 15 polls: the key stays, the error names the controller.
    c.knobs(r#"{"hotplug_ms_per_disk": 0, "guest_eject_ms": 60000}"#)
        .await;
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("delete", "scsi2")],
        )
        .await
        .ok();
    let st = c.wait_task(upid.as_str().unwrap()).await;
    assert!(
        st["exitstatus"].as_str().unwrap().contains("scsi2: hotplug problem - error on hot-unplugging device 'virtioscsi2' - still busy in guest?"),
        "{st}"
    );
    assert!(c.config("pve2", 112, true).await.get("scsi2").is_some());
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

/// virtio-scsi-pci shares one controller: removing its last SCSI drive
/// unplugs the controller too, waiting for the guest's eject up to the
/// timeout of the qemu-server release (15 checks since 9.0.8, 5 before; the
/// " - still busy in guest?" suffix since 9.1.5; QemuServer.pm
/// qemu_deletescsihw, qemu_devicedelverify).
#[tokio::test]
async fn the_last_disk_of_a_shared_controller_takes_the_controller_with_it() {
    for (release, polls, suffix) in [
        ("9.2.6", 15u64, " - still busy in guest?"),
        ("8.4.10", 5, ""),
    ] {
        let state = common::CLUSTER.replace("version: 9.0.3", &format!("version: 9.0.3\nqemu-server: {release}")).replace(
            "volumes:\n",
            "  - { vmid: 114, node: pve2, name: worker-4, config: { scsihw: virtio-scsi-pci, virtio0: \"local-lvm:vm-114-disk-0,size=8G\" } }\nvolumes:\n  - { volid: \"local-lvm:vm-114-disk-0\", node: pve2, size: 8589934592 }\n",
        );
        let sim = common::start_with(&state).await;
        let c = Client::new(&sim, TOKEN);
        for n in ["x", "y"] {
            c.call(
                "POST",
                "/nodes/pve2/storage/local-lvm/content",
                &[
                    ("filename", &format!("vm-9999-pvc-{n}")),
                    ("vmid", "9999"),
                    ("size", "1G"),
                ],
            )
            .await
            .ok();
        }
        let write = |form: Vec<(&'static str, &'static str)>| {
            let c = &c;
            async move {
                let upid = c
                    .call("POST", "/nodes/pve2/qemu/114/config", &form)
                    .await
                    .ok();
                c.wait_task(upid.as_str().unwrap()).await["exitstatus"]
                    .as_str()
                    .unwrap()
                    .to_string()
            }
        };
        assert_eq!(
            write(vec![
                ("scsi1", "local-lvm:vm-9999-pvc-x"),
                ("scsi2", "local-lvm:vm-9999-pvc-y")
            ])
            .await,
            "OK"
        );
        c.knobs(r#"{"guest_eject_ms": 60000, "eject_poll_ms": 20}"#)
            .await;
        // scsi2 still holds scsihw0: no controller to eject, so the guest
        // that never ejects one does not fail this unplug.
        assert_eq!(write(vec![("delete", "scsi1")]).await, "OK", "{release}");
        // The last one: the controller goes too, and the guest never ejects it.
        let started = std::time::Instant::now();
        let exit = write(vec![("delete", "scsi2")]).await;
        assert!(
            exit.contains(&format!(
                "scsi2: hotplug problem - error on hot-unplugging device 'scsihw0'{suffix}"
            )),
            "{release}: {exit}"
        );
        if suffix.is_empty() {
            assert!(!exit.contains("still busy"), "{release}: {exit}");
        }
        // Every check of the release was made before it gave up.
        let waited = started.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis((polls + 1) * 20),
            "{release}: {waited:?}"
        );
    }
}
