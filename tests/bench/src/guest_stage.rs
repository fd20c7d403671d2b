//! In the guest VM: NodeStage of a new LUKS volume (hostd: wait for the
//! disk, its checks and probe, the wipe, luksFormat, open, mkfs.xfs, the
//! claim, mount) against the bare commands `cryptsetup luksFormat` +
//! `open` + `mkfs.xfs` + `mount` on another hot-plugged disk of the same
//! size, with the same key derivation on both sides, alternating: PBKDF2
//! at 1000 iterations (as the guest's hostd is started for the tests),
//! then cryptsetup's default argon2id (as hostd runs by default). The
//! volumes are marked, as every volume CreateVolume makes with the
//! cluster's id. NodeStage is timed from the host and split by hostd's
//! `timings_ms`; the bare commands are timed one by one by the guest
//! kernel's clock. Then six argon2id stages at once, with the node
//! plugin's Probe (which asks hostd's Health) timed throughout.

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
use proxmox_csi_controller::volume::ClusterId;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use tonic::Request;
use tonic::transport::Channel;

use crate::guest_node::{Journey, Phases, Worker, print_journey, probe_ready};
use crate::percentile;
use crate::stage::CLUSTER;

const PASSPHRASE: &str = "bench passphrase, not a secret";

/// Creates and hot-plugs a 1 GiB volume into the guest, as the provisioner
/// and the attacher do; its PersistentVolume and publish context.
async fn plugged(
    ctl: &ControllerService,
    uid: &str,
) -> Result<(callers::PersistentVolume, HashMap<String, String>)> {
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ]);
    let claim = provisioner::Claim::new(uid, uid, 1 << 30);
    let pv = crate::sim::provision(ctl, &sc, &claim, "pve2").await?;
    let pc = ctl
        .controller_publish_volume(Request::new(attacher::controller_publish(
            &pv,
            "worker-2/112",
        )))
        .await?
        .into_inner()
        .publish_context;
    Ok((pv, pc))
}

/// The key derivation both sides use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kdf {
    Pbkdf2,
    Argon2id,
}

impl Kdf {
    /// hostd's `--luks-pbkdf`.
    fn hostd(self) -> &'static str {
        match self {
            Self::Pbkdf2 => "pbkdf2:1000",
            Self::Argon2id => "argon2id",
        }
    }

    /// cryptsetup's arguments for the same.
    fn cryptsetup(self) -> &'static str {
        match self {
            Self::Pbkdf2 => "--pbkdf pbkdf2 --pbkdf-force-iterations 1000",
            Self::Argon2id => "",
        }
    }
}

/// The bare command a NodeStage row stands against.
fn counterpart(phase: &str) -> &'static [&'static str] {
    match phase {
        "NodeStage: luksFormat" => &["cryptsetup luksFormat"],
        "NodeStage: LUKS open" => &["cryptsetup open"],
        "NodeStage: mkfs" => &["mkfs.xfs"],
        "NodeStage: mount" => &["mount"],
        _ => &[],
    }
}

/// What one guest run measured, in ms.
#[derive(Debug)]
pub struct Report {
    pub rounds: usize,
    /// Medians per key derivation, phase by phase: (NodeStage, bare
    /// commands).
    pub medians: Vec<(Kdf, (Phases, Phases))>,
    /// Six argon2id NodeStage calls at once: wall time of the last.
    pub six_wall: f64,
    /// Probe (hostd Health through the node plugin) during them.
    pub probes: usize,
    pub probe_p50: f64,
    pub probe_p90: f64,
    pub probe_p99: f64,
    pub probe_max: f64,
    /// Probes that took over 100 ms.
    pub probes_over_100ms: usize,
}

/// Restarts the guest's hostd with another key derivation and waits until
/// the node plugin's Probe says it answers.
async fn restart_hostd(g: &mut Guest, ch: &Channel, kdf: Kdf) -> Result<()> {
    g.sh(&format!(
        "sed -i 's/--luks-pbkdf [^ ]*/--luks-pbkdf {}/' /bin/start-hostd; kill $(pidof proxmox-csi-hostd); sleep 0.5; start-hostd & sleep 0.5",
        kdf.hostd()
    ))
    .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if probe_ready(ch).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "hostd did not answer again after its restart with {}",
        kdf.hostd()
    )
}

/// The bare commands on the disk `wwn` in the guest, each timed there by
/// the kernel's clock (from a settled disk, as NodeStage is); then undone.
async fn bare_stage(
    worker: &mut Worker,
    wwn: &str,
    kdf: Kdf,
    i: usize,
) -> Result<Vec<(&'static str, f64)>> {
    let dev = worker
        .guest
        .sh(&format!(
            "mkdir -p /mnt/bare{i}; udevadm settle; readlink -f /dev/disk/by-id/wwn-{wwn}"
        ))
        .await?;
    let steps = [
        (
            "cryptsetup luksFormat",
            format!(
                "printf %s '{PASSPHRASE}' | cryptsetup luksFormat --batch-mode --type luks2 \
                 --cipher aes-xts-plain64 --key-size 512 {} --key-file - {dev}",
                kdf.cryptsetup()
            ),
        ),
        (
            "cryptsetup open",
            format!("printf %s '{PASSPHRASE}' | cryptsetup open --key-file - {dev} bare{i}"),
        ),
        ("mkfs.xfs", format!("mkfs.xfs -q /dev/mapper/bare{i}")),
        ("mount", format!("mount /dev/mapper/bare{i} /mnt/bare{i}")),
    ];
    let commands: Vec<&str> = steps.iter().map(|(_, c)| c.as_str()).collect();
    let timed = worker.timed(&commands).await?;
    worker
        .guest
        .sh(&format!("umount /mnt/bare{i} && cryptsetup close bare{i}"))
        .await?;
    Ok(steps.iter().map(|(name, _)| *name).zip(timed).collect())
}

