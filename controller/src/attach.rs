//! Attaching and detaching disks, one queue per VM.
//!
//! Concurrent publishes and unpublishes for the same VM are coalesced: a
//! worker takes everything queued for its VM and writes it in one config
//! update guarded by the config's `digest`. After the task, the committed
//! config is read again: a change Proxmox left pending (a failed hot-plug)
//! is reverted and reported as retryable, so nothing stays behind.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::drive::{self, DriveLine, SLOTS};
use crate::error::CtlError;
use crate::pve::client::backoff;
use crate::pve::{Client, Deadline, ErrorKind, PveError};

#[derive(Debug, Clone)]
pub enum Op {
    /// Attach `volid` with these drive options (wwn and serial are added).
    Attach {
        volid: String,
        handle: String,
        opts: BTreeMap<String, String>,
        /// How many volumes of this driver the VM may hold (the node's
        /// max_volumes_per_node); `None` for the controller's own VMs.
        limit: Option<u32>,
    },
    Detach {
        volid: String,
    },
}

impl Op {
    fn volid(&self) -> &str {
        match self {
            Op::Attach { volid, .. } | Op::Detach { volid } => volid,
        }
    }
}

/// Where a volume ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub slot: String,
    pub wwn: String,
    pub serial: String,
    /// Where the guest finds the disk (by the VM's `scsihw`).
    pub address: drive::ScsiAddress,
}

struct Job {
    op: Op,
    deadline: Deadline,
    reply: oneshot::Sender<Result<Option<Attached>, CtlError>>,
    _queued: Queued,
}

/// Attaches and detaches submitted and not yet answered, across all VMs.
static QUEUE_DEPTH: LazyLock<Gauge> = LazyLock::new(Gauge::default);
/// Disks changed by each config write.
static BATCH_SIZE: LazyLock<Histogram> =
    LazyLock::new(|| Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 30.0]));

pub fn register(registry: &mut Registry) {
    registry.register(
        "attach_queue_depth",
        "Attaches and detaches submitted and not yet answered (queued or being written)",
        QUEUE_DEPTH.clone(),
    );
    registry.register(
        "attach_batch_size",
        "Disks attached or detached by one VM config write",
        BATCH_SIZE.clone(),
    );
}

/// A job's place in [`QUEUE_DEPTH`], given back when the job is answered
/// or dropped (its caller gone).
struct Queued;

impl Queued {
    fn new() -> Self {
        QUEUE_DEPTH.inc();
        Self
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        QUEUE_DEPTH.dec();
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct VmKey {
    region: String,
    vmid: u32,
}

pub struct Attacher {
    queues: Mutex<HashMap<VmKey, mpsc::UnboundedSender<Job>>>,
    pub attachments: Arc<crate::attachments::Attachments>,
    /// Where VMs are: a worker whose VM moved to another Proxmox node
    /// (HA, maintenance) finds it there.
    index: Arc<crate::vms::VmIndex>,
    /// Config writes made, for benchmarks and tests.
    pub writes: std::sync::atomic::AtomicU64,
    /// The controller's own VMs (holders) by region and VMID, as the
    /// controller found or made them: only these have their `protection`
    /// lifted for a write; a tag alone proves nothing (anyone may tag).
    own: std::sync::Mutex<std::collections::HashSet<(String, u32)>>,
}

impl std::fmt::Debug for Attacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attacher").finish_non_exhaustive()
    }
}

impl Attacher {
    pub fn new(index: Arc<crate::vms::VmIndex>) -> Self {
        Self {
            queues: Mutex::default(),
            attachments: Arc::default(),
            index,
            writes: std::sync::atomic::AtomicU64::new(0),
            own: std::sync::Mutex::default(),
        }
    }

    /// Marks VM `vmid` of `region` as one of the controller's own.
    pub fn own_vm(&self, region: &str, vmid: u32) {
        if let Ok(mut own) = self.own.lock() {
            own.insert((region.to_string(), vmid));
        }
    }

    fn is_own(&self, region: &str, vmid: u32, cfg: &BTreeMap<String, String>) -> bool {
        crate::vms::is_own(cfg)
            && self
                .own
                .lock()
                .is_ok_and(|own| own.contains(&(region.to_string(), vmid)))
    }

