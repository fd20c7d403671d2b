//! The fault campaign: random create, publish, unpublish, expand, modify,
//! snapshot and delete against pvesim while faults are injected (5xx,
//! dropped connections, held config locks, `lock: backup`, failed
//! hot-plugs, tasks failing after their UPID), operators and Proxmox act
//! behind the driver's back (see `operator`: disks detached and attached in
//! the UI, VMs stopped, started and moved, a backup lock held for up to a
//! minute, the NFS server or a node gone for a while), and the controller
//! binary is SIGKILLed at random moments, in the middle of those too, and
//! restarted. A driver loop retries each CSI call as the sidecars do, until
//! it succeeds. At the end Proxmox's state is checked against what the
//! driver was told, and every injected fault is checked to have fired.

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

use crate::operator::{self, Pending, Restore, Undo};
use crate::sim::{Sim, cluster};
use proxmox_csi_controller::volume::VolumeId;

/// Worker VMs and their home nodes: 200, 201 on pve1; 202, 203 on pve2.
const VMS: [(u32, &str); 4] = [(200, "pve1"), (201, "pve1"), (202, "pve2"), (203, "pve2")];
const NODES: [&str; 2] = ["pve1", "pve2"];
/// An operation that has not succeeded after this long is a violation.
const CONVERGE: Duration = Duration::from_secs(90);

#[derive(Debug, Clone)]
struct Vol {
    name: String,
    id: String,
    /// The PersistentVolume the provisioner wrote: what the attacher,
    /// resizer and snapshotter build their requests from.
    pv: Option<callers::PersistentVolume>,
    /// `storage:name`, as VM configs name it.
    volid: String,
    /// The node of a local volume; `None` on the shared NFS storage.
    zone: Option<&'static str>,
    bytes: u64,
    on: Option<u32>,
    /// Detached in the UI while the driver still has it published.
    detached_oob: bool,
    snapshots: Vec<(String, String)>,
}

/// What a run did and found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub seed: u64,
    pub operations: BTreeMap<&'static str, u64>,
    pub faults: BTreeMap<&'static str, u64>,
    /// What pvesim counted of its injected faults: each kind injected
    /// must show here.
    pub fired: pvesim::knobs::Faults,
    pub retries: u64,
    /// Publishes and deletes refused (FailedPrecondition) while an
    /// operator had the disk attached elsewhere: the truth, retried.
    pub refused_while_attached_elsewhere: u64,
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
        let f = &self.fired;
        s.push_str(&format!(
            " ({} in all)\nfired in pvesim: 5xx {}, dropped connections {}, failed hot-plugs {}, failed tasks {}, lost answers {}, proxy timeouts (596) {}, held locks {}\nrefused while attached elsewhere (retried): {}\nviolations: {}\n",
            self.faults.values().sum::<u64>(),
            f.errors_5xx,
            f.dropped_connections,
            f.failed_hotplugs,
            f.failed_tasks,
            f.lost_answers,
            f.proxy_timeouts,
            f.held_locks,
            self.refused_while_attached_elsewhere,
            self.violations.len()
        ));
        for v in &self.violations {
            s.push_str(&format!("  {v}\n"));
        }
        s
    }
}

struct Campaign {
    sim: std::sync::Arc<Sim>,
    dir: tempfile::TempDir,
    socket: PathBuf,
    controller: Option<demo::common::Proc>,
    rng: StdRng,
    vols: Vec<Vol>,
    next: u32,
    out: Outcome,
    /// Where each worker VM is now.
    nodes: BTreeMap<u32, &'static str>,
    /// What operators will put back, and when.
    undos: Vec<Pending>,
    /// Volumes an operator attached in the UI, not through the driver.
    oob: BTreeSet<String>,
    /// How long a backup holds `lock: backup` (a minute in long runs).
    long_lock: Duration,
    /// Operators' changes being put back on their own time.
    background: Vec<tokio::task::JoinHandle<()>>,
    /// Kill the controller this long into the next call.
    kill_in: Option<Duration>,
    /// Faults chosen before any random one: the two that leave a write
    /// applied behind a 596 come early in every run.
    forced: Vec<u32>,
    /// Counted faults armed, and taken back unfired, per knob.
    armed: BTreeMap<&'static str, u64>,
    left: BTreeMap<&'static str, u64>,
}

