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

use crate::percentile;
use crate::stage::split;

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

    /// kubelet's NodeStage of `pv` with its class's node-stage `secrets`:
    /// its rows (see [`stage_rows`]).
    pub async fn stage(
        &mut self,
        k: &Kubelet,
        pv: &PersistentVolume,
        pc: &HashMap<String, String>,
        secrets: HashMap<String, String>,
    ) -> Result<Vec<(&'static str, f64)>> {
        self.mkdirs(k.stage_dirs(pv)).await?;
        let t = Instant::now();
        self.node
            .node_stage_volume(k.node_stage(pv, pc, secrets))
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

/// hostd's phases of a NodeStage in the guest, in the order they run
/// (`timings_ms`, named in hostd.proto: [`PHASES`] with LUKS's), each with
/// the row that shows it.
const NODE_PHASES: [(&str, &str); 14] = [
    (
        "request",
        "NodeStage: hostd's request checks (paths, kubelet's records)",
    ),
    ("wait", WAIT),
    ("identity", "NodeStage: the disk's WWN and serial verified"),
    ("checks", "NodeStage: hostd's checks"),
    (
        "probe",
        "NodeStage: probe for a signature made since allocation",
    ),
    ("wipe", "NodeStage: wipe"),
    ("luks_plan", "NodeStage: LUKS header looked at"),
    ("luks_format", "NodeStage: luksFormat"),
    ("luks_open", "NodeStage: LUKS open"),
    ("plan", "NodeStage: plan (probe)"),
    ("mkfs", "NodeStage: mkfs"),
    ("claim", "NodeStage: claim"),
    ("mount", "NodeStage: mount"),
    ("record", "NodeStage: hostd's record"),
];

/// A NodeStage of `total` ms as rows: hostd's phases (`timings_ms`, see
/// [`split`]) and the rest (the node plugin, the RPCs, steps hostd does
/// not time).
pub fn stage_rows(total: f64, t: &HashMap<String, f64>) -> Vec<(&'static str, f64)> {
    let (phases, other) = split(NODE_PHASES.map(|(k, _)| k), total, |k| {
        t.get(k).copied().unwrap_or(0.0)
    });
    NODE_PHASES
        .into_iter()
        .map(|(_, label)| label)
        .zip(phases)
        .chain([("NodeStage: node plugin, RPCs, untimed", other)])
        .collect()
}

/// One journey's phases, in order: (name, ms).
pub type Phases = Vec<(&'static str, f64)>;

/// Per-phase samples of one journey over rounds, in the order first pushed.
#[derive(Debug, Default)]
pub struct Journey(Vec<(&'static str, Vec<f64>)>);

impl Journey {
    pub fn push(&mut self, phase: &'static str, ms: f64) {
        match self.0.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, v)) => v.push(ms),
            None => self.0.push((phase, vec![ms])),
        }
    }

    pub fn medians(mut self) -> Phases {
        self.0
            .iter_mut()
            .map(|(p, v)| (*p, percentile(v, 50.0)))
            .collect()
    }
}

/// Prints one journey: the driver's phases beside the baseline's (the
/// floor, or the bare commands) that `counterpart` names for each, the
/// totals, the largest gap. Phases under half a millisecond on both
/// sides are left out.
pub fn print_journey(
    name: &str,
    baseline: &str,
    (ours, base_phases): &(Phases, Phases),
    counterpart: fn(&str) -> &'static [&'static str],
) {
    let total = |p: &Phases| p.iter().map(|(_, ms)| ms).sum::<f64>();
    let (t, f) = (total(ours), total(base_phases));
    println!(
        "  {name}: {t:.0} ms against {baseline} of {f:.0} ms ({:.2}x)",
        t / f
    );
    println!("  | driver phase | ms | {baseline} counterpart | ms | gap ms |");
    let mut largest: Option<(&str, f64)> = None;
    for (phase, ms) in ours {
        let names = counterpart(phase);
        // `+ 0.0`: an empty sum of floats is -0.0.
        let base: f64 = base_phases
            .iter()
            .filter(|(f, _)| names.contains(f))
            .map(|(_, ms)| ms)
            .sum::<f64>()
            + 0.0;
        if ms.abs() < 0.5 && base < 0.5 {
            continue;
        }
        let gap = ms - base;
        println!(
            "  | {phase} | {ms:.0} | {} | {base:.0} | {gap:+.0} |",
            if names.is_empty() {
                "(none)".to_string()
            } else {
                names.join(" + ")
            }
        );
        if largest.is_none_or(|(_, g)| gap > g) {
            largest = Some((phase, gap));
        }
    }
    if let Some((phase, gap)) = largest {
        println!("  largest gap: {phase}, {gap:+.0} ms");
    }
}
