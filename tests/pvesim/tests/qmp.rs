//! The QMP backend against a real QEMU (started paused, no guest): attach,
//! resize and detach do what Proxmox 9 does, and a QMP failure becomes the
//! `hotplug problem` pending state.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, TOKEN};
use pvesim::{Sim, State};
use serde_json::{Value, json};
use testkit::process::Proc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// QEMU, paused, with its QMP socket at `socket`; `None` (skipped) where
/// it is not installed outside CI.
fn qemu(socket: &Path, with_scsi: bool) -> Option<Proc> {
    if !testkit::skip::qemu() {
        return None;
    }
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-S",
        "-nodefaults",
        "-display",
        "none",
    ]);
    if with_scsi {
        cmd.args(["-device", "virtio-scsi-pci,id=scsihw0"]);
    }
    cmd.arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", socket.display()));
    let log = socket.with_extension("log");
    let child = match Proc::start("qemu", cmd, &log) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "QEMU did not open its QMP socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child)
}

/// Our own QMP client, to look at QEMU from the outside.
async fn qmp(socket: &Path, command: &str, args: Value) -> Result<Value, String> {
    let s = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| e.to_string())?;
    let (r, mut w) = s.into_split();
    let mut r = BufReader::new(r);
    let mut line = String::new();
    r.read_line(&mut line).await.map_err(|e| e.to_string())?;
    for (cmd, a) in [("qmp_capabilities", json!({})), (command, args)] {
        w.write_all(format!("{}\n", json!({"execute": cmd, "arguments": a})).as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        loop {
            line.clear();
            r.read_line(&mut line).await.map_err(|e| e.to_string())?;
            let m: Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
            if m.get("event").is_some() {
                continue;
            }
            if cmd == command {
                return match m.get("return") {
                    Some(v) => Ok(v.clone()),
                    None => Err(m["error"]["desc"].as_str().unwrap_or_default().to_string()),
                };
            }
            break;
        }
    }
    Err("no answer".into())
}

fn node_size(nodes: &Value, name: &str) -> Option<u64> {
    nodes.as_array()?.iter().find(|n| n["node-name"] == name)?["image"]["virtual-size"].as_u64()
}

#[tokio::test]
async fn disks_are_hot_plugged_into_qemu_as_proxmox_does() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("qmp-112.sock");
    let bad = dir.path().join("qmp-113.sock");
    let Some(_q1) = qemu(&good, true) else { return };
    let Some(_q2) = qemu(&bad, false) else { return };
    let yaml = format!(
        "{}\n",
        common::CLUSTER
            .replace(
                "    name: worker-2\n",
                &format!("    name: worker-2\n    qmp: {}\n", good.display()),
            )
            .replace(
                "vms:\n",
                &format!(
                    "vms:\n  - vmid: 113\n    node: pve2\n    name: no-scsi\n    qmp: {}\n    config: {{ scsihw: virtio-scsi-pci }}\n",
                    bad.display()
                ),
            )
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    let sim = Sim::new(State::from_yaml(&yaml).unwrap())
        .plain_http()
        .volume_dir(images.clone())
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let c = Client::new(&sim, TOKEN);
    for name in ["vm-9999-pvc-a", "vm-9999-pvc-b"] {
        c.call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[("filename", name), ("vmid", "9999"), ("size", "1G")],
        )
        .await
        .ok();
    }
    let post = |params: Vec<(&'static str, String)>, vmid: u32| {
        let c = c.clone();
        async move {
            let p: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let upid = c
                .call("POST", &format!("/nodes/pve2/qemu/{vmid}/config"), &p)
                .await
                .ok();
            c.wait_task(upid.as_str().unwrap()).await
        }
    };

    let st = post(
        vec![(
            "scsi1",
            "local-lvm:vm-9999-pvc-a,wwn=0x5000c500deadbeef,serial=pvc-a".into(),
        )],
        112,
    )
    .await;
    assert_eq!(st["exitstatus"], "OK", "{st}");
    let st = post(
        vec![(
            "scsi2",
            "local-lvm:vm-9999-pvc-b,wwn=0x5000c500deadbeee,serial=pvc-b".into(),
        )],
        112,
    )
    .await;
    assert_eq!(st["exitstatus"], "OK", "{st}");
    // QEMU has the devices with the WWN and serial, backed by sparse files.
    let w = qmp(
        &good,
        "qom-get",
        json!({"path": "/machine/peripheral/scsi1", "property": "wwn"}),
    )
    .await
    .unwrap();
    assert_eq!(w, json!(0x5000c500deadbeefu64));
    let s = qmp(
        &good,
        "qom-get",
        json!({"path": "/machine/peripheral/scsi2", "property": "serial"}),
    )
    .await
    .unwrap();
    assert_eq!(s, json!("pvc-b"));
    let lun = qmp(
        &good,
        "qom-get",
        json!({"path": "/machine/peripheral/scsi2", "property": "lun"}),
    )
    .await
    .unwrap();
    assert_eq!(lun, json!(2));
    let nodes = qmp(&good, "query-named-block-nodes", json!({}))
        .await
        .unwrap();
    assert_eq!(node_size(&nodes, "drive-scsi1"), Some(1 << 30));
    let file = images.join("local-lvm_vm-9999-pvc-a.img");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 1 << 30);

    // Resize: the file grows, then block_resize on the throttle node.
    let upid = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/resize",
            &[("disk", "scsi1"), ("size", "2G")],
        )
        .await
        .ok();
    assert_eq!(
        c.wait_task(upid.as_str().unwrap()).await["exitstatus"],
        "OK"
    );
    let nodes = qmp(&good, "query-named-block-nodes", json!({}))
        .await
        .unwrap();
    assert_eq!(node_size(&nodes, "drive-scsi1"), Some(2 << 30));

    // Detach: device, block node and throttle group are gone.
    let st = post(vec![("delete", "scsi1".into())], 112).await;
    assert_eq!(st["exitstatus"], "OK", "{st}");
    assert!(
        qmp(
            &good,
            "qom-get",
            json!({"path": "/machine/peripheral/scsi1", "property": "wwn"})
        )
        .await
        .is_err()
    );
    let nodes = qmp(&good, "query-named-block-nodes", json!({}))
        .await
        .unwrap();
    assert_eq!(node_size(&nodes, "drive-scsi1"), None);
    assert!(node_size(&nodes, "drive-scsi2").is_some());
    assert!(c.config("pve2", 112, true).await.get("scsi1").is_none());

    // A QMP failure: the change stays pending and QEMU keeps no half-added node.
    let st = post(
        vec![(
            "scsi1",
            "local-lvm:vm-9999-pvc-a,wwn=0x5000c500deadbeef".into(),
        )],
        113,
    )
    .await;
    let exit = st["exitstatus"].as_str().unwrap();
    assert!(
        exit.starts_with("400 Parameter verification failed. scsi1: hotplug problem - "),
        "{exit}"
    );
    assert!(exit.contains("scsihw0.0"), "{exit}");
    let cfg = c.get("/nodes/pve2/qemu/113/pending", &[]).await.ok();
    assert!(
        cfg.as_array()
            .unwrap()
            .iter()
            .any(|p| p["key"] == "scsi1" && p.get("pending").is_some()),
        "{cfg}"
    );
    let nodes = qmp(&bad, "query-named-block-nodes", json!({}))
        .await
        .unwrap();
    assert_eq!(node_size(&nodes, "drive-scsi1"), None, "{nodes}");
}
