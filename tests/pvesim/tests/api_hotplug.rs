//! One test per Proxmox semantic pvesim promises (see proxmox-api.md §12):
//! disk hot-plug through the VM config: attach, detach, pending changes,
//! costs and the guest's eject (qemu-server).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::{Client, TOKEN, attach, start};

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
