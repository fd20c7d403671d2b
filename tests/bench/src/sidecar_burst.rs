//! Bursts as the sidecars send them: ControllerPublish calls through the
//! external-attacher's workers (`sidecar`), for arrival patterns a cluster
//! produces, on pvesim with the per-disk costs of `burst`.
//!
//! The patterns:
//! - a StatefulSet of 24 replicas scaled up with `podManagementPolicy:
//!   Parallel`: the controller creates every pod in one sync
//!   (kubernetes pkg/controller/statefulset stateful_set_control.go
//!   `runForAll` with `slowStartBatch`), so 24 VolumeAttachments at once;
//! - the same 24 arriving evenly over 0.5, 1 and 2 s, and at random
//!   (seeded) over 2 s: pods scheduled and bound as they come;
//! - the default `OrderedReady` StatefulSet: each pod is created once the
//!   one before is Running and Ready (`processReplica` returns while
//!   `!isRunningAndReady`), so one attach after another; the time between
//!   them (the pod's stage, mount and start) is the node's, not counted;
//! - 30 VMs taking 4 volumes each at once, in a seeded random order.
//!
//! Each run but one is on a controller that has written to each VM before
//! (`warm_up`), as one that has been running has; one burst is on a
//! controller just started.
//!
//! The floor is `sidecar::floor`: Proxmox's per-disk costs for the same
//! arrivals through the attacher's 10 workers, each call answered the
//! moment its own disk is plugged. "Proxmox alone" is the same with a
//! worker per call.

use std::time::{Duration, Instant};

use anyhow::Result;
use callers::{PersistentVolume, attacher};
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;

use crate::burst::{API_MS, Hw, PER_DISK_MS, disks, node_id, prepared, running_controller};
use crate::sidecar::{self, Attacher};

/// One pattern's run.
#[derive(Debug, Clone)]
pub struct Row {
    pub pattern: String,
    pub volumes: usize,
    pub seconds: f64,
    /// Through the attacher's workers.
    pub floor: f64,
    /// With a worker per call.
    pub proxmox_floor: f64,
    pub writes: u64,
    pub calls: u64,
    pub retries: u64,
    pub in_flight: usize,
}

impl Row {
    pub fn ratio(&self) -> f64 {
        self.seconds / self.floor
    }
}

/// A small deterministic generator (the runs are repeatable).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

const MS: fn(u64) -> Duration = Duration::from_millis;

fn even(n: usize, over: Duration) -> Vec<Duration> {
    (0..n)
        .map(|i| over.mul_f64(i as f64 / (n.max(2) - 1) as f64))
        .collect()
}

fn random(n: usize, over: Duration, seed: u64) -> Vec<Duration> {
    let mut g = Lcg(seed);
    let mut at: Vec<Duration> = (0..n)
        .map(|_| MS(g.next() % (over.as_millis() as u64 + 1)))
        .collect();
    at.sort();
    // The pattern starts with its first arrival.
    let first = at[0];
    at.iter().map(|a| *a - first).collect()
}

/// `vms` VMs x `per_vm` volumes published as `arrivals` say (one arrival
/// per volume, volume i to VM `vm_of(i)`), through the attacher.
async fn through_attacher(
    pattern: &str,
    vms: usize,
    per_vm: usize,
    arrivals: Vec<Duration>,
    vm_of: impl Fn(usize) -> u32,
    warm: bool,
) -> Result<Row> {
    let n = vms * per_vm;
    let (sim, pvs) = prepared(vms, n, Hw::Pci).await?;
    let ctl = running_controller(&sim).await?;
    if warm {
        warm_up(&ctl, &pvs, vms).await?;
    }
    let targets: Vec<u32> = (0..n).map(&vm_of).collect();
    let requests = pvs
        .iter()
        .zip(&targets)
        .map(|(pv, vm)| attacher::controller_publish(pv, &node_id(*vm)))
        .collect();
    let a = Attacher::default();
    sim.reset_counters().await?;
    let run = sidecar::publish_all(&ctl, a, requests, &arrivals).await?;
    let (calls, writes) = sim.calls_and_writes().await?;
    let mut on = 0;
    for vm in 0..vms {
        on += disks(&sim, 200 + vm as u32).await?;
    }
    anyhow::ensure!(on == n, "{pattern}: {on} of {n} disks attached");
    let (per_disk, api) = (MS(PER_DISK_MS), MS(API_MS));
    Ok(Row {
        pattern: pattern.to_string(),
        volumes: n,
        seconds: run.seconds,
        floor: sidecar::floor(a.workers, &arrivals, &targets, per_disk, api),
        proxmox_floor: sidecar::floor(n, &arrivals, &targets, per_disk, api),
        writes,
        calls,
        retries: run.retries,
        in_flight: run.in_flight,
    })
}

