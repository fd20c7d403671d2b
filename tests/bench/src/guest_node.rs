//! A guest VM as a Kubernetes node for the benchmarks: its hostd and node
//! plugin called as kubelet calls them (`tests/callers`), each call timed
//! from the host, NodeStage split by hostd's own phases; shell steps timed
//! by the guest kernel's clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use callers::PersistentVolume;
use callers::kubelet::{Kubelet, Pod};
use e2e::guest::Guest;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use tonic::transport::Channel;

use crate::stage::{PHASES, split};

/// hostd's wait for the disk inside NodeStage: on a fresh attachment, the
/// udev event.
pub const WAIT: &str = "hostd's wait for the disk (udev event)";

pub fn since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Initializes the guest kernel's random pool before anything is timed:
/// the test guest has no hardware RNG under TCG, and the first getrandom
/// (mke2fs's UUIDs, cryptsetup's salts) blocks about 3 s while the kernel
/// gathers jitter entropy (linux drivers/char/random.c
/// `try_to_generate_entropy`). A read of /dev/random blocks the same way, once.
/// A worker VM with the host's CPU model has RDRAND and is ready at boot.
pub async fn random_ready(g: &mut Guest) -> Result<()> {
    g.sh("head -c 1 /dev/random > /dev/null").await.map(|_| ())
}

/// Whether the node plugin on `ch` answers Probe ready (it asks hostd).
pub async fn probe_ready(ch: &Channel) -> bool {
    let mut probe = IdentityClient::new(ch.clone());
    probe
        .probe(callers::identity::probe())
        .await
        .is_ok_and(|r| r.into_inner().ready == Some(true))
}