    /// Queues `op` for VM `vmid` on `node` and waits for its outcome.
    pub async fn submit(
        self: &Arc<Self>,
        client: Arc<Client>,
        node: &str,
        vmid: u32,
        op: Op,
        deadline: Deadline,
    ) -> Result<Option<Attached>, CtlError> {
        let key = VmKey {
            region: client.region().to_string(),
            vmid,
        };
        let (tx, rx) = oneshot::channel();
        let job = Job {
            op,
            deadline,
            reply: tx,
            _queued: Queued::new(),
        };
        {
            let mut queues = self.queues.lock().await;
            let sender = queues.entry(key.clone()).or_insert_with(|| {
                let (s, r) = mpsc::unbounded_channel();
                tokio::spawn(worker(
                    self.clone(),
                    client.clone(),
                    node.to_string(),
                    vmid,
                    r,
                ));
                s
            });
            if let Err(mpsc::error::SendError(job)) = sender.send(job) {
                // The worker ended (its VM's node changed); start a new one.
                let (s, r) = mpsc::unbounded_channel();
                tokio::spawn(worker(
                    self.clone(),
                    client.clone(),
                    node.to_string(),
                    vmid,
                    r,
                ));
                let _ = s.send(job);
                queues.insert(key, s);
            }
        }
        rx.await.map_err(|_| {
            CtlError::Unavailable(format!("attach queue of VM {vmid} stopped; retry"))
        })?
    }
}

/// How long a worker goes on gathering after a job, while more keep coming
/// (each within `GATHER_GAP` of the last): the publishes of one burst
/// arrive a few API calls apart. Without it the first job of a burst is
/// written alone and the rest wait for its hot-plug (Proxmox plugs one disk
/// after another, so the burst costs an extra task). A lone attach pays
/// `GATHER_GAP`, small beside a hot-plug.
const GATHER_GAP: std::time::Duration = std::time::Duration::from_millis(30);
const GATHER_MAX: std::time::Duration = std::time::Duration::from_millis(150);

async fn worker(
    att: Arc<Attacher>,
    client: Arc<Client>,
    mut node: String,
    vmid: u32,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + GATHER_MAX;
        loop {
            let gap = GATHER_GAP.min(until.saturating_duration_since(tokio::time::Instant::now()));
            match tokio::time::timeout(gap, rx.recv()).await {
                Ok(Some(j)) => batch.push(j),
                Ok(None) | Err(_) => break,
            }
        }
        while let Ok(j) = rx.try_recv() {
            batch.push(j);
        }
        run_batch(&att, &client, &mut node, vmid, batch).await;
    }
}

/// Where VM `vmid` is now, after its config was not found on `node`
/// (pve-guest-common AbstractConfig.pm load_config: "Configuration file
/// 'nodes/<node>/qemu-server/<vmid>.conf' does not exist" once it moved).
async fn follow(
    att: &Attacher,
    client: &Client,
    node: &str,
    vmid: u32,
    d: Deadline,
) -> Result<Option<String>, PveError> {
    att.index.invalidate(client.region()).await;
    let now = att.index.node_of(client, vmid, d).await?.map(|v| v.node);
    if let Some(n) = now.as_deref().filter(|n| *n != node) {
        tracing::info!(
            vmid,
            from = node,
            to = n,
            "VM moved to another Proxmox node; following it"
        );
    }
    Ok(now)
}

/// The slot for one attach of a batch.
struct Planned {
    slot: String,
    wwn: String,
    serial: String,
}

/// How a round ended.
enum Round {
    /// Every change it wrote was answered; jobs left wait for the next round.
    Done,
    /// A write of several changes failed as a whole: they are tried one by
    /// one, so that one bad volume neither fails nor starves the others.
    Split,
}