/// What a controller that has been running knows of each VM: one volume
/// published to it and taken off again, every VM at once (the controller
/// learns each VM's hot-plug pace from its writes, `attach::pace`).
async fn warm_up(ctl: &ControllerService, pvs: &[PersistentVolume], vms: usize) -> Result<()> {
    let each = |vm: usize| {
        let pv = &pvs[vm % pvs.len()];
        let node = node_id(200 + vm as u32);
        async move {
            ctl.controller_publish_volume(tonic::Request::new(attacher::controller_publish(
                pv, &node,
            )))
            .await?;
            ctl.controller_unpublish_volume(tonic::Request::new(attacher::controller_unpublish(
                pv, &node,
            )))
            .await?;
            Ok::<_, tonic::Status>(())
        }
    };
    for r in futures::future::join_all((0..vms.min(pvs.len())).map(each)).await {
        r?;
    }
    Ok(())
}

/// `n` volumes to one VM, each published once the one before was answered
/// (an OrderedReady StatefulSet); only the attaches are timed.
async fn one_after_another(n: usize) -> Result<Row> {
    let (sim, pvs) = prepared(1, n, Hw::Pci).await?;
    let ctl = running_controller(&sim).await?;
    warm_up(&ctl, &pvs, 1).await?;
    sim.reset_counters().await?;
    let mut seconds = 0.0;
    let mut retries = 0;
    for pv in &pvs {
        let req = attacher::controller_publish(pv, &node_id(200));
        let started = Instant::now();
        let run =
            sidecar::publish_all(&ctl, Attacher::default(), vec![req], &[Duration::ZERO]).await?;
        seconds += started.elapsed().as_secs_f64();
        retries += run.retries;
    }
    let (calls, writes) = sim.calls_and_writes().await?;
    anyhow::ensure!(
        disks(&sim, 200).await? == n,
        "OrderedReady: a disk is missing"
    );
    let one = sidecar::floor(1, &[Duration::ZERO], &[200], MS(PER_DISK_MS), MS(API_MS));
    Ok(Row {
        pattern: "StatefulSet, OrderedReady (one pod after another)".into(),
        volumes: n,
        seconds,
        floor: one * n as f64,
        proxmox_floor: one * n as f64,
        writes,
        calls,
        retries,
        in_flight: 1,
    })
}

/// Every pattern, one after another, each on a fresh simulator.
pub async fn run(volumes: usize) -> Result<Vec<Row>> {
    let n = volumes;
    let mut rows = vec![
        through_attacher(
            &format!("StatefulSet of {n}, Parallel (all at once)"),
            1,
            n,
            vec![Duration::ZERO; n],
            |_| 200,
            true,
        )
        .await?,
        through_attacher(
            &format!("StatefulSet of {n}, Parallel, the controller just started"),
            1,
            n,
            vec![Duration::ZERO; n],
            |_| 200,
            false,
        )
        .await?,
    ];
    for over in [500, 1000, 2000] {
        rows.push(
            through_attacher(
                &format!("{n} evenly over {:.1} s", over as f64 / 1000.0),
                1,
                n,
                even(n, MS(over)),
                |_| 200,
                true,
            )
            .await?,
        );
    }
    rows.push(
        through_attacher(
            &format!("{n} at random over 2 s (seed 7)"),
            1,
            n,
            random(n, MS(2000), 7),
            |_| 200,
            true,
        )
        .await?,
    );
    rows.push(one_after_another(n).await?);
    // 30 VMs x 4 in a seeded random order of VMs.
    let mut g = Lcg(11);
    let mut order: Vec<u32> = (0..120).map(|i| 200 + i / 4).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (g.next() % (i as u64 + 1)) as usize);
    }
    rows.push(
        through_attacher(
            "30 VMs x 4, all at once (random order)",
            30,
            4,
            vec![Duration::ZERO; 120],
            move |i| order[i],
            true,
        )
        .await?,
    );
    Ok(rows)
}