pub async fn run(rounds: usize) -> Result<Report> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut worker = Worker::start(Guest::boot().await?).await?;
    let ch = worker.channel.clone();
    let images = tempfile::tempdir()?;
    let state = e2e::guest::guest_cluster(&worker.guest.qmp, testkit::sim::MINIMAL_ROLE);
    let sim = testkit::sim::plain_with(&state, |s| s.volume_dir(images.path().to_path_buf()))
        .await
        .map_err(anyhow::Error::msg)?;
    let cfg = CloudConfig::parse(&testkit::sim::config_of(&sim))?;
    let mut controller = Controller::from_config(
        &cfg,
        Duration::from_secs(30),
        Default::default(),
        Duration::from_secs(60),
    )?;
    // As deployed: the disks CreateVolume makes carry the cluster's id.
    controller.cluster_id = Some(ClusterId::parse(CLUSTER).context("cluster id")?);
    let ctl = ControllerService(Arc::new(controller));
    let kubelet = Kubelet::new("/var/lib/kubelet");
    let secrets = || HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]);
    let mut medians = Vec::new();
    for kdf in [Kdf::Pbkdf2, Kdf::Argon2id] {
        restart_hostd(&mut worker.guest, &ch, kdf).await?;
        let (mut ours, mut bare) = (Journey::default(), Journey::default());
        for i in 0..rounds {
            let tag = format!("{}-{i}", kdf.hostd().replace(':', ""));
            let (pv, pc) = plugged(&ctl, &format!("ours-{tag}")).await?;
            // Both sides start from a disk whose udev events are done.
            worker.guest.sh("udevadm settle").await?;
            for (phase, ms) in worker.stage(&kubelet, &pv, &pc, secrets()).await? {
                ours.push(phase, ms);
            }
            worker
                .node
                .node_unstage_volume(kubelet.node_unstage(&pv))
                .await
                .map_err(|e| anyhow::anyhow!("NodeUnstage: {}", e.message()))?;

            let (_, pc) = plugged(&ctl, &format!("bare-{tag}")).await?;
            let wwn = pc.get("wwn").cloned().unwrap_or_default();
            for (step, ms) in bare_stage(&mut worker, &wwn, kdf, i).await? {
                bare.push(step, ms);
            }
        }
        medians.push((kdf, (ours.medians(), bare.medians())));
    }
    // Six argon2id stages at once; the Probe is asked every 100 ms meanwhile.
    let mut stages = Vec::new();
    for i in 0..6 {
        let (pv, pc) = plugged(&ctl, &format!("six-{i}")).await?;
        worker.mkdirs(kubelet.stage_dirs(&pv)).await?;
        stages.push(kubelet.node_stage(&pv, &pc, secrets()));
    }
    let started = Instant::now();
    let calls: Vec<_> = stages
        .into_iter()
        .map(|req| {
            let mut n = worker.node.clone();
            tokio::spawn(async move { n.node_stage_volume(req).await })
        })
        .collect();
    let mut probe = IdentityClient::new(ch.clone());
    let mut latencies = Vec::new();
    while !calls.iter().all(|c| c.is_finished()) {
        let t = Instant::now();
        probe
            .probe(callers::identity::probe())
            .await
            .map_err(|e| anyhow::anyhow!("Probe during the stages: {}", e.message()))?;
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for c in calls {
        c.await?
            .map_err(|e| anyhow::anyhow!("one of six NodeStage calls: {}", e.message()))?;
    }
    let six_wall = started.elapsed().as_secs_f64() * 1000.0;
    let probe_max = latencies.iter().cloned().fold(0.0, f64::max);
    let probes_over_100ms = latencies.iter().filter(|l| **l > 100.0).count();
    Ok(Report {
        rounds,
        medians,
        six_wall,
        probes: latencies.len(),
        probe_p50: percentile(&mut latencies, 50.0),
        probe_p90: percentile(&mut latencies, 90.0),
        probe_p99: percentile(&mut latencies, 99.0),
        probe_max,
        probes_over_100ms,
    })
}

/// Prints what [`run`] measured.
pub fn print(r: &Report) {
    println!(
        "guest stage: median of {} rounds, LUKS2 + xfs on hot-plugged 1 GiB disks (marked, as CreateVolume makes them), QEMU TCG, 1 GiB guest",
        r.rounds
    );
    for (kdf, journey) in &r.medians {
        print_journey(
            &format!("{kdf:?}: NodeStage"),
            "the bare commands",
            journey,
            counterpart,
        );
    }
    println!(
        "  six argon2id NodeStage calls at once: {:.0} ms until the last; Probe (hostd Health via the node plugin) {} times meanwhile: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms, {} over 100 ms",
        r.six_wall,
        r.probes,
        r.probe_p50,
        r.probe_p90,
        r.probe_p99,
        r.probe_max,
        r.probes_over_100ms
    );
}