async fn run_batch(
    att: &Attacher,
    client: &Client,
    node: &mut String,
    vmid: u32,
    mut jobs: Vec<Job>,
) {
    let deadline = jobs
        .iter()
        .map(|j| j.deadline)
        .max_by_key(|d| d.0)
        .unwrap_or(Deadline::after(std::time::Duration::from_secs(30)));
    let mut attempt = 0;
    let mut per_write = usize::MAX;
    while !jobs.is_empty() {
        let outcome = write_once(att, client, node, vmid, &mut jobs, per_write, deadline).await;
        match outcome {
            Ok(Round::Done) => {}
            Ok(Round::Split) => {
                tracing::info!(
                    vmid,
                    jobs = jobs.len(),
                    "a config write of several disks failed; trying them one by one"
                );
                per_write = 1;
            }
            Err(e) if e.kind() == ErrorKind::NotFound && attempt < 3 => {
                attempt += 1;
                match follow(att, client, node, vmid, deadline).await {
                    Ok(Some(now)) if now != *node => *node = now,
                    Ok(None) => {
                        for j in jobs.drain(..) {
                            let _ = j.reply.send(Err(CtlError::NotFound(format!(
                                "VM {vmid} no longer exists: {e}"
                            ))));
                        }
                        return;
                    }
                    // Still there: the error was about something else.
                    Ok(Some(_)) | Err(_) => {
                        let err = CtlError::from(e);
                        for j in jobs.drain(..) {
                            let _ = j.reply.send(Err(clone_err(&err)));
                        }
                        return;
                    }
                }
            }
            Err(e) => {
                let retry = e.kind() == ErrorKind::DigestMismatch || e.is_transient();
                let wait = backoff(attempt);
                if retry && deadline.remaining() > wait {
                    tracing::debug!(vmid, error = %e, "config write raced or Proxmox busy; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                    continue;
                }
                let err = CtlError::from(e);
                for j in jobs.drain(..) {
                    let _ = j.reply.send(Err(clone_err(&err)));
                }
                return;
            }
        }
    }
}

/// The batch's error for each of its jobs.
fn clone_err(e: &CtlError) -> CtlError {
    match e {
        CtlError::Unavailable(m) => CtlError::Unavailable(m.clone()),
        CtlError::FailedPrecondition(m) => CtlError::FailedPrecondition(m.clone()),
        other => CtlError::Internal(other.to_string()),
    }
}

/// One read-plan-write-verify round of at most `per_write` changes. Jobs
/// answered are removed from `jobs`; an `Err` (a lost digest race, a busy
/// VM, the VM not where it was) leaves the rest for the caller to retry.
async fn write_once(
    att: &Attacher,
    client: &Client,
    node: &str,
    vmid: u32,
    jobs: &mut Vec<Job>,
    per_write: usize,
    d: Deadline,
) -> Result<Round, PveError> {
    let cfg = client.vm_config(node, vmid, d).await?;
    let pending = client.vm_pending(node, vmid, d).await?;
    let pending_keys: BTreeSet<String> = pending
        .iter()
        .filter(|p| p.pending.is_some() || p.delete.is_some())
        .map(|p| p.key.clone())
        .collect();
    // Proxmox refuses to remove a disk of a protected VM. The controller's
    // own VMs are unprotected for the write that removes one (and protected
    // again by it); a worker's flag is the operator's, and is kept.
    let own_vm = att.is_own(client.region(), vmid, &cfg.values);
    let protected = crate::vms::is_protected(&cfg.values);
    let detaching = jobs.iter().any(|j| {
        matches!(j.op, Op::Detach { .. })
            && !drive::slots_with(&cfg.values, j.op.volid()).is_empty()
    });
    if protected && own_vm && detaching {
        let lift = [
            ("delete", "protection".to_string()),
            ("digest", cfg.digest.clone()),
        ];
        client.update_config(node, vmid, &lift, d).await?;
        return Ok(Round::Done);
    }
    let mut taken: BTreeSet<String> = cfg
        .values
        .keys()
        .cloned()
        .chain(pending_keys.iter().cloned())
        .collect();
    let wwns: BTreeSet<String> = cfg
        .values
        .values()
        .filter_map(|v| {
            DriveLine::parse(v)
                .opts
                .get("wwn")
                .map(|w| w.to_lowercase())
        })
        .collect();

    let mut sets: Vec<(String, String)> = Vec::new();
    let mut deletes: Vec<String> = Vec::new();
    // Keyed by volume: a publish retried while the first is queued shares its plan.
    let mut planned: HashMap<String, Planned> = HashMap::new();
    let mut planned_detaches: BTreeSet<String> = BTreeSet::new();
    let mut done: Vec<(usize, Result<Option<Attached>, CtlError>)> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let slots = drive::slots_with(&cfg.values, job.op.volid());
        match &job.op {
            Op::Attach {
                volid,
                handle,
                opts,
                limit,
            } => {
                if let Some(slot) = slots.first() {
                    // Published again: the same answer, unless the access differs
                    // (the spec's ALREADY_EXISTS for an incompatible capability).
                    let read_only =
                        |o: &BTreeMap<String, String>| o.get("ro").is_some_and(|v| v == "1");
                    let now = cfg
                        .values
                        .get(slot)
                        .map(|l| read_only(&DriveLine::parse(l).opts))
                        .unwrap_or(false);
                    if now != read_only(opts) {
                        let (has, asked) = if now {
                            ("read-only", "read-write")
                        } else {
                            ("read-write", "read-only")
                        };
                        done.push((i, Err(CtlError::AlreadyExists(format!(
                            "volume {handle} is published to VM {vmid} {has} ({slot}); it cannot also be published {asked}: unpublish it first"
                        )))));
                        continue;
                    }
                    att.attachments.record(client.region(), volid, vmid).await;
                    done.push((i, Ok(Some(read_back(&cfg.values, slot)))));
                    continue;
                }
                if planned.contains_key(volid) || sets.len() + deletes.len() >= per_write {
                    continue;
                }
                // Proxmox would take the disk, but neither a detach nor the
                // revert of a failed hot-plug (a delete, qemu-server
                // update_vm_api `revert`) could take it off again while the
                // operator's flag is set.
                if protected && !own_vm {
                    done.push((i, Err(CtlError::FailedPrecondition(format!(
                        "VM {vmid} has Proxmox's protection flag set (protection: 1), under which Proxmox \
                         refuses to remove its disks: {volid} is not attached, as it could not be detached \
                         again. Clear the flag (qm set {vmid} --protection 0, or Options → Protection) and \
                         the attach is retried"
                    )))));
                    continue;
                }
                // Volumes of this driver on the VM (disks another VMID owns:
                // the placeholder or a copy VM), with those planned here.
                let ours = cfg
                    .values
                    .iter()
                    .filter(|(k, v)| {
                        drive::is_disk_key(k) && {
                            let volume = DriveLine::parse(v).volume;
                            let volname =
                                volume.split_once(':').map_or(volume.as_str(), |(_, n)| n);
                            crate::volume::owner_of(volname).is_some_and(|o| o != vmid)
                        }
                    })
                    .count()
                    + planned.len();
                if let Some(max) = limit
                    && ours >= *max as usize
                {
                    done.push((i, Err(CtlError::ResourceExhausted(format!(
                        "VM {vmid} holds {ours} volumes of this driver, the most its node takes (max_volumes_per_node {max}: \
                         the Node label {}, default {}); detach one first",
                        proxmox_csi_common::MAX_VOLUMES_LABEL,
                        proxmox_csi_common::DEFAULT_MAX_VOLUMES
                    )))));
                    continue;
                }
                let Some(slot) = SLOTS
                    .map(|n| format!("scsi{n}"))
                    .find(|s| !taken.contains(s))
                else {
                    done.push((i, Err(CtlError::ResourceExhausted(format!(
                        "VM {vmid} has no free SCSI slot (scsi1–scsi30 are taken); detach a volume first"
                    )))));
                    continue;
                };
                taken.insert(slot.clone());
                let wwn = (0..)
                    .map(|salt| drive::wwn_for(handle, salt))
                    .find(|w| !wwns.contains(w))
                    .unwrap_or_default();
                let serial = drive::serial_for(handle);
                let mut line = DriveLine {
                    volume: volid.clone(),
                    opts: opts.clone(),
                };
                line.opts.insert("wwn".into(), wwn.clone());
                line.opts.insert("serial".into(), serial.clone());
                sets.push((slot.clone(), line.render()));
                // Recorded before the write: while it runs, the volume is
                // not free for anyone else (a failed write records it absent).
                att.attachments.record(client.region(), volid, vmid).await;
                planned.insert(volid.clone(), Planned { slot, wwn, serial });
            }
            Op::Detach { volid } => {
                if protected && !slots.is_empty() {
                    done.push((i, Err(CtlError::FailedPrecondition(format!(
                        "VM {vmid} has Proxmox's protection flag set (protection: 1), under which Proxmox \
                         refuses to remove its disks; {volid} stays attached as {}. Clear the flag \
                         (qm set {vmid} --protection 0, or Options → Protection) and the detach is retried",
                        slots.join(", ")
                    )))));
                } else if slots.is_empty() {
                    att.attachments
                        .record_absent(client.region(), volid, vmid)
                        .await;
                    done.push((i, Ok(None)));
                } else if planned_detaches.contains(volid) || sets.len() + deletes.len() < per_write
                {
                    planned_detaches.insert(volid.clone());
                    for s in slots {
                        if !deletes.contains(&s) {
                            deletes.push(s);
                        }
                    }
                }
            }
        }
    }
    // Answer what needed no write.
    answer(jobs, done);
    if sets.is_empty() && deletes.is_empty() {
        // An own VM left unprotected (a lift whose removal found nothing
        // left to remove, or a VM of an earlier version) is protected now.
        if own_vm && !protected {
            let protect = [
                ("protection", "1".to_string()),
                ("digest", cfg.digest.clone()),
            ];
            client.update_config(node, vmid, &protect, d).await?;
        }
        return Ok(Round::Done);
    }
    let multi = sets.len() + deletes.len() > 1;

    let mut form: Vec<(&str, String)> = sets.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    if !deletes.is_empty() {
        form.push(("delete", deletes.join(",")));
    }
    if own_vm && !protected {
        form.push(("protection", "1".to_string()));
    }
    form.push(("digest", cfg.digest.clone()));
    att.writes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    BATCH_SIZE.observe((sets.len() + deletes.len()) as f64);
    let result = client.update_config(node, vmid, &form, d).await;
    // A task that failed after its UPID may have left part of the change
    // (qemu-server writes each new disk key in its own step, and a hot-plug
    // failure leaves that key pending): whatever the error's kind, even a
    // transient one, verify and revert before answering. Only a lost digest
    // race wrote nothing (qemu-server checks the digest first).
    let hotplug_failure = match &result {
        Ok(()) => None,
        Err(e @ PveError::Task { exitstatus, .. }) if e.kind() != ErrorKind::DigestMismatch => {
            Some(exitstatus.clone())
        }
        Err(e @ PveError::Api { message, .. }) if e.kind() == ErrorKind::HotplugFailed => {
            Some(message.clone())
        }
        Err(e) if e.is_transient() || e.kind() == ErrorKind::DigestMismatch => {
            return result.map(|()| Round::Done);
        }
        // Refused as a whole (nothing written): one change at a time tells
        // which one Proxmox refuses.
        Err(_) if multi => return Ok(Round::Split),
        Err(e) => {
            let err = if e.kind() == ErrorKind::PermissionDenied {
                CtlError::FailedPrecondition(crate::error::permission_remedy(e))
            } else {
                CtlError::Internal(e.to_string())
            };
            let mine = |j: &Job| {
                planned.contains_key(j.op.volid()) || planned_detaches.contains(j.op.volid())
            };
            let failed: Vec<(usize, Result<Option<Attached>, CtlError>)> = jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| mine(j))
                .map(|(i, _)| (i, Err(clone_err(&err))))
                .collect();
            answer(jobs, failed);
            return Ok(Round::Done);
        }
    };
    // A busy VM or cluster: what did not happen is tried again (after the
    // check below), within the deadline.
    let retry_rest = result.as_ref().is_err_and(PveError::is_transient);
    // A privilege Proxmox refused in the worker (VM.Config.Disk per drive):
    // no retry helps until it is granted.
    let denied = result
        .as_ref()
        .err()
        .filter(|e| e.kind() == ErrorKind::PermissionDenied)
        .map(crate::error::permission_remedy);

    // Verify against the committed config; revert what stayed pending.
    let after = client.vm_config(node, vmid, d).await?;
    let still_pending: BTreeSet<String> = client
        .vm_pending(node, vmid, d)
        .await?
        .into_iter()
        .filter(|p| p.pending.is_some() || p.delete.is_some())
        .map(|p| p.key)
        .collect();
    let ours: Vec<String> = sets
        .iter()
        .map(|(k, _)| k.clone())
        .chain(deletes.iter().cloned())
        .filter(|k| still_pending.contains(k))
        .collect();
    if !ours.is_empty() {
        // Reverting a pending disk is a delete, which a protected VM
        // refuses: the controller's own VM is unprotected for it and
        // protected again after.
        let lifted = own_vm && crate::vms::is_protected(&after.values) && {
            let lift = [("delete", "protection".to_string())];
            client.update_config(node, vmid, &lift, d).await.is_ok()
        };
        let revert = [("revert", ours.join(","))];
        if let Err(e) = client.update_config(node, vmid, &revert, d).await {
            tracing::error!(vmid, keys = %ours.join(","), error = %e, "reverting a change Proxmox left pending failed");
        }
        if lifted {
            let protect = [("protection", "1".to_string())];
            if let Err(e) = client.update_config(node, vmid, &protect, d).await {
                tracing::error!(vmid, error = %e, "protecting the driver's own VM again failed");
            }
        }
    }
    let failed = hotplug_failure.is_some();
    let why = hotplug_failure.unwrap_or_else(|| "Proxmox left the change pending".to_string());
    let mut done = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let volid = job.op.volid().to_string();
        match &job.op {
            Op::Attach { .. } => {
                let Some(p) = planned.get(&volid) else {
                    continue;
                };
                if after
                    .values
                    .get(&p.slot)
                    .is_some_and(|v| DriveLine::parse(v).volume == volid)
                {
                    att.attachments.record(client.region(), &volid, vmid).await;
                    done.push((
                        i,
                        Ok(Some(Attached {
                            slot: p.slot.clone(),
                            wwn: p.wwn.clone(),
                            serial: p.serial.clone(),
                            address: address_of(&after.values, &p.slot),
                        })),
                    ));
                } else {
                    att.attachments
                        .record_absent(client.region(), &volid, vmid)
                        .await;
                    if !retry_rest && !multi {
                        done.push((i, Err(match &denied {
                            Some(remedy) => CtlError::FailedPrecondition(format!(
                                "attaching {volid} to VM {vmid} as {}: {remedy}", p.slot
                            )),
                            None => CtlError::Unavailable(format!(
                                "attaching {volid} to VM {vmid} as {} failed and was reverted: {why}", p.slot
                            )),
                        })));
                    }
                }
            }
            Op::Detach { .. } => {
                if !planned_detaches.contains(&volid) {
                    continue;
                }
                if drive::slots_with(&after.values, &volid).is_empty() {
                    att.attachments
                        .record_absent(client.region(), &volid, vmid)
                        .await;
                    if after.values.iter().any(|(k, v)| {
                        k.starts_with("unused") && DriveLine::parse(v).volume == volid
                    }) {
                        tracing::warn!(
                            vmid,
                            volid,
                            "Proxmox kept the detached disk as unusedN: the VM owns it (a static volume)"
                        );
                    }
                    done.push((i, Ok(None)));
                } else if !retry_rest && !multi {
                    done.push((
                        i,
                        Err(match &denied {
                            Some(remedy) => CtlError::FailedPrecondition(format!(
                                "detaching {volid} from VM {vmid}: {remedy}"
                            )),
                            None => CtlError::Unavailable(format!(
                                "detaching {volid} from VM {vmid} failed and was reverted: {why}"
                            )),
                        }),
                    ));
                }
            }
        }
    }
    answer(jobs, done);
    if retry_rest && !jobs.is_empty() {
        return result.map(|()| Round::Done);
    }
    if multi && failed && !jobs.is_empty() {
        return Ok(Round::Split);
    }
    Ok(Round::Done)
}

fn answer(jobs: &mut Vec<Job>, mut done: Vec<(usize, Result<Option<Attached>, CtlError>)>) {
    done.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
    for (i, r) in done {
        let job = jobs.remove(i);
        let _ = job.reply.send(r);
    }
}

/// The identity of an attached disk, as the config has it: a disk the Go
/// driver attached keeps its LUN-derived WWN.
pub fn read_back(cfg: &BTreeMap<String, String>, slot: &str) -> Attached {
    let line = DriveLine::parse(cfg.get(slot).map(String::as_str).unwrap_or_default());
    Attached {
        slot: slot.to_string(),
        wwn: line.opts.get("wwn").cloned().unwrap_or_default(),
        serial: line.opts.get("serial").cloned().unwrap_or_default(),
        address: address_of(cfg, slot),
    }
}

fn address_of(cfg: &BTreeMap<String, String>, slot: &str) -> drive::ScsiAddress {
    let index = slot.trim_start_matches("scsi").parse().unwrap_or_default();
    drive::scsi_address(cfg.get("scsihw").map(String::as_str), index)
}
