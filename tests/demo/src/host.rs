//! The demo without a guest VM: hostd and the node plugin run on this host,
//! and the "hot-plug" of the disk into the worker is a loop device backed by
//! the disk's file, which hostd finds through the kernel's device events, as
//! it would find a SCSI disk by WWN.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use pvesim::{Sim, State};

use demo::common::*;

pub async fn run() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the demo attaches loop devices and mounts filesystems: run it as root (sudo make demo)");
    }
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    println!("Proxmox CSI driver demo (work directory {})", d.display());

    step(1, "pvesim: a simulated Proxmox VE cluster (3 nodes, VM 112 worker-2 on pve2)");
    let images = d.join("disks");
    std::fs::create_dir_all(&images)?;
    let sim = Sim::new(State::from_yaml(CLUSTER)?).start("127.0.0.1:0").await?;
    let ca = d.join("pvesim-ca.pem");
    std::fs::write(&ca, sim.ca_pem.as_deref().unwrap_or_default())?;
    evidence(format!("API {} (TLS verified against its CA {})", sim.api_url(), ca.display()));

    step(2, "proxmox-csi-controller with a Go-driver-compatible cloud config");
    let (controller, ctl_sock) = start_controller(d, &sim.api_url(), &ca, "  controllerVmID: 9999\n")?;
    let ch = channel(&ctl_sock).await?;
    let mut ident = IdentityClient::new(ch.clone());
    let mut ctl = ControllerClient::new(ch);
    let info = ident.get_plugin_info(csi::GetPluginInfoRequest {}).await?.into_inner();
    let ready = ident.probe(csi::ProbeRequest {}).await?.into_inner().ready;
    evidence(format!("GetPluginInfo: {} {}; Probe ready = {ready:?} (GET /version answered)", info.name, info.vendor_version));

    step(3, "proxmox-csi-hostd (root) and proxmox-csi-node (uid 65534, no capabilities)");
    let kubelet = d.join("kubelet");
    let sockets = d.join("sockets");
    std::fs::create_dir_all(&kubelet)?;
    std::fs::create_dir_all(&sockets)?;
    std::fs::set_permissions(&sockets, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let hostd_sock = sockets.join("hostd.sock");
    let hostd = spawn(
        "proxmox-csi-hostd",
        &bin("proxmox-csi-hostd")?,
        &[
            "--socket", hostd_sock.to_str().unwrap_or_default(), "--socket-mode", "666", "--allow-uid", "65534",
            "--kubelet-root", kubelet.to_str().unwrap_or_default(), "--loop-dir", images.to_str().unwrap_or_default(),
            "--device-events", "kernel", "--health-file", d.join("health.json").to_str().unwrap_or_default(),
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
            "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
            node_bin.to_str().unwrap_or_default(), "--csi-address", &format!("unix://{}", node_sock.display()),
            "--hostd-socket", hostd_sock.to_str().unwrap_or_default(), "--node-id", "worker-2", "--vmid", "112",
            "--region", "region-1", "--zone", "pve2", "--kubelet-root", kubelet.to_str().unwrap_or_default(),
        ]
        .map(String::from),
        &d.join("node.log"),
    )?;
    let mut node = NodeClient::new(channel(&node_sock).await?);
    let ni = node.node_get_info(csi::NodeGetInfoRequest {}).await?.into_inner();
    evidence(format!("NodeGetInfo: node_id {} max_volumes {} topology {:?}", ni.node_id, ni.max_volumes_per_node, ni.accessible_topology.map(|t| t.segments)));

    step(4, "CreateVolume: 1 GiB on local-lvm, zone chosen by free space among the requested");
    let topo = csi::Topology {
        segments: HashMap::from([
            ("topology.kubernetes.io/region".to_string(), "region-1".to_string()),
            ("topology.kubernetes.io/zone".to_string(), "pve2".to_string()),
        ]),
    };
    let vol = ctl
        .create_volume(csi::CreateVolumeRequest {
            name: "pvc-0c6e8a1b-demo".into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
            volume_capabilities: vec![mount_cap()],
            parameters: HashMap::from([("storage".into(), "local-lvm".into()), ("ssd".into(), "true".into())]),
            accessibility_requirements: Some(csi::TopologyRequirement { requisite: vec![topo.clone()], preferred: vec![topo] }),
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .context("no volume")?;
    evidence(format!("volume_id {} ({} bytes)", vol.volume_id, vol.capacity_bytes));

    step(5, "ControllerPublishVolume: the disk is added to VM 112 with a WWN and serial");
    let pc = ctl
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: ni.node_id.clone(),
            volume_capability: Some(mount_cap()),
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .publish_context;
    let cfg: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
    let slot = format!("scsi{}", pc.get("lun").map(String::as_str).unwrap_or("?"));
    evidence(format!("VM 112 config: {slot}: {}", cfg["config"][&slot].as_str().unwrap_or("?")));
    evidence(format!("publish context: wwn={} serial={}", pc["wwn"], pc.get("serial").cloned().unwrap_or_default()));

    step(6, "The disk reaches the worker (here: a loop device backed by the volume's file)");
    let wwn_hex = pc["wwn"].trim_start_matches("0x").to_string();
    let backing = images.join(format!("{wwn_hex}.raw"));
    std::fs::File::create(&backing)?.set_len(vol.capacity_bytes as u64)?;
    let loopdev = sh("losetup", &["--find", "--show", backing.to_str().unwrap_or_default()])?;
    evidence(format!("{loopdev} backed by {}", backing.display()));

    step(7, "NodeStageVolume: hostd waits for the device event, finds no signature, makes xfs, mounts");
    let staging = kubelet.join("plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/demo/globalmount");
    std::fs::create_dir_all(staging.parent().context("staging parent")?)?;
    let started = Instant::now();
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: pc.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap()),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    })
    .await?;
    evidence(format!("staged in {:?}: {}", started.elapsed(), mount_line(&staging)));

    step(8, "NodePublishVolume: bind mount into the pod, then write and read back");
    let pod_dir = kubelet.join("pods/6f1e/volumes/kubernetes.io~csi/pvc-0c6e8a1b-demo");
    std::fs::create_dir_all(&pod_dir)?;
    let target = pod_dir.join("mount");
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    })
    .await?;
    let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(target.join("data.bin"), &payload)?;
    sh("sync", &[])?;
    let back = std::fs::read(staging.join("data.bin"))?;
    evidence(format!("wrote {} bytes through the pod's mount; read back identical: {}", payload.len(), back == payload));

    step(9, "ControllerExpandVolume to 2 GiB (Proxmox grows the disk), then NodeExpandVolume");
    let grown = ctl
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await?
        .into_inner();
    std::fs::OpenOptions::new().write(true).open(&backing)?.set_len(grown.capacity_bytes as u64)?;
    sh("losetup", &["-c", &loopdev])?;
    let ne = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.display().to_string(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await?
        .into_inner();
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await?
        .into_inner();
    evidence(format!(
        "controller: {} bytes, node: device {} bytes, filesystem {} bytes total, condition {:?}",
        grown.capacity_bytes,
        ne.capacity_bytes,
        stats.usage.first().map(|u| u.total).unwrap_or(0),
        stats.volume_condition.map(|c| c.message)
    ));

    step(10, "NodeUnpublishVolume and NodeUnstageVolume: unmounted, flushed");
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), target_path: target.display().to_string() }).await?;
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: staging.display().to_string() }).await?;
    evidence(format!("staging path: {}", mount_line(&staging)));
    sh("losetup", &["-d", &loopdev])?;

    step(11, "ControllerUnpublishVolume and DeleteVolume: nothing left on the VM or the storage");
    ctl.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), node_id: ni.node_id.clone(), ..Default::default() }).await?;
    let cfg: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
    evidence(format!(
        "VM 112: {slot} {}; pending changes: {}",
        if cfg["config"].get(&slot).is_some() { "still there (bug)" } else { "gone" },
        cfg["pending"].as_object().map(|p| p.len()).unwrap_or(0)
    ));
    ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), ..Default::default() }).await?;
    let vols: serde_json::Value = reqwest_json(&sim.addr.to_string(), "volumes").await?;
    let left = vols.as_array().map(|a| a.iter().filter(|v| v["volid"].as_str().unwrap_or_default().contains("pvc-0c6e8a1b-demo")).count()).unwrap_or(0);
    evidence(format!("volumes named pvc-0c6e8a1b-demo left on local-lvm: {left}"));

    step(12, "Clean shutdown on SIGTERM, and no secret in any log");
    evidence(agent.stop()?);
    evidence(hostd.stop()?);
    evidence(controller.stop()?);
    let mut leaked = false;
    for log in ["controller.log", "hostd.log", "node.log"] {
        leaked |= std::fs::read_to_string(d.join(log))?.contains(SECRET);
    }
    evidence(format!("token secret in the logs: {}", if leaked { "YES (bug)" } else { "no" }));
    if leaked || left > 0 || back != payload {
        bail!("the demo found a problem (see above)");
    }
    println!("\nDemo finished.");
    Ok(())
}

