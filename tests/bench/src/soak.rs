//! The fault campaign: random create, publish, unpublish, expand, modify,
//! snapshot and delete against pvesim while faults are injected (5xx,
//! dropped connections, held config locks, `lock: backup`, failed
//! hot-plugs, tasks failing after their UPID) and the controller binary is
//! SIGKILLed at random moments and restarted. A driver loop retries each
//! CSI call as the sidecars do, until it succeeds. At the end Proxmox's
//! state is checked against what the driver was told.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use callers::{attacher, provisioner, resizer, snapshotter};
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::Value;
use tonic::Code;

use crate::sim::{Sim, cluster};

/// Worker VMs: 200, 201 on pve1; 202, 203 on pve2.
const VMS: [(u32, &str); 4] = [(200, "pve1"), (201, "pve1"), (202, "pve2"), (203, "pve2")];
/// An operation that has not succeeded after this long is a violation.
const CONVERGE: Duration = Duration::from_secs(90);

#[derive(Debug, Clone)]
struct Vol {
    name: String,
    id: String,
    /// The PersistentVolume the provisioner wrote: what the attacher,
    /// resizer and snapshotter build their requests from.
    pv: Option<callers::PersistentVolume>,
    zone: &'static str,
    bytes: u64,
    on: Option<u32>,
    snapshots: Vec<(String, String)>,
}

/// What a run did and found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub seed: u64,
    pub operations: BTreeMap<&'static str, u64>,
    pub faults: BTreeMap<&'static str, u64>,
    pub retries: u64,
    pub violations: Vec<String>,
}

impl Outcome {
    /// Operations, faults and violations, for people.
    pub fn render(&self) -> String {
        let mut s = format!("seed {}\noperations:", self.seed);
        for (k, n) in &self.operations {
            s.push_str(&format!(" {k} {n},"));
        }
        s.push_str(&format!(
            " ({} in all, {} retried calls)\nfaults:",
            self.operations.values().sum::<u64>(),
            self.retries
        ));
        for (k, n) in &self.faults {
            s.push_str(&format!(" {k} {n},"));
        }
        s.push_str(&format!(
            " ({} in all)\nviolations: {}\n",
            self.faults.values().sum::<u64>(),
            self.violations.len()
        ));
        for v in &self.violations {
            s.push_str(&format!("  {v}\n"));
        }
        s
    }
}

struct Campaign {
    sim: Sim,
    dir: tempfile::TempDir,
    socket: PathBuf,
    controller: Option<demo::common::Proc>,
    rng: StdRng,
    vols: Vec<Vol>,
    next: u32,
    out: Outcome,
}

fn final_code(c: Code) -> bool {
    matches!(
        c,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::PermissionDenied
    )
}

impl Campaign {
    fn start_controller(&mut self) -> Result<()> {
        let (p, s) =
            demo::common::start_controller_with(self.dir.path(), &self.sim.cloud_config())?;
        self.controller = Some(p);
        self.socket = s;
        Ok(())
    }

