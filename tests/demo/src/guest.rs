//! The demo with a guest VM: VM 112 `worker-2` is a QEMU guest running hostd
//! and the node plugin; pvesim hot-plugs the disk into it over QMP as
//! Proxmox VE 9 does, udev in the guest names it by WWN, and the volume is
//! LUKS-encrypted with dm-crypt.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use callers::kubelet::Kubelet;
use callers::{attacher, provisioner, resizer};
use e2e::guest::Guest;
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use pvesim::{Sim, State};

use demo::common::*;

const PASSPHRASE: &str = "demo passphrase, never logged";

/// The directories kubelet makes before a call, made in the guest.
async fn mkdirs(g: &mut Guest, dirs: Vec<String>) -> Result<()> {
    g.sh(&format!("mkdir -p {}", dirs.join(" ")))
        .await
        .map(|_| ())
}

pub async fn run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    println!(
        "Proxmox CSI driver demo with a guest VM (work directory {})",
        d.display()
    );

    step(
        1,
        "the worker VM: a QEMU guest (TCG) running hostd and the node plugin",
    );
    let mut g = Guest::boot().await.context("booting the guest VM")?;
    evidence(format!(
        "booted in {:?}; node plugin on 127.0.0.1:{} (forwarded)",
        g.boot_time, g.csi_port
    ));
    let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", g.csi_port))?
        .connect()
        .await?;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while !IdentityClient::new(ch.clone())
        .probe(callers::identity::probe())
        .await
        .is_ok_and(|r| r.into_inner().ready == Some(true))
    {
        if Instant::now() > deadline {
            bail!("the node plugin in the guest did not become ready");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let mut node = NodeClient::new(ch);

    step(
        2,
        "pvesim: Proxmox VE with VM 112 bound to the guest's QMP socket",
    );
    let images = d.join("disks");
    std::fs::create_dir_all(&images)?;
    let state = CLUSTER.replace(
        "name: worker-2, config:",
        &format!("name: worker-2, qmp: \"{}\", config:", g.qmp.display()),
    );
    let sim = Sim::new(State::from_yaml(&state)?)
        .volume_dir(images.clone())
        .start("127.0.0.1:0")
        .await?;
    let ca = d.join("pvesim-ca.pem");
    std::fs::write(&ca, sim.ca_pem.as_deref().unwrap_or_default())?;
    evidence(format!("API {}", sim.api_url()));

    step(
        3,
        "proxmox-csi-controller with a Go-driver-compatible cloud config",
    );
    let (controller, ctl_sock) = start_controller(d, &sim.api_url(), &ca, "")?;
    let mut ctl = ControllerClient::new(channel(&ctl_sock).await?);
    let ni = node
        .node_get_info(callers::identity::node_get_info())
        .await?
        .into_inner();
    evidence(format!(
        "node {} (VM id from the node id), max {} volumes",
        ni.node_id, ni.max_volumes_per_node
    ));

    step(4, "CreateVolume: 1 GiB on local-lvm of pve2");
    // As the external-provisioner sends it for the claim, the pod's node
    // (worker-2, in pve2) as the preferred term. The class names the Secret
    // holding the LUKS passphrase for kubelet's NodeStage and NodeExpand; the
    // provisioner strips those keys from CreateVolume's parameters.
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "xfs"),
        ("csi.storage.k8s.io/node-stage-secret-name", "luks"),
        ("csi.storage.k8s.io/node-stage-secret-namespace", "default"),
        ("csi.storage.k8s.io/node-expand-secret-name", "luks"),
        ("csi.storage.k8s.io/node-expand-secret-namespace", "default"),
    ]);
    let claim = claim();
    let segments = ni.accessible_topology.clone().unwrap_or_default().segments;
    let vol = ctl
        .create_volume(provisioner::create_volume(
            &sc,
            &claim,
            Some(provisioner::requirement(&[&term(&segments)], 0)),
        ))
        .await?
        .into_inner()
        .volume
        .context("no volume")?;
    // The PersistentVolume it writes: what the attacher, resizer and kubelet build from.
    let pv = provisioner::persistent_volume(&sc, &claim, &vol);
    evidence(format!("volume_id {}", vol.volume_id));

    step(
        5,
        "ControllerPublishVolume: hot-plugged into the running guest (blockdev-add, device_add)",
    );
    let publish = attacher::controller_publish(&pv, &ni.node_id);
    let t = Instant::now();
    let pc = ctl
        .controller_publish_volume(publish.clone())
        .await?
        .into_inner()
        .publish_context;
    let vm: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
    let slot = format!("scsi{}", pc.get("lun").map(String::as_str).unwrap_or("?"));
    evidence(format!(
        "{:?}: VM 112 {slot}: {}",
        t.elapsed(),
        vm["config"][&slot].as_str().unwrap_or("?")
    ));
    let link = g
        .sh(&format!(
            "udevadm settle; ls -l /dev/disk/by-id/wwn-{} | sed 's/.* \\/dev/\\/dev/'",
            pc["wwn"]
        ))
        .await?;
    evidence(format!("in the guest, udev: {link}"));

    step(
        6,
        "NodeStageVolume with a passphrase: LUKS2 (dm-crypt), xfs, mounted",
    );
    // kubelet's layout in the guest (`--root-dir` /var/lib/kubelet): the
    // staging directory of the PV, made by kubelet before NodeStage.
    let kubelet = Kubelet::new("/var/lib/kubelet");
    let pod = pod();
    let staging = kubelet.staging_path(&pv);
    let target = kubelet.target_path(&pod, &pv);
    mkdirs(&mut g, kubelet.stage_dirs(&pv)).await?;
    let secrets = HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]);
    let t = Instant::now();
    node.node_stage_volume(kubelet.node_stage(&pv, &pc, secrets.clone()))
        .await?;
    evidence(format!("staged in {:?}", t.elapsed()));
    evidence(g.sh(&format!("grep {staging} /proc/mounts")).await?);
    evidence(
        g.sh("cryptsetup status $(ls /dev/mapper | grep pvecsi) | grep -E 'type|cipher|keysize'")
            .await?,
    );

    step(
        7,
        "NodePublishVolume, then 8 MiB written in the pod's mount and checksummed",
    );
    mkdirs(&mut g, kubelet.publish_dirs(&pod, &pv)).await?;
    node.node_publish_volume(kubelet.node_publish(&pv, &pod, &pc))
        .await?;
    let sum = g.sh(&format!("dd if=/dev/urandom of={target}/data bs=1M count=8 2>/dev/null && sync && sha256sum {target}/data | cut -c1-16")).await?;
    evidence(format!("sha256 {sum}…"));

    step(
        8,
        "grow to 2 GiB online: Proxmox resize (block_resize), then cryptsetup resize + xfs_growfs",
    );
    ctl.controller_expand_volume(resizer::controller_expand(&pv, 2 << 30))
        .await?;
    node.node_expand_volume(kubelet.node_expand(&pv, &pod, 2 << 30, secrets.clone()))
        .await?;
    evidence(g.sh(&format!("df -hP {target} | tail -1")).await?);

    step(
        9,
        "down: unpublish, unstage (LUKS closed), ControllerUnpublish (the guest sees the disk go)",
    );
    node.node_unpublish_volume(kubelet.node_unpublish(&pv, &pod))
        .await?;
    node.node_unstage_volume(kubelet.node_unstage(&pv)).await?;
    ctl.controller_unpublish_volume(attacher::controller_unpublish(&pv, &ni.node_id))
        .await?;
    let gone =
        g.sh_status(&format!(
            "udevadm settle; test -e /dev/disk/by-id/wwn-{}",
            pc["wwn"]
        ))
        .await?
        .0 != 0;
    evidence(format!(
        "mappings left: {:?}; wwn link gone: {gone}",
        g.sh("ls /dev/mapper | grep -c pvecsi || true").await?
    ));

    step(
        10,
        "attach again: the LUKS volume is opened, not formatted, and the data is there",
    );
    let pc = ctl
        .controller_publish_volume(publish)
        .await?
        .into_inner()
        .publish_context;
    mkdirs(&mut g, kubelet.stage_dirs(&pv)).await?;
    node.node_stage_volume(kubelet.node_stage(&pv, &pc, secrets.clone()))
        .await?;
    mkdirs(&mut g, kubelet.publish_dirs(&pod, &pv)).await?;
    node.node_publish_volume(kubelet.node_publish(&pv, &pod, &pc))
        .await?;
    let again = g
        .sh(&format!("sha256sum {target}/data | cut -c1-16"))
        .await?;
    evidence(format!(
        "sha256 {again}… — {}",
        if again == sum {
            "identical"
        } else {
            "DIFFERENT (bug)"
        }
    ));
    node.node_unpublish_volume(kubelet.node_unpublish(&pv, &pod))
        .await?;
    node.node_unstage_volume(kubelet.node_unstage(&pv)).await?;
    ctl.controller_unpublish_volume(attacher::controller_unpublish(&pv, &ni.node_id))
        .await?;

    step(11, "DeleteVolume: nothing left on the VM or the storage");
    ctl.delete_volume(provisioner::delete_volume(&pv)).await?;
    let vm: serde_json::Value = reqwest_json(&sim.addr.to_string(), "vms/112").await?;
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
        "VM 112 {slot}: {}; pending: {}; volumes left: {left}",
        if vm["config"].get(&slot).is_some() {
            "still there (bug)"
        } else {
            "gone"
        },
        vm["pending"].as_object().map(|p| p.len()).unwrap_or(0)
    ));

    step(12, "clean shutdown, and no secret in any log");
    evidence(stop(controller).await?);
    let guest_logs = g.sh("cat /run/hostd.log /run/node.log").await?;
    let leaked = guest_logs.contains(PASSPHRASE)
        || std::fs::read_to_string(d.join("controller.log"))?.contains(SECRET);
    evidence(format!(
        "token secret or passphrase in the logs: {}",
        if leaked { "YES (bug)" } else { "no" }
    ));
    if leaked || left > 0 || again != sum {
        bail!("the demo found a problem (see above)");
    }
    println!("\nDemo finished.");
    Ok(())
}
