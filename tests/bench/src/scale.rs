//! Scale: volumes created and published over many VMs with 50 ms per API
//! call, 300 ms per plugged disk and 10 s of RRD lag (pvesim knobs; see
//! burst.rs and docs/proxmox-fidelity.md for their sources), against the
//! controller binary (its memory is measured too). At each checkpoint the
//! latencies and the Proxmox calls per operation are taken for a window of
//! operations (one publish to every VM at once), to show they stay flat as
//! volumes grow; then ListVolumes as the external-attacher's reconcile sends
//! it (pkg/attacher/lister.go: no `max_entries`, `next_token` followed to
//! the end) while those publishes stand, with its calls per endpoint. At
//! the end the controller is restarted twice, cold each time: its first
//! ListVolumes, and its first publish (the attachment index is rebuilt from
//! VM configs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use callers::{attacher, provisioner};
use futures::stream::{self, StreamExt};
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use tonic::transport::Channel;

use crate::percentile;
use crate::sim::{Sim, cluster};

/// The counter of one VM config read.
pub const CONFIG_READ: &str = "GET /nodes/{node}/qemu/{vmid}/config";

/// Proxmox nodes and worker VMs: the VMs spread evenly, ids from 200.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub nodes: usize,
    pub vms: usize,
}

impl Shape {
    fn per_node(self) -> usize {
        self.vms / self.nodes
    }

    fn zone_of(self, i: usize) -> String {
        format!("pve{}", i % self.nodes + 1)
    }

    /// The VM a volume made for zone `pve<n>` is published to: one of its
    /// node's, in turn.
    fn vm_for(self, i: usize, round: usize) -> (String, u32) {
        let node = i % self.nodes;
        let vmid = 200 + node * self.per_node() + round % self.per_node();
        (format!("worker-{vmid}/{vmid}"), vmid as u32)
    }
}

/// One ListVolumes as the attacher sends it: every page, until `next_token`
/// is empty.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub ms: f64,
    pub pages: usize,
    pub entries: usize,
    /// Entries with a published node.
    pub published: usize,
    /// Proxmox calls per endpoint template.
    pub calls: BTreeMap<String, u64>,
}

impl Listing {
    pub fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }

    pub fn config_reads(&self) -> u64 {
        self.calls.get(CONFIG_READ).copied().unwrap_or(0)
    }

    /// `METHOD /template n`, most called first.
    pub fn by_endpoint(&self) -> String {
        let mut v: Vec<(&String, &u64)> = self.calls.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Figures at one checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub volumes: usize,
    pub create_p50_ms: f64,
    pub create_p99_ms: f64,
    pub calls_per_create: f64,
    pub publish_p50_ms: f64,
    pub publish_p99_ms: f64,
    pub calls_per_publish: f64,
    pub calls_per_unpublish: f64,
    pub list: Listing,
    /// Controller resident memory after the checkpoint's operations, and
    /// its peak since it started (VmHWM), KiB.
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
}

#[derive(Debug, Clone)]
pub struct Run {
    pub idle_rss_kib: u64,
    pub checkpoints: Vec<Checkpoint>,
    pub seconds: f64,
    /// The first ListVolumes after a restart, and the restarted
    /// controller's resident memory and peak after it.
    pub restart_list: Listing,
    pub restart_list_rss_kib: (u64, u64),
    /// The first ControllerPublish after a restart: its time, Proxmox
    /// calls and VM config reads among them.
    pub restart_publish_ms: f64,
    pub restart_publish_calls: u64,
    pub restart_publish_config_reads: u64,
}

/// Per-disk hot-plug cost and RRD lag of the scale run.
pub const PER_DISK_MS: u64 = 300;
pub const RRD_LAG_MS: u64 = 10_000;

fn class() -> provisioner::StorageClass {
    provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ])
}

fn claim(i: usize) -> provisioner::Claim {
    provisioner::Claim::new(&format!("scale-{i:05}"), &format!("scale-{i:05}"), 1 << 30)
}