/// A call as the deployed sidecars make it: with their `--timeout=3m`
/// (deploy/kustomize/controller.yaml) as the gRPC deadline.
fn sidecar<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(Duration::from_secs(180));
    r
}

/// A controller killed while a call was in flight.
pub const KILLED_MID_CALL: &str = "controller SIGKILLed during a call";

/// The faults pvesim counts one by one: knob, name, how many per injection.
const COUNTED: [(&str, &str, u64); 5] = [
    ("fail_5xx", "595 for the next calls", 3),
    ("drop_connections", "dropped connections", 3),
    ("fail_hotplugs", "failed hot-plug", 1),
    ("fail_tasks", "task failing after its UPID", 1),
    // pvesim answers it 596 (`lost_answer_status`, set at the start).
    ("lose_answers", "596 after a write that took effect", 1),
];

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
    async fn retry<T, F, Fut>(&mut self, what: String, volid: Option<String>, mut f: F) -> Option<T>
    where
        F: FnMut(ControllerClient<tonic::transport::Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let started = Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            let attempt = match demo::common::channel(&self.socket).await {
                Ok(ch) => match self.kill_in.take() {
                    // The controller dies while it works on this call.
                    Some(after) => {
                        tokio::select! {
                            r = f(ControllerClient::new(ch)) => {
                                *self.out.faults.entry("controller SIGKILL armed, the call ended first").or_default() += 1;
                                r
                            }
                            _ = tokio::time::sleep(after) => {
                                if let Some(p) = self.controller.take() {
                                    p.kill9();
                                }
                                *self.out.faults.entry(KILLED_MID_CALL).or_default() += 1;
                                Err(tonic::Status::unavailable("the controller was killed during the call"))
                            }
                        }
                    }
                    None => f(ControllerClient::new(ch)).await,
                },
                Err(e) => Err(tonic::Status::unavailable(e.to_string())),
            };
            match attempt {
                Ok(v) => return Some(v),
                // The truth while an operator has the disk attached to
                // another VM: refused, and asked again once it is back.
                Err(s)
                    if s.code() == Code::FailedPrecondition
                        && volid.as_ref().is_some_and(|v| self.oob.contains(v))
                        && started.elapsed() < CONVERGE =>
                {
                    self.out.refused_while_attached_elsewhere += 1;
                    self.undo_due(false).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
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
                    if std::env::var_os("SOAK_VERBOSE").is_some() {
                        eprintln!(
                            "{:>6.1}s {what}: retried after {:?}: {}",
                            started.elapsed().as_secs_f64(),
                            s.code(),
                            s.message()
                        );
                    }
                    self.undo_due(false).await;
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
        let pick = match self.forced.pop() {
            Some(p) => p,
            None => self.rng.random_range(0..16),
        };
        let (name, knobs): (&'static str, Option<usize>) = match pick {
            0..4 => (COUNTED[pick as usize].1, Some(pick as usize)),
            14 => (COUNTED[4].1, Some(4)),
            15 => {
                // Three slow calls hold pvedaemon's workers: writes queue,
                // pveproxy answers 596 after its wait, the write lands later.
                self.sim
                    .admin(Method::POST, "daemon/busy?workers=3&seconds=3", "")
                    .await?;
                ("pvedaemon saturated by 3 slow calls", None)
            }
            4 => {
                self.sim
                    .admin(Method::POST, &format!("vms/{vm}/hold-lock?seconds=12"), "")
                    .await?;
                ("config lock held 12 s", None)
            }
            5 => {
                operator::set_backup_lock(&self.sim, vm, true).await?;
                let wait = Duration::from_millis(self.rng.random_range(500..4000));
                self.later(wait, Restore::Unlock { vmid: vm });
                ("lock: backup for a while", None)
            }
            6 if self.rng.random_bool(0.5) => {
                self.kill_controller()?;
                ("controller SIGKILLed", None)
            }
            6 => {
                // Killed 0-40 ms into the next call (most calls take tens of
                // milliseconds against pvesim); whether it landed
                // mid-call is counted when it happens.
                self.kill_in = Some(Duration::from_millis(self.rng.random_range(0..40)));
                ("controller SIGKILL armed for the next call", None)
            }
            _ => match self.out_of_band(pick, vm).await? {
                Some(name) => {
                    // In the middle of it, half the time, the controller dies.
                    if self.rng.random_bool(0.5) {
                        self.kill_controller()?;
                        *self
                            .out
                            .faults
                            .entry("controller SIGKILLed during an out-of-band change")
                            .or_default() += 1;
                    }
                    (name, None)
                }
                None => return Ok(()),
            },
        };
        if let Some(k) = knobs {
            // Added to what is still armed, so that every one is accounted for.
            let (knob, _, n) = COUNTED[k];
            let armed = self.sim.admin(Method::GET, "knobs", "").await?[knob]
                .as_u64()
                .unwrap_or(0);
            self.sim
                .knobs(&format!(r#"{{"{knob}": {}}}"#, armed + n))
                .await?;
            *self.armed.entry(knob).or_default() += n;
        }
        *self.out.faults.entry(name).or_default() += 1;
        Ok(())
    }

    /// Takes back the counted faults not taken yet, and remembers how many:
    /// an injected fault either fired (pvesim counted it) or is still armed.
    async fn disarm(&mut self) -> Result<()> {
        let knobs = self.sim.admin(Method::GET, "knobs", "").await?;
        for (knob, _, _) in COUNTED {
            *self.left.entry(knob).or_default() += knobs[knob].as_u64().unwrap_or(0);
        }
        self.sim
            .knobs(r#"{"fail_5xx": 0, "drop_connections": 0, "fail_hotplugs": 0, "fail_tasks": 0, "lose_answers": 0}"#)
            .await
    }

    /// Every counted fault armed fired or was taken back unfired.
    fn account(&mut self, fired: &pvesim::knobs::Faults) {
        for (knob, name, _) in COUNTED {
            let took = match knob {
                "fail_5xx" => fired.errors_5xx,
                "drop_connections" => fired.dropped_connections,
                "fail_hotplugs" => fired.failed_hotplugs,
                "lose_answers" => fired.lost_answers,
                _ => fired.failed_tasks,
            };
            let armed = self.armed.get(knob).copied().unwrap_or(0);
            let left = self.left.get(knob).copied().unwrap_or(0);
            if armed != took + left {
                self.out.violations.push(format!(
                    "{name}: {armed} armed, {took} fired, {left} taken back unfired"
                ));
            }
        }
    }

    fn kill_controller(&mut self) -> Result<()> {
        if let Some(p) = self.controller.take() {
            p.kill9();
        }
        // Restarted on the next retry, or now.
        if self.rng.random_bool(0.5) {
            self.start_controller()?;
        }
        Ok(())
    }

    /// One change behind the driver's back; its name, or `None` when
    /// nothing fit (no disk to detach, say) or Proxmox refused it.
    async fn out_of_band(&mut self, pick: u32, vm: u32) -> Result<Option<&'static str>> {
        // An operator's change is not a fault test of its own: no injected
        // hot-plug or task failure is left to catch it.
        self.disarm().await?;
        let wait = Duration::from_millis(self.rng.random_range(2000..8000));
        Ok(match pick {
            7 => {
                let busy: Vec<usize> = (0..self.vols.len())
                    .filter(|i| {
                        let v = &self.vols[*i];
                        v.on.is_some() && !v.detached_oob && !v.id.is_empty()
                    })
                    .collect();
                let Some(&i) = busy.get(self.rng.random_range(0..busy.len().max(1))) else {
                    return Ok(None);
                };
                let (vmid, volid) = (
                    self.vols[i].on.unwrap_or_default(),
                    self.vols[i].volid.clone(),
                );
                let Some(key) = operator::slot_of(&self.sim, vmid, &volid).await? else {
                    return Ok(None);
                };
                if operator::detach(&self.sim, vmid, &key).await.is_err() {
                    return Ok(None);
                }
                self.vols[i].detached_oob = true;
                Some(operator::KINDS[0])
            }
            8 => {
                let idle: Vec<usize> = (0..self.vols.len())
                    .filter(|i| {
                        let v = &self.vols[*i];
                        v.on.is_none() && !v.id.is_empty() && !self.oob.contains(&v.volid)
                    })
                    .collect();
                let Some(&i) = idle.get(self.rng.random_range(0..idle.len().max(1))) else {
                    return Ok(None);
                };
                let vms = self.vms_for(self.vols[i].zone);
                let Some(&vmid) = vms.get(self.rng.random_range(0..vms.len().max(1))) else {
                    return Ok(None);
                };
                let volid = self.vols[i].volid.clone();
                let Ok(key) = operator::attach(&self.sim, vmid, &volid).await else {
                    return Ok(None);
                };
                self.oob.insert(volid.clone());
                self.undos
                    .push(Pending::after(wait, Undo::Detach { vmid, key, volid }));
                Some(operator::KINDS[1])
            }
            9 => {
                operator::set_running(&self.sim, vm, false).await?;
                self.later(wait, Restore::Start { vmid: vm });
                Some(operator::KINDS[2])
            }
            10 => {
                let home = self.nodes[&vm];
                let other = if home == "pve1" { "pve2" } else { "pve1" };
                // A worker holding none of the driver's local disks moves.
                if operator::holds_local_disk(&self.sim, vm).await? {
                    return Ok(None);
                }
                operator::relocate(&self.sim, vm, other).await?;
                self.nodes.insert(vm, other);
                self.undos.push(Pending::after(
                    wait,
                    Undo::MoveBack {
                        vmid: vm,
                        node: home,
                    },
                ));
                Some(operator::KINDS[3])
            }
            11 => {
                operator::set_backup_lock(&self.sim, vm, true).await?;
                self.later(self.long_lock, Restore::Unlock { vmid: vm });
                Some(operator::KINDS[4])
            }
            12 => {
                operator::set_storage_online(&self.sim, "nfs", false).await?;
                self.later(wait, Restore::StorageOnline { storage: "nfs" });
                Some(operator::KINDS[5])
            }
            _ => {
                let node = NODES[self.rng.random_range(0..NODES.len())];
                operator::set_node_online(&self.sim, node, false).await?;
                self.later(wait, Restore::NodeOnline { node });
                Some(operator::KINDS[6])
            }
        })
    }

    /// Puts back, on its own time, what the campaign's model does not
    /// depend on (a node, the NFS server, a VM's run state, a backup's
    /// lock): the outside world does not wait for the driver's calls.
    fn later(&mut self, wait: Duration, restore: Restore) {
        let sim = self.sim.clone();
        self.background.push(tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            // Refused only while the admin API is down: the end checks say so.
            for _ in 0..100 {
                if restore.apply(&sim).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }

    /// Worker VMs a volume of `zone` can be published to, where they are now.
    fn vms_for(&self, zone: Option<&'static str>) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|(_, n)| zone.is_none_or(|z| **n == z))
            .map(|(v, _)| *v)
            .collect()
    }

    /// Puts back what is due (everything, with `all`). An undo Proxmox
    /// refuses for now (a lock) stays for the next round.
    async fn undo_due(&mut self, all: bool) {
        let now = Instant::now();
        let (due, later): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.undos)
            .into_iter()
            .partition(|p| all || p.due <= now);
        self.undos = later;
        for p in due {
            let done = match &p.undo {
                Undo::Detach { vmid, key, volid } => {
                    let adopted = self
                        .vols
                        .iter()
                        .any(|v| &v.volid == volid && v.on == Some(*vmid));
                    if adopted {
                        // The driver published it to that very VM meanwhile:
                        // the operator's attachment became the driver's.
                        self.oob.remove(volid);
                        true
                    } else {
                        // The operator's own unplug is not a fault test.
                        let _ = self.disarm().await;
                        let ok = operator::detach(&self.sim, *vmid, key).await.is_ok();
                        if ok {
                            self.oob.remove(volid);
                        }
                        ok
                    }
                }
                Undo::MoveBack { vmid, node } => {
                    let holds_local = operator::holds_local_disk(&self.sim, *vmid)
                        .await
                        .unwrap_or(true);
                    if holds_local {
                        // It stays where it is until its local disks go;
                        // at the end it simply stays.
                        all
                    } else {
                        let ok = operator::relocate(&self.sim, *vmid, node).await.is_ok();
                        if ok {
                            self.nodes.insert(*vmid, node);
                        }
                        ok
                    }
                }
            };
            if !done {
                self.undos
                    .push(Pending::after(Duration::from_millis(500), p.undo));
            }
        }
    }

    async fn calm(&mut self) -> Result<()> {
        self.disarm().await?;
        for (vm, _) in VMS {
            self.sim
                .admin(Method::DELETE, &format!("vms/{vm}/lock"), "")
                .await?;
        }
        for h in std::mem::take(&mut self.background) {
            let _ = h.await;
        }
        // Everything operators changed is put back (a detach may wait for
        // a lock held a few seconds more).
        let started = Instant::now();
        while !self.undos.is_empty() && started.elapsed() < CONVERGE {
            self.undo_due(true).await;
            if !self.undos.is_empty() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        if !self.undos.is_empty() {
            self.out.violations.push(format!(
                "operators' changes could not be put back: {:?}",
                self.undos
            ));
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
                // A quarter on the shared NFS storage, the rest local.
                let storage = if self.rng.random_bool(0.25) {
                    "nfs"
                } else {
                    "local-lvm"
                };
                let sc = provisioner::StorageClass::new(&[
                    ("storage", storage),
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
                let r = self.retry(format!("CreateVolume {name}"), None, |mut c| {
                    let req = req.clone();
                    async move { c.create_volume(sidecar(req)).await }
                });
                if let Some(v) = r.await.and_then(|r| r.into_inner().volume) {
                    let pv = provisioner::persistent_volume(&sc, &claim, &v);
                    let Ok(id) = VolumeId::parse(&v.volume_id) else {
                        self.out.violations.push(format!(
                            "CreateVolume {name}: a handle of no known shape: {}",
                            v.volume_id
                        ));
                        return;
                    };
                    self.vols.push(Vol {
                        name,
                        volid: id.volid(),
                        id: v.volume_id,
                        pv: Some(pv),
                        zone: (storage == "local-lvm").then_some(zone),
                        bytes,
                        on: None,
                        detached_oob: false,
                        snapshots: Vec::new(),
                    });
                }
            }
            "publish" => {
                let i = idle[self.rng.random_range(0..idle.len())];
                let vms = self.vms_for(self.vols[i].zone);
                let Some(&vmid) = vms.get(self.rng.random_range(0..vms.len().max(1))) else {
                    return;
                };
                let volid = Some(self.vols[i].volid.clone());
                let Some(pv) = self.vols[i].pv.clone() else {
                    return;
                };
                let req = attacher::controller_publish(&pv, &format!("worker-{vmid}/{vmid}"));
                let ok = self.retry(
                    format!("ControllerPublishVolume {} to {vmid}", self.vols[i].name),
                    volid,
                    |mut c| {
                        let req = req.clone();
                        async move { c.controller_publish_volume(sidecar(req)).await }
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
                    None,
                    |mut c| {
                        let req = req.clone();
                        async move { c.controller_unpublish_volume(sidecar(req)).await }
                    },
                );
                if ok.await.is_some() {
                    self.vols[i].on = None;
                    self.vols[i].detached_oob = false;
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
                    None,
                    |mut c| {
                        let req = req.clone();
                        async move { c.controller_expand_volume(sidecar(req)).await }
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
                        None,
                        |mut c| {
                            let req = req.clone();
                            async move { c.controller_modify_volume(sidecar(req)).await }
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
                        .retry(format!("CreateSnapshot {name}"), None, |mut c| {
                            let req = req.clone();
                            async move { c.create_snapshot(sidecar(req)).await }
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
                    .retry(format!("DeleteSnapshot {name}"), None, |mut c| {
                        let req = req.clone();
                        async move { c.delete_snapshot(sidecar(req)).await }
                    })
                    .await;
            }
            _ => {
                let i = idle[self.rng.random_range(0..idle.len())];
                let v = self.vols[i].clone();
                let Some(pv) = v.pv.clone() else { return };
                let req = provisioner::delete_volume(&pv);
                let ok = self.retry(
                    format!("DeleteVolume {}", v.name),
                    Some(v.volid.clone()),
                    |mut c| {
                        let req = req.clone();
                        async move { c.delete_volume(sidecar(req)).await }
                    },
                );
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
            .map(|v| v.volid.clone())
            .collect();
        let snap_vms: BTreeSet<u64> = self
            .vols
            .iter()
            .flat_map(|v| v.snapshots.iter())
            .filter_map(|(_, id)| {
                id.rsplit("snapshot-vm-")
                    .next()?
                    .split('.')
                    .next()?
                    .parse()
                    .ok()
            })
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
            let on: Vec<u64> = attached.get(&v.volid).cloned().unwrap_or_default();
            let want: Vec<u64> = v.on.map(u64::from).into_iter().collect();
            // Detached in the UI: gone from the VM until the attacher's
            // unpublish, which was not due yet.
            if on != want && !(v.detached_oob && on.is_empty()) {
                self.out.violations.push(format!(
                    "{} is attached to {on:?}, the driver was told {want:?}",
                    v.name
                ));
            }
        }
        for vol in volumes.as_array().cloned().unwrap_or_default() {
            let volid = vol["volid"].as_str().unwrap_or_default();
            let owner = vol["owner"].as_u64().unwrap_or(0);
            let size = vol["size"].as_u64().unwrap_or(0);
            if owner == 9999 {
                match self
                    .vols
                    .iter()
                    .find(|v| !v.id.is_empty() && v.volid == volid)
                {
                    Some(v) if size < v.bytes => self
                        .out
                        .violations
                        .push(format!("{volid} has {size} bytes, {} were asked", v.bytes)),
                    Some(_) => {}
                    None if !live.contains(volid) => self
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
    // pvedaemon's 3 workers and a proxy that gives up after 1 s (Proxmox:
    // 30 s), so that a saturated daemon shows within a short run.
    sim.knobs(r#"{"api_latency_ms": 2, "hotplug_latency_ms": 50, "lost_answer_status": 596, "daemon_workers": 3, "proxy_timeout_ms": 1000}"#)
        .await?;
    let dir = tempfile::tempdir()?;
    let mut c = Campaign {
        sim: std::sync::Arc::new(sim),
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
        nodes: VMS.iter().map(|(v, n)| (*v, *n)).collect(),
        undos: Vec::new(),
        oob: BTreeSet::new(),
        // A backup holds its lock for a minute in a long run.
        armed: BTreeMap::new(),
        left: BTreeMap::new(),
        kill_in: None,
        forced: vec![14, 15],
        background: Vec::new(),
        long_lock: (duration / 10).clamp(Duration::from_secs(5), Duration::from_secs(60)),
    };
    c.start_controller()?;
    let started = Instant::now();
    while started.elapsed() < duration {
        c.undo_due(false).await;
        if c.rng.random_bool(fault_rate) {
            c.fault().await?;
        }
        c.step().await;
    }
    c.calm().await?;
    // Let held locks and lock: backup run out before the last look.
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.check().await?;
    c.out.fired = c.sim.running.faults();
    let fired = c.out.fired.clone();
    c.account(&fired);
    if let Some(p) = c.controller.take() {
        let _ = p.stop().await;
    }
    Ok(c.out)
}