/// A guest and the node plugin inside it.
pub struct Worker {
    pub guest: Guest,
    /// The channel to the node plugin (QEMU's forwarded port).
    pub channel: Channel,
    pub node: NodeClient<Channel>,
    /// Kernel marks written so far (see [`Worker::timed`]).
    marks: usize,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("csi_port", &self.guest.csi_port)
            .field("marks", &self.marks)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Waits for the guest's random pool and its node plugin's readiness.
    pub async fn start(mut guest: Guest) -> Result<Self> {
        random_ready(&mut guest).await?;
        let endpoint = tonic::transport::Endpoint::from_shared(format!(
            "http://127.0.0.1:{}",
            guest.csi_port
        ))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        // QEMU accepts the forwarded port before the guest listens: ready
        // is when Probe says hostd answers.
        loop {
            if let Ok(ch) = endpoint.connect().await
                && probe_ready(&ch).await
            {
                return Ok(Self {
                    guest,
                    node: NodeClient::new(ch.clone()),
                    channel: ch,
                    marks: 0,
                });
            }
            if Instant::now() > deadline {
                bail!("the node plugin in a guest never answered");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn mkdirs(&mut self, dirs: Vec<String>) -> Result<()> {
        self.guest
            .sh(&format!("mkdir -p {}", dirs.join(" ")))
            .await
            .map(|_| ())
    }

    /// kubelet's NodeStage of `pv`: its rows (see [`stage_rows`]).
    pub async fn stage(
        &mut self,
        k: &Kubelet,
        pv: &PersistentVolume,
        pc: &HashMap<String, String>,
    ) -> Result<Vec<(&'static str, f64)>> {
        self.mkdirs(k.stage_dirs(pv)).await?;
        let t = Instant::now();
        self.node
            .node_stage_volume(k.node_stage(pv, pc, HashMap::new()))
            .await
            .map_err(|e| anyhow::anyhow!("NodeStage: {}", e.message()))?;
        let ms = since(t);
        Ok(stage_rows(ms, &self.last_timings().await?))
    }

    /// kubelet's NodePublish of `pv` for `pod`: its ms.
    pub async fn publish(
        &mut self,
        k: &Kubelet,
        pv: &PersistentVolume,
        pod: &Pod,
        pc: &HashMap<String, String>,
    ) -> Result<f64> {
        self.mkdirs(k.publish_dirs(pod, pv)).await?;
        let t = Instant::now();
        self.node
            .node_publish_volume(k.node_publish(pv, pod, pc))
            .await
            .map_err(|e| anyhow::anyhow!("NodePublish: {}", e.message()))?;
        Ok(since(t))
    }

    /// kubelet's NodeUnpublish of `pv` for `pod`, then its NodeUnstage:
    /// the ms of each.
    pub async fn release(
        &mut self,
        k: &Kubelet,
        pv: &PersistentVolume,
        pod: &Pod,
    ) -> Result<[f64; 2]> {
        let t = Instant::now();
        self.node
            .node_unpublish_volume(k.node_unpublish(pv, pod))
            .await
            .map_err(|e| anyhow::anyhow!("NodeUnpublish: {}", e.message()))?;
        let unpublished = since(t);
        let t = Instant::now();
        self.node
            .node_unstage_volume(k.node_unstage(pv))
            .await
            .map_err(|e| anyhow::anyhow!("NodeUnstage: {}", e.message()))?;
        Ok([unpublished, since(t)])
    }

    /// Fails unless `pod` reads round `i`'s bytes from `pv`.
    pub async fn reads_kept(
        &mut self,
        k: &Kubelet,
        pv: &PersistentVolume,
        pod: &Pod,
        i: usize,
    ) -> Result<()> {
        let kept = self
            .guest
            .sh(&format!("cat {}/kept", k.target_path(pod, pv)))
            .await?;
        if !kept.contains(&format!("journey-{i}")) {
            bail!("pod {} reads {kept:?}", pod.uid);
        }
        Ok(())
    }

    /// hostd's phases of the last NodeStage, from the node plugin's log
    /// line (`timings_ms=[("checks", 8), ("wait", 12), …]`).
    pub async fn last_timings(&mut self) -> Result<HashMap<String, f64>> {
        let line = self
            .guest
            .sh("grep 'volume staged' /run/node.log | tail -1")
            .await?;
        let list = line
            .split("timings_ms=[")
            .nth(1)
            .and_then(|r| r.split(']').next())
            .with_context(|| format!("no timings in the node plugin's line: {line}"))?;
        Ok(list
            .split("), ")
            .filter_map(|pair| {
                let (k, v) = pair
                    .trim_matches(|c| c == '(' || c == ')')
                    .split_once(", ")?;
                Some((k.trim_matches('"').to_string(), v.parse().ok()?))
            })
            .collect())
    }

    /// Runs `steps` (shell, one per phase) in the guest, each timed there
    /// by the kernel's clock: a line written to /dev/kmsg before and after
    /// each (the guest's `date` has no sub-second field); the ms of each.
    pub async fn timed(&mut self, steps: &[&str]) -> Result<Vec<f64>> {
        self.marks += 1;
        let tag = |i: usize| format!("bench-mark-{}-{i}", self.marks);
        // Unlimited: the kernel drops /dev/kmsg lines past 10 in 5 s otherwise
        // (linux kernel/printk/printk.c `devkmsg_write`, `printk_devkmsg`).
        let mut script = format!(
            "echo on > /proc/sys/kernel/printk_devkmsg && echo {} > /dev/kmsg",
            tag(0)
        );
        for (i, s) in steps.iter().enumerate() {
            script.push_str(&format!(" && {s} && echo {} > /dev/kmsg", tag(i + 1)));
        }
        script.push_str(&format!(" && dmesg | grep 'bench-mark-{}-'", self.marks));
        let out = self.guest.sh(&script).await?;
        // `[   12.345678] bench-mark-3-1`: seconds since boot, as the kernel
        // formats its log for dmesg (linux kernel/printk/printk.c `print_time`).
        let at: Vec<f64> = (0..=steps.len())
            .map(|i| {
                let t = tag(i);
                out.lines()
                    .find(|l| l.trim_end().ends_with(&t))
                    .and_then(|l| l.split(']').next())
                    .and_then(|s| s.trim_start_matches('[').trim().parse::<f64>().ok())
                    .with_context(|| format!("no kernel mark {t} in: {out}"))
            })
            .collect::<Result<_>>()?;
        Ok(at.windows(2).map(|w| (w[1] - w[0]) * 1000.0).collect())
    }
}

/// How a NodeStage row names each of hostd's phases ([`PHASES`]).
const LABELS: [&str; PHASES.len()] = [
    "NodeStage: hostd's request checks (paths, kubelet's records)",
    WAIT,
    "NodeStage: the disk's WWN and serial verified",
    "NodeStage: hostd's checks",
    "NodeStage: probe for a signature made since allocation",
    "NodeStage: wipe",
    "NodeStage: plan (probe)",
    "NodeStage: mkfs",
    "NodeStage: claim",
    "NodeStage: mount",
    "NodeStage: hostd's record",
];

/// A NodeStage of `total` ms as rows: hostd's phases (`timings_ms`, see
/// [`split`]) and the rest (the node plugin, the RPCs, steps hostd does
/// not time).
pub fn stage_rows(total: f64, t: &HashMap<String, f64>) -> Vec<(&'static str, f64)> {
    let (phases, other) = split(total, |k| t.get(k).copied().unwrap_or(0.0));
    LABELS
        .into_iter()
        .zip(phases)
        .chain([("NodeStage: node plugin, RPCs, untimed", other)])
        .collect()
}
