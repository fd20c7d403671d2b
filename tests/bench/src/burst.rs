//! Attach burst: N volumes published at once to one VM, with Proxmox's
//! costs (20 ms per API call, 300 ms per config write that hot-plugs, 10 s
//! lock timeout), by this controller (coalescing per VM) and by the Go
//! driver's one-at-a-time strategy, on fresh simulators, side by side.

use std::time::Instant;

use anyhow::{Context, Result};
use callers::{attacher, provisioner};
use futures::future::join_all;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::Request;

use crate::golike::GoLike;
use crate::sim::{Sim, cluster};

const KNOBS: &str = r#"{"api_latency_ms": 20, "hotplug_latency_ms": 300, "lock_timeout_ms": 10000}"#;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub seconds: f64,
    pub writes: u64,
    pub calls: u64,
    pub attached: usize,
}


/// Creates `n` volumes on pve1 (latency off), as the provisioner does, then
/// sets the costs; the PersistentVolumes it wrote.
async fn prepared(n: usize) -> Result<(Sim, Vec<callers::PersistentVolume>)> {
    let sim = Sim::start(&cluster(1, 1, "")).await?;
    let ctl = sim.controller()?;
    let sc = provisioner::StorageClass::new(&[("storage", "local-lvm"), ("csi.storage.k8s.io/fstype", "ext4")]);
    let term = [("topology.kubernetes.io/region", "region-1"), ("topology.kubernetes.io/zone", "pve1")];
    let mut pvs = Vec::new();
    for i in 0..n {
        let claim = provisioner::Claim::new(&format!("burst-{i:02}"), &format!("burst-{i:02}"), 1 << 30);
        let r = provisioner::create_volume(&sc, &claim, Some(provisioner::requirement(&[&term], 0)));
        let v = ctl.create_volume(Request::new(r)).await?.into_inner().volume.context("no volume")?;
        pvs.push(provisioner::persistent_volume(&sc, &claim, &v));
    }
    sim.knobs(KNOBS).await?;
    sim.reset_counters().await?;
    Ok((sim, pvs))
}

async fn attached(sim: &Sim) -> Result<usize> {
    let vm = sim.admin(reqwest::Method::GET, "vms/200", "").await?;
    Ok(vm["config"].as_object().map(|m| m.keys().filter(|k| k.strip_prefix("scsi").is_some_and(|n| n.parse::<u32>().is_ok())).count()).unwrap_or(0))
}

/// This controller: every publish at once, as the attacher sends them.
pub async fn ours(n: usize) -> Result<Outcome> {
    let (sim, vols) = prepared(n).await?;
    let ctl = sim.controller()?;
    let started = Instant::now();
    let calls = vols.iter().map(|pv| {
        let ctl = ctl.clone();
        let req = attacher::controller_publish(pv, "worker-200/200");
        async move { ctl.controller_publish_volume(Request::new(req)).await }
    });
    for r in join_all(calls).await {
        r.context("publish")?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let (calls, writes) = sim.calls_and_writes().await?;
    Ok(Outcome { seconds, writes, calls, attached: attached(&sim).await? })
}

/// The Go driver's strategy on the same burst.
pub async fn go_like(n: usize) -> Result<Outcome> {
    let (sim, vols) = prepared(n).await?;
    let go = GoLike::new(&sim.api_url());
    let started = Instant::now();
    let calls = vols.iter().enumerate().map(|(i, v)| {
        let disk = v.handle.rsplit('/').next().unwrap_or_default().to_string();
        let go = &go;
        async move { go.attach("pve1", 200, "local-lvm", &format!("local-lvm:{disk}"), &format!("0x5056432d4944{i:04x}")).await }
    });
    for r in join_all(calls).await {
        r?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let (calls, writes) = sim.calls_and_writes().await?;
    Ok(Outcome { seconds, writes, calls, attached: attached(&sim).await? })
}
