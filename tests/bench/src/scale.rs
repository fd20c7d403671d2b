//! Scale: volumes created and published over many VMs with 50 ms per API
//! call, against the controller binary (its memory is measured too). At
//! each checkpoint the latencies and the Proxmox calls per operation are
//! taken for a window of operations, to show they stay flat as volumes grow.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
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
}


fn zone_of(i: usize) -> String {
    format!("pve{}", i % NODES + 1)
}

fn create_req(i: usize) -> csi::CreateVolumeRequest {
    let topo = csi::Topology {
        segments: HashMap::from([
            ("topology.kubernetes.io/region".to_string(), "region-1".to_string()),
            ("topology.kubernetes.io/zone".to_string(), zone_of(i)),
        ]),
    };
    csi::CreateVolumeRequest {
        name: format!("pvc-scale-{i:05}"),
        capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
        volume_capabilities: vec![crate::mount_cap("ext4")],
        parameters: HashMap::from([("storage".to_string(), "local-lvm".to_string())]),
        accessibility_requirements: Some(csi::TopologyRequirement { requisite: vec![topo.clone()], preferred: vec![topo] }),
        ..Default::default()
    }
}

/// The VM a volume made for zone `pve<n>` is published to: one per node, in turn.
fn vm_for(i: usize, round: usize) -> (String, u32) {
    let node = i % NODES;
    let vmid = 200 + node * VMS_PER_NODE + round % VMS_PER_NODE;
    (format!("worker-{vmid}/{vmid}"), vmid as u32)
}

async fn timed<T, F: std::future::Future<Output = Result<T, tonic::Status>>>(f: F) -> Result<(T, f64)> {
    let t = Instant::now();
    let v = f.await.map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?;
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
    sim.knobs(&format!(r#"{{"api_latency_ms": {latency_ms}}}"#)).await?;

    let mut made = 0usize;
    let mut ids: Vec<String> = Vec::new();
    let mut checkpoints = Vec::new();
    for &target in sizes {
        sim.reset_counters().await?;
        let results: Vec<Result<(String, f64)>> = stream::iter(made..target)
            .map(|i| {
                let mut ctl = ctl.clone();
                async move {
                    let (r, ms) = timed(ctl.create_volume(create_req(i))).await?;
                    Ok((r.into_inner().volume.context("no volume")?.volume_id, ms))
                }
            })
            .buffered(concurrency)
            .collect()
            .await;
        let mut create_ms = Vec::new();
        for r in results {
            let (id, ms) = r?;
            ids.push(id);
            create_ms.push(ms);
        }
        let (calls, _) = sim.calls_and_writes().await?;
        let calls_per_create = calls as f64 / (target - made).max(1) as f64;
        made = target;

        // A publish to every VM at once (the last volumes made, each to a VM
        // of its node), then the unpublishes.
        let round = checkpoints.len();
        let window: Vec<(usize, String)> = (made - NODES * VMS_PER_NODE..made).map(|i| (i, ids[i].clone())).collect();
        sim.reset_counters().await?;
        let mut publish_ms = Vec::new();
        let pubs = window.iter().map(|(i, id)| {
            let mut ctl = ctl.clone();
            let (node_id, _) = vm_for(*i, round + *i / NODES);
            let req = csi::ControllerPublishVolumeRequest { volume_id: id.clone(), node_id, volume_capability: Some(crate::mount_cap("ext4")), ..Default::default() };
            async move { timed(ctl.controller_publish_volume(req)).await.map(|(_, ms)| ms) }
        });
        for r in futures::future::join_all(pubs).await {
            publish_ms.push(r?);
        }
        let (calls, _) = sim.calls_and_writes().await?;
        let calls_per_publish = calls as f64 / window.len() as f64;
        sim.reset_counters().await?;
        let unpubs = window.iter().map(|(i, id)| {
            let mut ctl = ctl.clone();
            let (node_id, _) = vm_for(*i, round + *i / NODES);
            let req = csi::ControllerUnpublishVolumeRequest { volume_id: id.clone(), node_id, ..Default::default() };
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
    proc.stop()?;
    Ok(Run { idle_rss_kib, checkpoints, peak_rss_kib })
}