    /// Calls `f` as a sidecar would: again after every error but a final
    /// one, with backoff, until it succeeds. A final error or no success
    /// within CONVERGE is a violation (and `None`).
    async fn retry<T, F, Fut>(&mut self, what: String, mut f: F) -> Option<T>
    where
        F: FnMut(ControllerClient<tonic::transport::Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let started = Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            let attempt = match demo::common::channel(&self.socket).await {
                Ok(ch) => f(ControllerClient::new(ch)).await,
                Err(e) => Err(tonic::Status::unavailable(e.to_string())),
            };
            match attempt {
                Ok(v) => return Some(v),
                Err(s) if final_code(s.code()) => {
                    self.out.violations.push(format!(
                        "{what}: final error {:?}: {}",
                        s.code(),
                        s.message()
                    ));
                    return None;
                }
                Err(s) => {
                    if started.elapsed() > CONVERGE {
                        self.out.violations.push(format!(
                            "{what}: not done after {CONVERGE:?}; last {:?}: {}",
                            s.code(),
                            s.message()
                        ));
                        return None;
                    }
                    self.out.retries += 1;
                    // The controller may have been killed meanwhile.
                    if self.controller.is_none() {
                        let _ = self.start_controller();
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(3));
                }
            }
        }
    }

    async fn fault(&mut self) -> Result<()> {
        let vm = VMS[self.rng.random_range(0..VMS.len())].0;
        let pick = self.rng.random_range(0..8);
        let (name, knobs): (&'static str, Option<String>) = match pick {
            0 => (
                "5xx for the next calls",
                Some(r#"{"error_5xx_rate": 0.15}"#.into()),
            ),
            1 => (
                "dropped connections",
                Some(r#"{"drop_connections": 3}"#.into()),
            ),
            2 => ("failed hot-plug", Some(r#"{"fail_hotplugs": 1}"#.into())),
            3 => (
                "task failing after its UPID",
                Some(r#"{"fail_tasks": 1}"#.into()),
            ),
            4 => {
                self.sim
                    .admin(Method::POST, &format!("vms/{vm}/hold-lock?seconds=12"), "")
                    .await?;
                ("config lock held 12 s", None)
            }
            5 => {
                self.sim
                    .admin(Method::PUT, &format!("vms/{vm}/lock?value=backup"), "")
                    .await?;
                let sim_addr = self.sim.running.addr;
                let wait = Duration::from_millis(self.rng.random_range(500..4000));
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let _ = reqwest::Client::new()
                        .delete(format!("http://{sim_addr}/pvesim/vms/{vm}/lock"))
                        .send()
                        .await;
                });
                ("lock: backup for a while", None)
            }
            _ => {
                if let Some(p) = self.controller.take() {
                    p.kill9();
                }
                // Restarted on the next retry, or now.
                if self.rng.random_bool(0.5) {
                    self.start_controller()?;
                }
                ("controller SIGKILLed", None)
            }
        };
        if let Some(k) = knobs {
            self.sim.knobs(&k).await?;
        }
        *self.out.faults.entry(name).or_default() += 1;
        Ok(())
    }

    async fn calm(&mut self) -> Result<()> {
        self.sim.knobs(r#"{"error_5xx_rate": 0.0, "drop_connections": 0, "fail_hotplugs": 0, "fail_tasks": 0}"#).await?;
        for (vm, _) in VMS {
            self.sim
                .admin(Method::DELETE, &format!("vms/{vm}/lock"), "")
                .await?;
        }
        if self.controller.is_none() {
            self.start_controller()?;
        }
        Ok(())
    }

    async fn step(&mut self) {
        let kind = self.rng.random_range(0..100);
        // Deleted volumes stay in the model while their snapshots live.
        let live: Vec<usize> = (0..self.vols.len())
            .filter(|i| !self.vols[*i].id.is_empty())
            .collect();
        let idle: Vec<usize> = live
            .iter()
            .copied()
            .filter(|i| self.vols[*i].on.is_none())
            .collect();
        let busy: Vec<usize> = live
            .iter()
            .copied()
            .filter(|i| self.vols[*i].on.is_some())
            .collect();
        let any = !live.is_empty();
        let op: &'static str = match kind {
            0..25 => "create",
            25..45 if !idle.is_empty() => "publish",
            45..58 if !busy.is_empty() => "unpublish",
            58..68 if any => "expand",
            68..76 if any => "modify",
            76..84 if any => "snapshot",
            84..90 if self.vols.iter().any(|v| !v.snapshots.is_empty()) => "delete snapshot",
            90..100 if !idle.is_empty() => "delete",
            _ => "create",
        };
        *self.out.operations.entry(op).or_default() += 1;
        match op {
            "create" => {
                self.next += 1;
                let name = format!("pvc-soak-{:04}", self.next);
                let zone = if self.rng.random_bool(0.5) {
                    "pve1"
                } else {
                    "pve2"
                };
                let bytes: u64 = self.rng.random_range(1..=3) << 30;
                let sc = provisioner::StorageClass::new(&[
                    ("storage", "local-lvm"),
                    ("csi.storage.k8s.io/fstype", "ext4"),
                ]);
                let claim =
                    provisioner::Claim::new(&name, name.trim_start_matches("pvc-"), bytes as i64);
                let term = [
                    ("topology.kubernetes.io/region", "region-1"),
                    ("topology.kubernetes.io/zone", zone),
                ];
                let req = provisioner::create_volume(
                    &sc,
                    &claim,
                    Some(provisioner::requirement(&[&term], 0)),
                );
                let r = self.retry(format!("CreateVolume {name}"), |mut c| {
                    let req = req.clone();
                    async move { c.create_volume(req).await }
                });
                if let Some(v) = r.await.and_then(|r| r.into_inner().volume) {
                    let pv = provisioner::persistent_volume(&sc, &claim, &v);
                    self.vols.push(Vol {
                        name,
                        id: v.volume_id,
                        pv: Some(pv),
                        zone,
                        bytes,
                        on: None,
                        snapshots: Vec::new(),
                    });
                }
            }
            "publish" => {
                let i = idle[self.rng.random_range(0..idle.len())];
                let zone = self.vols[i].zone;
                let vms: Vec<u32> = VMS
                    .iter()
                    .filter(|(_, n)| *n == zone)
                    .map(|(v, _)| *v)
                    .collect();
                let vmid = vms[self.rng.random_range(0..vms.len())];
                let Some(pv) = self.vols[i].pv.clone() else {
                    return;
                };
                let req = attacher::controller_publish(&pv, &format!("worker-{vmid}/{vmid}"));
                let ok = self.retry(
                    format!("ControllerPublishVolume {} to {vmid}", self.vols[i].name),
                    |mut c| {
                        let req = req.clone();
                        async move { c.controller_publish_volume(req).await }
                    },
                );
                if ok.await.is_some() {
                    self.vols[i].on = Some(vmid);
                }
            }
            "unpublish" => {
                let i = busy[self.rng.random_range(0..busy.len())];
                let vmid = self.vols[i].on.unwrap_or_default();
                let Some(pv) = self.vols[i].pv.clone() else {
                    return;
                };
                let req = attacher::controller_unpublish(&pv, &format!("worker-{vmid}/{vmid}"));
                let ok = self.retry(
                    format!(
                        "ControllerUnpublishVolume {} from {vmid}",
                        self.vols[i].name
                    ),
                    |mut c| {
                        let req = req.clone();
                        async move { c.controller_unpublish_volume(req).await }
                    },
                );
                if ok.await.is_some() {
                    self.vols[i].on = None;
                }
            }
            "expand" => {
                let i = live[self.rng.random_range(0..live.len())];
                let bytes = self.vols[i].bytes + (512 << 20);
                let Some(pv) = self.vols[i].pv.clone() else {
                    return;
                };
                let req = resizer::controller_expand(&pv, bytes as i64);
                let ok = self.retry(
                    format!("ControllerExpandVolume {} to {bytes}", self.vols[i].name),
                    |mut c| {
                        let req = req.clone();
                        async move { c.controller_expand_volume(req).await }
                    },
                );
                if ok.await.is_some() {
                    self.vols[i].bytes = bytes;
                }
            }
            "modify" => {
                let i = live[self.rng.random_range(0..live.len())];
                let iops = self.rng.random_range(0..5) * 1000;
                let Some(pv) = self.vols[i].pv.clone() else {
                    return;
                };
                let iops = iops.to_string();
                let req = resizer::controller_modify(&pv, &[("diskIOPS", iops.as_str())]);
                let _ = self
                    .retry(
                        format!(
                            "ControllerModifyVolume {} diskIOPS={iops}",
                            self.vols[i].name
                        ),
                        |mut c| {
                            let req = req.clone();
                            async move { c.controller_modify_volume(req).await }
                        },
                    )
                    .await;
            }
            "snapshot" => {
                let i = live[self.rng.random_range(0..live.len())];
                self.next += 1;
                let uid = format!("soak-{:04}", self.next);
                let name = format!("snapshot-{uid}");
                let Some(pv) = self.vols[i].pv.clone() else {
                    return;
                };
                let req = snapshotter::create_snapshot(&uid, &uid, &pv, &[]);
                // The snapshotter asks again until ready_to_use.
                let started = Instant::now();
                loop {
                    let r = self
                        .retry(format!("CreateSnapshot {name}"), |mut c| {
                            let req = req.clone();
                            async move { c.create_snapshot(req).await }
                        })
                        .await;
                    let Some(s) = r.and_then(|r| r.into_inner().snapshot) else {
                        break;
                    };
                    if s.ready_to_use {
                        self.vols[i].snapshots.push((name, s.snapshot_id));
                        break;
                    }
                    if started.elapsed() > CONVERGE {
                        self.out
                            .violations
                            .push(format!("CreateSnapshot {name}: never ready"));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            "delete snapshot" => {
                let i = (0..self.vols.len())
                    .find(|i| !self.vols[*i].snapshots.is_empty())
                    .unwrap_or_default();
                let (name, id) = self.vols[i].snapshots.remove(0);
                let req = snapshotter::delete_snapshot(&id);
                let _ = self
                    .retry(format!("DeleteSnapshot {name}"), |mut c| {
                        let req = req.clone();
                        async move { c.delete_snapshot(req).await }
                    })
                    .await;
            }
            _ => {
                let i = idle[self.rng.random_range(0..idle.len())];
                let v = self.vols[i].clone();
                let Some(pv) = v.pv.clone() else { return };
                let req = provisioner::delete_volume(&pv);
                let ok = self.retry(format!("DeleteVolume {}", v.name), |mut c| {
                    let req = req.clone();
                    async move { c.delete_volume(req).await }
                });
                if ok.await.is_some() {
                    // Its snapshots live on; keep them under a tombstone.
                    self.vols[i].on = None;
                    self.vols[i].id.clear();
                }
            }
        }
        // A deleted volume without snapshots is forgotten.
        self.vols
            .retain(|v| !v.id.is_empty() || !v.snapshots.is_empty());
    }

    /// Proxmox's state against the model.
    async fn check(&mut self) -> Result<()> {
        let vms = self.sim.admin(Method::GET, "vms", "").await?;
        let volumes = self.sim.admin(Method::GET, "volumes", "").await?;
        let live: BTreeSet<String> = self
            .vols
            .iter()
            .filter(|v| !v.id.is_empty())
            .map(|v| format!("vm-9999-{}", v.name))
            .collect();
        let snap_vms: BTreeSet<u64> = self
            .vols
            .iter()
            .flat_map(|v| v.snapshots.iter())
            .filter_map(|(_, id)| id.rsplit("snapshot-vm-").next()?.parse().ok())
            .collect();
        let mut attached: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for vm in vms.as_array().cloned().unwrap_or_default() {
            let vmid = vm["vmid"].as_u64().unwrap_or(0);
            let config = vm["config"].as_object().cloned().unwrap_or_default();
            if vm["pending"].as_object().is_some_and(|p| !p.is_empty()) {
                self.out
                    .violations
                    .push(format!("VM {vmid} has pending changes: {}", vm["pending"]));
            }
            let worker = VMS.iter().any(|(v, _)| u64::from(*v) == vmid);
            if worker {
                for (k, v) in &config {
                    if k.starts_with("unused") {
                        self.out.violations.push(format!("VM {vmid} has {k}: {v}"));
                    }
                    if k.strip_prefix("scsi")
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                    {
                        let volid = v
                            .as_str()
                            .unwrap_or_default()
                            .split(',')
                            .next()
                            .unwrap_or_default()
                            .to_string();
                        attached.entry(volid).or_default().push(vmid);
                    }
                }
            } else if config
                .get("tags")
                .and_then(Value::as_str)
                .is_some_and(|t| t.contains("csi-snapshot"))
                && !snap_vms.contains(&vmid)
            {
                self.out.violations.push(format!(
                    "copy VM {vmid} ({}) belongs to no live snapshot",
                    config.get("name").and_then(Value::as_str).unwrap_or("?")
                ));
            }
        }
        for (volid, on) in &attached {
            if on.len() > 1 {
                self.out
                    .violations
                    .push(format!("{volid} is attached to {on:?}"));
            }
        }
        for v in self.vols.iter().filter(|v| !v.id.is_empty()) {
            let volid = format!("local-lvm:vm-9999-{}", v.name);
            let on: Vec<u64> = attached.get(&volid).cloned().unwrap_or_default();
            let want: Vec<u64> = v.on.map(u64::from).into_iter().collect();
            if on != want {
                self.out.violations.push(format!(
                    "{} is attached to {on:?}, the driver was told {want:?}",
                    v.name
                ));
            }
        }
        for vol in volumes.as_array().cloned().unwrap_or_default() {
            let volid = vol["volid"].as_str().unwrap_or_default();
            let name = volid.split(':').nth(1).unwrap_or_default();
            let owner = vol["owner"].as_u64().unwrap_or(0);
            let size = vol["size"].as_u64().unwrap_or(0);
            if owner == 9999 {
                match self
                    .vols
                    .iter()
                    .find(|v| !v.id.is_empty() && format!("vm-9999-{}", v.name) == name)
                {
                    Some(v) if size < v.bytes => self
                        .out
                        .violations
                        .push(format!("{volid} has {size} bytes, {} were asked", v.bytes)),
                    Some(_) => {}
                    None if !live.contains(name) => self
                        .out
                        .violations
                        .push(format!("{volid} belongs to no live volume")),
                    None => {}
                }
            } else if !snap_vms.contains(&owner) && !VMS.iter().any(|(v, _)| u64::from(*v) == owner)
            {
                self.out.violations.push(format!(
                    "{volid} (owner {owner}) belongs to no live snapshot"
                ));
            }
        }
        Ok(())
    }
}

/// Runs the campaign for `duration`; `fault_rate` is the chance of a fault
/// before each operation.
pub async fn run(seed: u64, duration: Duration, fault_rate: f64) -> Result<Outcome> {
    let sim = Sim::start(&cluster(2, 2, ", VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Clone")).await?;
    sim.knobs(r#"{"api_latency_ms": 2, "hotplug_latency_ms": 50}"#)
        .await?;
    let dir = tempfile::tempdir()?;
    let mut c = Campaign {
        sim,
        socket: dir.path().join("controller.sock"),
        dir,
        controller: None,
        rng: StdRng::seed_from_u64(seed),
        vols: Vec::new(),
        next: 0,
        out: Outcome {
            seed,
            ..Default::default()
        },
    };
    c.start_controller()?;
    let started = Instant::now();
    while started.elapsed() < duration {
        if c.rng.random_bool(fault_rate) {
            c.fault().await?;
        }
        c.step().await;
        if c.rng.random_bool(0.2) {
            c.sim.knobs(r#"{"error_5xx_rate": 0.0}"#).await?;
        }
    }
    c.calm().await?;
    // Let held locks and lock: backup run out before the last look.
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.check().await?;
    if let Some(p) = c.controller.take() {
        let _ = p.stop();
    }
    Ok(c.out)
}
