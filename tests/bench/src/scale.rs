//! Scale: volumes created and published over many VMs with 50 ms per API
//! call, 300 ms per plugged disk and 10 s of RRD lag (pvesim knobs; see
//! burst.rs and docs/proxmox-fidelity.md for their sources), against the
//! controller binary (its memory is measured too). At each checkpoint the
//! latencies and the Proxmox calls per operation are taken for a window of
//! operations, to show they stay flat as volumes grow. At the end the
//! controller is restarted and its first publish timed: the attachment
//! index is rebuilt from every VM's config.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use callers::{attacher, provisioner};
use futures::stream::{self, StreamExt};
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use tonic::transport::Channel;

use crate::percentile;
use crate::sim::{Sim, cluster};

pub const NODES: usize = 3;
pub const VMS_PER_NODE: usize = 10;

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
    pub rss_kib: u64,
}

#[derive(Debug, Clone)]
pub struct Run {
    pub idle_rss_kib: u64,
    pub checkpoints: Vec<Checkpoint>,
    pub peak_rss_kib: u64,
    /// The first ControllerPublish after a restart, and its Proxmox calls.
    pub restart_publish_ms: f64,
    pub restart_publish_calls: u64,
}

/// Per-disk hot-plug cost and RRD lag of the scale run.
pub const PER_DISK_MS: u64 = 300;
pub const RRD_LAG_MS: u64 = 10_000;

fn zone_of(i: usize) -> String {
    format!("pve{}", i % NODES + 1)
}

fn class() -> provisioner::StorageClass {
    provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ])
}

fn claim(i: usize) -> provisioner::Claim {
    provisioner::Claim::new(&format!("scale-{i:05}"), &format!("scale-{i:05}"), 1 << 30)
}

/// CreateVolume as the provisioner sends it for claim `i`, its pod's node in `zone_of(i)`.
fn create_req(i: usize) -> csi::CreateVolumeRequest {
    let zone = zone_of(i);
    let term = [
        ("topology.kubernetes.io/region", "region-1"),
        ("topology.kubernetes.io/zone", zone.as_str()),
    ];
    provisioner::create_volume(
        &class(),
        &claim(i),
        Some(provisioner::requirement(&[&term], 0)),
    )
}

/// The VM a volume made for zone `pve<n>` is published to: one per node, in turn.
fn vm_for(i: usize, round: usize) -> (String, u32) {
    let node = i % NODES;
    let vmid = 200 + node * VMS_PER_NODE + round % VMS_PER_NODE;
    (format!("worker-{vmid}/{vmid}"), vmid as u32)
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

pub async fn run(sizes: &[usize], concurrency: usize, latency_ms: u64) -> Result<Run> {
    let sim = Sim::start(&cluster(NODES, VMS_PER_NODE, "")).await?;
    let dir = tempfile::tempdir()?;
    let (proc, socket) = demo::common::start_controller_with(dir.path(), &sim.cloud_config())?;
    let ch: Channel = demo::common::channel(&socket).await?;
    let ctl = ControllerClient::new(ch);
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
                    let (r, ms) = timed(ctl.create_volume(create_req(i))).await?;
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
        // of its node), then the unpublishes.
        let round = checkpoints.len();
        let window: Vec<(usize, &callers::PersistentVolume)> = (made - NODES * VMS_PER_NODE..made)
            .map(|i| (i, &pvs[i]))
            .collect();
        sim.reset_counters().await?;
        let mut publish_ms = Vec::new();
        let pubs = window.iter().map(|(i, pv)| {
            let mut ctl = ctl.clone();
            let (node_id, _) = vm_for(*i, round + *i / NODES);
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
        sim.reset_counters().await?;
        let unpubs = window.iter().map(|(i, pv)| {
            let mut ctl = ctl.clone();
            let (node_id, _) = vm_for(*i, round + *i / NODES);
            let req = attacher::controller_unpublish(pv, &node_id);
            async move { ctl.controller_unpublish_volume(req).await }
        });
        for r in futures::future::join_all(unpubs).await {
            r.map_err(|s| anyhow::anyhow!("unpublish: {}", s.message()))?;
        }
        let (calls, _) = sim.calls_and_writes().await?;
        checkpoints.push(Checkpoint {
            volumes: made,
            create_p50_ms: percentile(&mut create_ms.clone(), 50.0),
            create_p99_ms: percentile(&mut create_ms, 99.0),
            calls_per_create,
            publish_p50_ms: percentile(&mut publish_ms.clone(), 50.0),
            publish_p99_ms: percentile(&mut publish_ms, 99.0),
            calls_per_publish,
            calls_per_unpublish: calls as f64 / window.len() as f64,
            rss_kib: crate::rss_kib(proc.pid()).0,
        });
    }
    let peak_rss_kib = crate::rss_kib(proc.pid()).1;
    proc.stop().await.map_err(anyhow::Error::msg)?;

    // Restarted: the first publish rebuilds what the controller knows.
    let dir = tempfile::tempdir()?;
    let (proc, socket) = demo::common::start_controller_with(dir.path(), &sim.cloud_config())?;
    let mut ctl = ControllerClient::new(demo::common::channel(&socket).await?);
    sim.reset_counters().await?;
    let last = made - 1;
    let (node_id, _) = vm_for(last, 0);
    let (_, restart_publish_ms) =
        timed(ctl.controller_publish_volume(attacher::controller_publish(&pvs[last], &node_id)))
            .await?;
    let (restart_publish_calls, _) = sim.calls_and_writes().await?;
    proc.stop().await.map_err(anyhow::Error::msg)?;
    Ok(Run {
        idle_rss_kib,
        checkpoints,
        peak_rss_kib,
        restart_publish_ms,
        restart_publish_calls,
    })
}
