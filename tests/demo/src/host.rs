//! The demo without a guest VM: hostd and the node plugin run on this host,
//! and the "hot-plug" of the disk into the worker is a loop device backed by
//! the disk's file, which hostd finds through the kernel's device events, as
//! it would find a SCSI disk by WWN.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use callers::kubelet::Kubelet;
use callers::{attacher, provisioner, resizer};
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use pvesim::{Sim, State};

use demo::common::*;

/// The directories kubelet makes before a call.
fn mkdirs(dirs: Vec<String>) -> Result<()> {
    for d in dirs {
        std::fs::create_dir_all(&d).with_context(|| d.clone())?;
    }
    Ok(())
}

pub async fn run() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the demo attaches loop devices and mounts filesystems: run it as root (sudo make demo)"
        );
    }
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    println!("Proxmox CSI driver demo (work directory {})", d.display());

    step(
        1,
        "pvesim: a simulated Proxmox VE cluster (3 nodes, VM 112 worker-2 on pve2)",
    );
    let images = d.join("disks");
    std::fs::create_dir_all(&images)?;
    let sim = Sim::new(State::from_yaml(CLUSTER)?)
        .start("127.0.0.1:0")
        .await?;
    let ca = d.join("pvesim-ca.pem");
    std::fs::write(&ca, sim.ca_pem.as_deref().unwrap_or_default())?;
    evidence(format!(
        "API {} (TLS verified against its CA {})",
        sim.api_url(),
        ca.display()
    ));

    step(
        2,
        "proxmox-csi-controller with a Go-driver-compatible cloud config",
    );
    let (controller, ctl_sock) =
        start_controller(d, &sim.api_url(), &ca, "  controllerVmID: 9999\n")?;
    let ch = channel(&ctl_sock).await?;
    let mut ident = IdentityClient::new(ch.clone());
    let mut ctl = ControllerClient::new(ch);
    let info = ident
        .get_plugin_info(callers::identity::get_plugin_info())
        .await?
        .into_inner();
    let ready = ident
        .probe(callers::identity::probe())
        .await?
        .into_inner()
        .ready;
    evidence(format!(
        "GetPluginInfo: {} {}; Probe ready = {ready:?} (GET /version answered)",
        info.name, info.vendor_version
    ));

    step(
        3,
        "proxmox-csi-hostd (root) and proxmox-csi-node (uid 65534, no capabilities)",
    );
    let kubelet_root = d.join("kubelet");
    let kubelet = Kubelet::new(kubelet_root.to_str().unwrap_or_default());
    let sockets = d.join("sockets");
    std::fs::create_dir_all(&kubelet_root)?;
    std::fs::create_dir_all(&sockets)?;
    std::fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )?;
    std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let hostd_sock = sockets.join("hostd.sock");
    let hostd = spawn(
        "proxmox-csi-hostd",
        &bin("proxmox-csi-hostd")?,
        &[
            "--socket",
            hostd_sock.to_str().unwrap_or_default(),
            "--socket-mode",
            "666",
            "--allow-uid",
            "65534",
            "--kubelet-root",
            kubelet_root.to_str().unwrap_or_default(),
            "--loop-dir",
            images.to_str().unwrap_or_default(),
            "--device-events",
            "kernel",
            "--health-file",
            d.join("health.json").to_str().unwrap_or_default(),
        ]
        .map(String::from),
        &d.join("hostd.log"),
    )
    .context("hostd (built with the loop-resolver feature by `make demo`)")?;
    channel(&hostd_sock).await?;
    let node_sock = sockets.join("node.sock");
    let node_bin = bin("proxmox-csi-node")?;
    let agent = spawn(
        "proxmox-csi-node",
        Path::new("setpriv"),
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            node_bin.to_str().unwrap_or_default(),
            "--csi-address",
            &format!("unix://{}", node_sock.display()),
            "--hostd-socket",
            hostd_sock.to_str().unwrap_or_default(),
            "--node-id",
            "worker-2",
            "--vmid",
            "112",
            "--region",
            "region-1",
            "--zone",
            "pve2",
            "--kubelet-root",
            kubelet_root.to_str().unwrap_or_default(),
        ]
        .map(String::from),
        &d.join("node.log"),
    )?;
    let mut node = NodeClient::new(channel(&node_sock).await?);
    let ni = node
        .node_get_info(callers::identity::node_get_info())
        .await?
        .into_inner();
    evidence(format!(
        "NodeGetInfo: node_id {} max_volumes {} topology {:?}",
        ni.node_id,
        ni.max_volumes_per_node,
        ni.accessible_topology.as_ref().map(|t| &t.segments)
    ));

    step(
        4,
        "CreateVolume: 1 GiB on local-lvm, zone chosen by free space among the requested",
    );
    // As the external-provisioner sends it: the StorageClass's parameters, the
    // claim's size, the pod's node (worker-2, in pve2) as the preferred term.
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("ssd", "true"),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ]);
    let claim = claim();
    let segments = ni.accessible_topology.clone().unwrap_or_default().segments;
    let requirement = provisioner::requirement(&[&term(&segments)], 0);
    let vol = ctl
        .create_volume(provisioner::create_volume(&sc, &claim, Some(requirement)))
        .await?
        .into_inner()
        .volume
        .context("no volume")?;
    // The PersistentVolume it writes: what the attacher, resizer and kubelet build from.
    let pv = provisioner::persistent_volume(&sc, &claim, &vol);
    evidence(format!(
        "volume_id {} ({} bytes)",
        vol.volume_id, vol.capacity_bytes
    ));

    step(
        5,
        "ControllerPublishVolume: the disk is added to VM 112 with a WWN and serial",
    );
    let pc = ctl
        .controller_publish_volume(attacher::controller_publish(&pv, &ni.node_id))
        .await?
        .into_inner()
        .publish_context;
    let cfg: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
    let slot = format!("scsi{}", pc.get("lun").map(String::as_str).unwrap_or("?"));
    evidence(format!(
        "VM 112 config: {slot}: {}",
        cfg["config"][&slot].as_str().unwrap_or("?")
    ));
    evidence(format!(
        "publish context: wwn={} serial={}",
        pc["wwn"],
        pc.get("serial").cloned().unwrap_or_default()
    ));

    step(
        6,
        "The disk reaches the worker (here: a loop device backed by the volume's file)",
    );
    let wwn_hex = pc["wwn"].trim_start_matches("0x").to_string();
    let backing = images.join(format!("{wwn_hex}.raw"));
    std::fs::File::create(&backing)?.set_len(vol.capacity_bytes as u64)?;
    let loopdev = sh(
        "losetup",
        &["--find", "--show", backing.to_str().unwrap_or_default()],
    )?;
    evidence(format!("{loopdev} backed by {}", backing.display()));

    step(
        7,
        "NodeStageVolume: hostd waits for the device event, finds no signature, makes xfs, mounts",
    );
    // kubelet's staging directory for the PV (it makes it), then NodeStage.
    let staging = PathBuf::from(kubelet.staging_path(&pv));
    mkdirs(kubelet.stage_dirs(&pv))?;
    let started = Instant::now();
    node.node_stage_volume(kubelet.node_stage(&pv, &pc, HashMap::new()))
        .await?;
    evidence(format!(
        "staged in {:?}: {}",
        started.elapsed(),
        mount_line(&staging)
    ));

    step(
        8,
        "NodePublishVolume: bind mount into the pod, then write and read back",
    );
    // kubelet makes the target's parent in the pod's volume directory; the driver makes `mount`.
    let pod = pod();
    let target = PathBuf::from(kubelet.target_path(&pod, &pv));
    mkdirs(kubelet.publish_dirs(&pod, &pv))?;
    node.node_publish_volume(kubelet.node_publish(&pv, &pod, &pc))
        .await?;
    let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(target.join("data.bin"), &payload)?;
    sh("sync", &[])?;
    let back = std::fs::read(staging.join("data.bin"))?;
    evidence(format!(
        "wrote {} bytes through the pod's mount; read back identical: {}",
        payload.len(),
        back == payload
    ));

    step(
        9,
        "ControllerExpandVolume to 2 GiB (Proxmox grows the disk), then NodeExpandVolume",
    );
    let grown = ctl
        .controller_expand_volume(resizer::controller_expand(&pv, 2 << 30))
        .await?
        .into_inner();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&backing)?
        .set_len(grown.capacity_bytes as u64)?;
    sh("losetup", &["-c", &loopdev])?;
    let ne = node
        .node_expand_volume(kubelet.node_expand(&pv, &pod, 2 << 30, HashMap::new()))
        .await?
        .into_inner();
    let stats = node
        .node_get_volume_stats(kubelet.node_stats(&pv, &pod))
        .await?
        .into_inner();
    evidence(format!(
        "controller: {} bytes, node: device {} bytes, filesystem {} bytes total, condition {:?}",
        grown.capacity_bytes,
        ne.capacity_bytes,
        stats.usage.first().map(|u| u.total).unwrap_or(0),
        stats.volume_condition.map(|c| c.message)
    ));

    step(
        10,
        "NodeUnpublishVolume and NodeUnstageVolume: unmounted, flushed",
    );
    node.node_unpublish_volume(kubelet.node_unpublish(&pv, &pod))
        .await?;
    node.node_unstage_volume(kubelet.node_unstage(&pv)).await?;
    evidence(format!("staging path: {}", mount_line(&staging)));
    sh("losetup", &["-d", &loopdev])?;

    step(
        11,
        "ControllerUnpublishVolume and DeleteVolume: nothing left on the VM or the storage",
    );
    ctl.controller_unpublish_volume(attacher::controller_unpublish(&pv, &ni.node_id))
        .await?;
    let cfg: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
    evidence(format!(
        "VM 112: {slot} {}; pending changes: {}",
        if cfg["config"].get(&slot).is_some() {
            "still there (bug)"
        } else {
            "gone"
        },
        cfg["pending"].as_object().map(|p| p.len()).unwrap_or(0)
    ));
    ctl.delete_volume(provisioner::delete_volume(&pv)).await?;
    let vols: serde_json::Value = reqwest_json(&sim.addr.to_string(), "volumes").await?;
    let left = vols
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|v| v["volid"].as_str().unwrap_or_default().contains(&pv.name))
                .count()
        })
        .unwrap_or(0);
    evidence(format!(
        "volumes named {} left on local-lvm: {left}",
        pv.name
    ));

    step(12, "Clean shutdown on SIGTERM, and no secret in any log");
    evidence(stop(agent).await?);
    evidence(stop(hostd).await?);
    evidence(stop(controller).await?);
    let mut leaked = false;
    for log in ["controller.log", "hostd.log", "node.log"] {
        leaked |= std::fs::read_to_string(d.join(log))?.contains(SECRET);
    }
    evidence(format!(
        "token secret in the logs: {}",
        if leaked { "YES (bug)" } else { "no" }
    ));
    if leaked || left > 0 || back != payload {
        bail!("the demo found a problem (see above)");
    }
    println!("\nDemo finished.");
    Ok(())
}