/// CreateVolume as the provisioner sends it for claim `i`, its pod's node in `zone`.
fn create_req(i: usize, zone: &str) -> csi::CreateVolumeRequest {
    let term = [
        ("topology.kubernetes.io/region", "region-1"),
        ("topology.kubernetes.io/zone", zone),
    ];
    provisioner::create_volume(
        &class(),
        &claim(i),
        Some(provisioner::requirement(&[&term], 0)),
    )
}

async fn timed<T, F: std::future::Future<Output = Result<T, tonic::Status>>>(
    f: F,
) -> Result<(T, f64)> {
    let t = Instant::now();
    let v = f
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?;
    Ok((v, t.elapsed().as_secs_f64() * 1000.0))
}

/// ListVolumes as the external-attacher's reconcile sends it, every page,
/// with the Proxmox calls it made.
async fn list_all(ctl: &mut ControllerClient<Channel>, sim: &Sim) -> Result<Listing> {
    sim.reset_counters().await?;
    let mut l = Listing::default();
    let mut token = String::new();
    let t = Instant::now();
    loop {
        let (r, _) = timed(ctl.list_volumes(attacher::list_volumes(&token))).await?;
        let r = r.into_inner();
        l.pages += 1;
        l.entries += r.entries.len();
        l.published += r
            .entries
            .iter()
            .filter(|e| {
                e.status
                    .as_ref()
                    .is_some_and(|s| !s.published_node_ids.is_empty())
            })
            .count();
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    l.ms = t.elapsed().as_secs_f64() * 1000.0;
    l.calls = sim.counters().await?;
    Ok(l)
}

/// A controller started on `sim` with a gRPC client larger messages can
/// reach (a ListVolumes page of every volume).
async fn start(
    sim: &Sim,
) -> Result<(
    testkit::process::Proc,
    ControllerClient<Channel>,
    tempfile::TempDir,
)> {
    let dir = tempfile::tempdir()?;
    let (proc, socket) = demo::common::start_controller_with(dir.path(), &sim.cloud_config())?;
    let ch: Channel = demo::common::channel(&socket).await?;
    let ctl = ControllerClient::new(ch).max_decoding_message_size(64 << 20);
    Ok((proc, ctl, dir))
}

pub async fn run(
    shape: Shape,
    sizes: &[usize],
    concurrency: usize,
    latency_ms: u64,
) -> Result<Run> {
    ensure!(
        shape.nodes > 0 && shape.vms.is_multiple_of(shape.nodes),
        "{} VMs do not spread evenly over {} nodes",
        shape.vms,
        shape.nodes
    );
    ensure!(
        sizes.windows(2).all(|w| w[0] < w[1]) && sizes.first().is_some_and(|s| *s >= shape.vms),
        "checkpoints must grow, the first at least the VM count ({})",
        shape.vms
    );
    let began = Instant::now();
    let sim = Sim::start(&cluster(shape.nodes, shape.per_node(), "")).await?;
    let (proc, mut ctl, _dir) = start(&sim).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss_kib = crate::rss_kib(proc.pid()).0;
    sim.knobs(&format!(r#"{{"api_latency_ms": {latency_ms}, "hotplug_ms_per_disk": {PER_DISK_MS}, "rrd_lag_ms": {RRD_LAG_MS}}}"#)).await?;

    let mut made = 0usize;
    let mut pvs: Vec<callers::PersistentVolume> = Vec::new();
    let mut checkpoints = Vec::new();
    for &target in sizes {
        sim.reset_counters().await?;
        let results: Vec<Result<(callers::PersistentVolume, f64)>> = stream::iter(made..target)
            .map(|i| {
                let mut ctl = ctl.clone();
                async move {
                    let (r, ms) =
                        timed(ctl.create_volume(create_req(i, &shape.zone_of(i)))).await?;
                    let v = r.into_inner().volume.context("no volume")?;
                    Ok((provisioner::persistent_volume(&class(), &claim(i), &v), ms))
                }
            })
            .buffered(concurrency)
            .collect()
            .await;
        let mut create_ms = Vec::new();
        for r in results {
            let (pv, ms) = r?;
            pvs.push(pv);
            create_ms.push(ms);
        }
        let (calls, _) = sim.calls_and_writes().await?;
        let calls_per_create = calls as f64 / (target - made).max(1) as f64;
        made = target;

        // A publish to every VM at once (the last volumes made, each to a VM
        // of its node), ListVolumes while they stand, then the unpublishes.
        let round = checkpoints.len();
        let window: Vec<(usize, &callers::PersistentVolume)> =
            (made - shape.vms..made).map(|i| (i, &pvs[i])).collect();
        sim.reset_counters().await?;
        let mut publish_ms = Vec::new();
        let pubs = window.iter().map(|(i, pv)| {
            let mut ctl = ctl.clone();
            let (node_id, _) = shape.vm_for(*i, round + *i / shape.nodes);
            let req = attacher::controller_publish(pv, &node_id);
            async move {
                timed(ctl.controller_publish_volume(req))
                    .await
                    .map(|(_, ms)| ms)
            }
        });
        for r in futures::future::join_all(pubs).await {
            publish_ms.push(r?);
        }
        let (calls, _) = sim.calls_and_writes().await?;
        let calls_per_publish = calls as f64 / window.len() as f64;

        let list = list_all(&mut ctl, &sim).await?;
        ensure!(
            list.entries == made && list.published == window.len(),
            "ListVolumes at {made}: {} entries, {} published (expected {made}, {})",
            list.entries,
            list.published,
            window.len()
        );

        sim.reset_counters().await?;
        let unpubs = window.iter().map(|(i, pv)| {
            let mut ctl = ctl.clone();
            let (node_id, _) = shape.vm_for(*i, round + *i / shape.nodes);
            let req = attacher::controller_unpublish(pv, &node_id);
            async move { ctl.controller_unpublish_volume(req).await }
        });
        for r in futures::future::join_all(unpubs).await {
            r.map_err(|s| anyhow::anyhow!("unpublish: {}", s.message()))?;
        }
        let (calls, _) = sim.calls_and_writes().await?;
        let (rss_kib, peak_rss_kib) = crate::rss_kib(proc.pid());
        checkpoints.push(Checkpoint {
            volumes: made,
            create_p50_ms: percentile(&mut create_ms.clone(), 50.0),
            create_p99_ms: percentile(&mut create_ms, 99.0),
            calls_per_create,
            publish_p50_ms: percentile(&mut publish_ms.clone(), 50.0),
            publish_p99_ms: percentile(&mut publish_ms, 99.0),
            calls_per_publish,
            calls_per_unpublish: calls as f64 / window.len() as f64,
            list,
            rss_kib,
            peak_rss_kib,
        });
    }
    proc.stop().await.map_err(anyhow::Error::msg)?;

    // Restarted: the first ListVolumes (the attacher's reconcile) reads
    // every VM's config and lists every storage.
    let (proc, mut ctl, _dir) = start(&sim).await?;
    let restart_list = list_all(&mut ctl, &sim).await?;
    ensure!(
        restart_list.entries == made,
        "ListVolumes after the restart: {} entries of {made}",
        restart_list.entries
    );
    let restart_list_rss_kib = crate::rss_kib(proc.pid());
    proc.stop().await.map_err(anyhow::Error::msg)?;

    // Restarted again: the first publish rebuilds what the controller knows.
    let (proc, mut ctl, _dir) = start(&sim).await?;
    sim.reset_counters().await?;
    let last = made - 1;
    let (node_id, _) = shape.vm_for(last, 0);
    let (_, restart_publish_ms) =
        timed(ctl.controller_publish_volume(attacher::controller_publish(&pvs[last], &node_id)))
            .await?;
    let counters = sim.counters().await?;
    proc.stop().await.map_err(anyhow::Error::msg)?;
    Ok(Run {
        idle_rss_kib,
        checkpoints,
        seconds: began.elapsed().as_secs_f64(),
        restart_list,
        restart_list_rss_kib,
        restart_publish_ms,
        restart_publish_calls: counters.values().sum(),
        restart_publish_config_reads: counters.get(CONFIG_READ).copied().unwrap_or(0),
    })
}
