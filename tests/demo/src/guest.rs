//! The demo with a guest VM: VM 112 `worker-2` is a QEMU guest running hostd
//! and the node plugin; pvesim hot-plugs the disk into it over QMP as
//! Proxmox VE 9 does, udev in the guest names it by WWN, and the volume is
//! LUKS-encrypted with dm-crypt.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use e2e::guest::Guest;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use pvesim::{Sim, State};

use demo::common::*;

const PASSPHRASE: &str = "demo passphrase, never logged";

pub async fn run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    println!("Proxmox CSI driver demo with a guest VM (work directory {})", d.display());

    step(1, "the worker VM: a QEMU guest (TCG) running hostd and the node plugin");
    let mut g = Guest::boot().await.context("booting the guest VM")?;
    evidence(format!("booted in {:?}; node plugin on 127.0.0.1:{} (forwarded)", g.boot_time, g.csi_port));
    let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", g.csi_port))?.connect().await?;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while !IdentityClient::new(ch.clone())
        .probe(csi::ProbeRequest {})
        .await
        .is_ok_and(|r| r.into_inner().ready == Some(true))
    {
        if Instant::now() > deadline {
            bail!("the node plugin in the guest did not become ready");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let mut node = NodeClient::new(ch);

    step(2, "pvesim: Proxmox VE with VM 112 bound to the guest's QMP socket");
    let images = d.join("disks");
    std::fs::create_dir_all(&images)?;
    let state = CLUSTER.replace(
        "name: worker-2, config:",
        &format!("name: worker-2, qmp: \"{}\", config:", g.qmp.display()),
    );
    let sim = Sim::new(State::from_yaml(&state)?).volume_dir(images.clone()).start("127.0.0.1:0").await?;
    let ca = d.join("pvesim-ca.pem");
    std::fs::write(&ca, sim.ca_pem.as_deref().unwrap_or_default())?;
    evidence(format!("API {}", sim.api_url()));

    step(3, "proxmox-csi-controller with a Go-driver-compatible cloud config");
    let (controller, ctl_sock) = start_controller(d, &sim.api_url(), &ca, "")?;
    let mut ctl = ControllerClient::new(channel(&ctl_sock).await?);
    let ni = node.node_get_info(csi::NodeGetInfoRequest {}).await?.into_inner();
    evidence(format!("node {} (VM id from the node id), max {} volumes", ni.node_id, ni.max_volumes_per_node));

    step(4, "CreateVolume: 1 GiB on local-lvm of pve2");
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
            parameters: HashMap::from([("storage".into(), "local-lvm".into())]),
            accessibility_requirements: Some(csi::TopologyRequirement { requisite: vec![topo.clone()], preferred: vec![topo] }),
            ..Default::default()
        })
        .await?
        .into_inner()
        .volume
        .context("no volume")?;
    evidence(format!("volume_id {}", vol.volume_id));

    step(5, "ControllerPublishVolume: hot-plugged into the running guest (blockdev-add, device_add)");
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: ni.node_id.clone(),
        volume_capability: Some(mount_cap()),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    };
    let t = Instant::now();
    let pc = ctl.controller_publish_volume(publish.clone()).await?.into_inner().publish_context;
    let vm: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
    let slot = format!("scsi{}", pc.get("lun").map(String::as_str).unwrap_or("?"));
    evidence(format!("{:?}: VM 112 {slot}: {}", t.elapsed(), vm["config"][&slot].as_str().unwrap_or("?")));
    let link = g.sh(&format!("udevadm settle; ls -l /dev/disk/by-id/wwn-{} | sed 's/.* \\/dev/\\/dev/'", pc["wwn"])).await?;
    evidence(format!("in the guest, udev: {link}"));

    step(6, "NodeStageVolume with a passphrase: LUKS2 (dm-crypt), xfs, mounted");
    let staging = "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/demo/globalmount";
    let target = "/var/lib/kubelet/pods/6f1e/volumes/kubernetes.io~csi/pvc-0c6e8a1b-demo/mount";
    g.sh("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/demo /var/lib/kubelet/pods/6f1e/volumes/kubernetes.io~csi/pvc-0c6e8a1b-demo").await?;
    let secrets = HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]);
    let stage = csi::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: pc.clone(),
        staging_target_path: staging.into(),
        volume_capability: Some(mount_cap()),
        secrets: secrets.clone(),
        volume_context: vol.volume_context.clone(),
    };
    let t = Instant::now();
    node.node_stage_volume(stage.clone()).await?;
    evidence(format!("staged in {:?}", t.elapsed()));
    evidence(g.sh(&format!("grep {staging} /proc/mounts")).await?);
    evidence(g.sh("cryptsetup status $(ls /dev/mapper | grep pvecsi) | grep -E 'type|cipher|keysize'").await?);

    step(7, "NodePublishVolume, then 8 MiB written in the pod's mount and checksummed");
    let publish_node = csi::NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    };
    node.node_publish_volume(publish_node.clone()).await?;
    let sum = g.sh(&format!("dd if=/dev/urandom of={target}/data bs=1M count=8 2>/dev/null && sync && sha256sum {target}/data | cut -c1-16")).await?;
    evidence(format!("sha256 {sum}…"));

    step(8, "grow to 2 GiB online: Proxmox resize (block_resize), then cryptsetup resize + xfs_growfs");
    ctl.controller_expand_volume(csi::ControllerExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    })
    .await?;
    node.node_expand_volume(csi::NodeExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        volume_path: target.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
        staging_target_path: staging.into(),
        volume_capability: Some(mount_cap()),
        secrets: secrets.clone(),
    })
    .await?;
    evidence(g.sh(&format!("df -hP {target} | tail -1")).await?);

    step(9, "down: unpublish, unstage (LUKS closed), ControllerUnpublish (the guest sees the disk go)");
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), target_path: target.into() }).await?;
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: staging.into() }).await?;
    ctl.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), node_id: ni.node_id.clone(), ..Default::default() }).await?;
    let gone = g.sh_status(&format!("udevadm settle; test -e /dev/disk/by-id/wwn-{}", pc["wwn"])).await?.0 != 0;
    evidence(format!("mappings left: {:?}; wwn link gone: {gone}", g.sh("ls /dev/mapper | grep -c pvecsi || true").await?));

    step(10, "attach again: the LUKS volume is opened, not formatted, and the data is there");
    let pc = ctl.controller_publish_volume(publish).await?.into_inner().publish_context;
    let mut stage = stage;
    stage.publish_context = pc;
    node.node_stage_volume(stage).await?;
    node.node_publish_volume(publish_node).await?;
    let again = g.sh(&format!("sha256sum {target}/data | cut -c1-16")).await?;
    evidence(format!("sha256 {again}… — {}", if again == sum { "identical" } else { "DIFFERENT (bug)" }));
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), target_path: target.into() }).await?;
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: staging.into() }).await?;
    ctl.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), node_id: ni.node_id.clone(), ..Default::default() }).await?;

    step(11, "DeleteVolume: nothing left on the VM or the storage");
    ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), ..Default::default() }).await?;
    let vm: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
    let vols: serde_json::Value = reqwest_json(&sim.addr.to_string(), "volumes").await?;
    let left = vols.as_array().map(|a| a.iter().filter(|v| v["volid"].as_str().unwrap_or_default().contains("demo")).count()).unwrap_or(0);
    evidence(format!("VM 112 {slot}: {}; pending: {}; volumes left: {left}", if vm["config"].get(&slot).is_some() { "still there (bug)" } else { "gone" }, vm["pending"].as_object().map(|p| p.len()).unwrap_or(0)));

    step(12, "clean shutdown, and no secret in any log");
    evidence(controller.stop()?);
    let guest_logs = g.sh("cat /run/hostd.log /run/node.log").await?;
    let leaked = guest_logs.contains(PASSPHRASE) || std::fs::read_to_string(d.join("controller.log"))?.contains(SECRET);
    evidence(format!("token secret or passphrase in the logs: {}", if leaked { "YES (bug)" } else { "no" }));
    if leaked || left > 0 || again != sum {
        bail!("the demo found a problem (see above)");
    }
    println!("\nDemo finished.");
    Ok(())
}
