//! In the guest VM: NodeStage of a LUKS volume (hostd: wait for the disk,
//! luksFormat, open, mkfs.xfs, mount) against the bare commands
//! `cryptsetup luksFormat` + `open` + `mkfs.xfs` + `mount` on another
//! hot-plugged disk of the same size, with the same key derivation
//! (PBKDF2, 1000 iterations, as the guest's hostd is started with), both
//! timed from the host, alternating.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use callers::kubelet::Kubelet;
use callers::{attacher, provisioner};
use e2e::guest::Guest;
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::pve;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use tonic::Request;

use crate::percentile;
use crate::sim::{SECRET, TOKEN};

const PASSPHRASE: &str = "bench passphrase, not a secret";


/// Creates and hot-plugs a 1 GiB volume into the guest, as the provisioner
/// and the attacher do; its PersistentVolume and publish context.
async fn plugged(ctl: &ControllerService, uid: &str) -> Result<(callers::PersistentVolume, HashMap<String, String>)> {
    let sc = provisioner::StorageClass::new(&[("storage", "local-lvm"), ("csi.storage.k8s.io/fstype", "xfs")]);
    let claim = provisioner::Claim::new(uid, uid, 1 << 30);
    let term = [("topology.kubernetes.io/region", "region-1"), ("topology.kubernetes.io/zone", "pve2")];
    let v = ctl
        .create_volume(Request::new(provisioner::create_volume(&sc, &claim, Some(provisioner::requirement(&[&term], 0)))))
        .await?
        .into_inner()
        .volume
        .context("no volume")?;
    let pv = provisioner::persistent_volume(&sc, &claim, &v);
    let pc = ctl.controller_publish_volume(Request::new(attacher::controller_publish(&pv, "worker-2/112"))).await?.into_inner().publish_context;
    Ok((pv, pc))
}

/// Medians in ms: (NodeStage with LUKS, bare commands).
pub async fn compare(rounds: usize) -> Result<(f64, f64)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut g = Guest::boot().await?;
    let images = tempfile::tempdir()?;
    let state = format!(
        "nodes: [{{ name: pve2 }}]\nstorages: [{{ id: local-lvm, type: lvmthin, total: 107374182400 }}]\n\
         vms:\n  - {{ vmid: 112, node: pve2, name: worker-2, qmp: \"{}\", config: {{ scsihw: virtio-scsi-pci }} }}\n\
         users:\n  - {{ userid: kubernetes-csi@pve, tokens: [{{ name: csi, secret: {SECRET} }}] }}\n\
         roles:\n  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]\n\
         acl:\n  - {{ path: /, roles: [CSI], tokens: [\"{TOKEN}\"], users: [kubernetes-csi@pve] }}\n",
        g.qmp.display()
    );
    let sim = pvesim::Sim::new(pvesim::State::from_yaml(&state)?).plain_http().volume_dir(images.path().to_path_buf()).start("127.0.0.1:0").await?;
    let cfg = CloudConfig::parse(&format!("clusters:\n  - url: {}\n    token_id: {TOKEN}\n    token_secret: {SECRET}\n    region: region-1\n", sim.api_url()))?;
    let clients = cfg.clusters.into_iter().map(|c| pve::Client::new(c, Duration::from_secs(30), Default::default()).map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
    let ctl = ControllerService(Arc::new(Controller::new(clients, 9999, Duration::from_secs(60))));
    let deadline = Instant::now() + Duration::from_secs(60);
    // QEMU accepts the forwarded port before the guest listens: ready is
    // when Probe says hostd answers.
    let mut node = loop {
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", g.csi_port))?.connect().await {
            let mut probe = proxmox_csi_proto::csi::v1::identity_client::IdentityClient::new(ch.clone());
            if probe.probe(callers::identity::probe()).await.is_ok_and(|r| r.into_inner().ready == Some(true)) {
                break NodeClient::new(ch);
            }
        }
        if Instant::now() > deadline {
            bail!("the node plugin in the guest never answered");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let kubelet = Kubelet::new("/var/lib/kubelet");
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let (pv, pc) = plugged(&ctl, &format!("ours-{i}")).await?;
        for d in kubelet.stage_dirs(&pv) {
            g.sh(&format!("mkdir -p {d}")).await?;
        }
        let req = kubelet.node_stage(&pv, &pc, HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]));
        let t = Instant::now();
        node.node_stage_volume(req).await.map_err(|e| anyhow::anyhow!("NodeStage: {}", e.message()))?;
        ours.push(t.elapsed().as_secs_f64() * 1000.0);
        node.node_unstage_volume(kubelet.node_unstage(&pv)).await.map_err(|e| anyhow::anyhow!("NodeUnstage: {}", e.message()))?;

        let (_, pc) = plugged(&ctl, &format!("bare-{i}")).await?;
        let wwn = pc.get("wwn").cloned().unwrap_or_default();
        let dev = g.sh(&format!("udevadm settle; readlink -f /dev/disk/by-id/wwn-{wwn}")).await?;
        let cmd = format!(
            "printf %s '{PASSPHRASE}' | cryptsetup luksFormat --batch-mode --type luks2 --cipher aes-xts-plain64 --key-size 512 \
             --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file - {dev} && \
             printf %s '{PASSPHRASE}' | cryptsetup open --key-file - {dev} bare{i} && mkfs.xfs -q /dev/mapper/bare{i} && \
             mkdir -p /mnt/bare{i} && mount /dev/mapper/bare{i} /mnt/bare{i}"
        );
        let t = Instant::now();
        let (code, out) = g.sh_status(&cmd).await?;
        if code != 0 {
            bail!("bare commands failed: {out}");
        }
        bare.push(t.elapsed().as_secs_f64() * 1000.0);
        g.sh(&format!("umount /mnt/bare{i} && cryptsetup close bare{i}")).await?;
    }
    Ok((percentile(&mut ours, 50.0), percentile(&mut bare, 50.0)))
}
