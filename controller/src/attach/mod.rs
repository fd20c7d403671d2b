//! Attaching and detaching disks, one queue per VM.
//!
//! Concurrent publishes and unpublishes for the same VM are coalesced: a
//! worker takes everything queued for its VM and writes it in one config
//! update guarded by the config's `digest`. After the task, the committed
//! config is read again: a change Proxmox left pending (a failed hot-plug)
//! is reverted and reported as retryable, so nothing stays behind.

mod pace;
mod plan;
mod queue;
mod verify;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};

use crate::attachments::Attachments;
use crate::drive::{self, DriveLine};
use crate::error::CtlError;
use crate::pve::client::backoff;
use crate::pve::{Client, Deadline, ErrorKind, PveError};
use plan::{Answer, Plan, VmView};
use queue::{Coalescer, Gather};
use verify::WriteOutcome;

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
    pub fn volid(&self) -> &str {
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
    queues: Coalescer<VmKey, Job>,
    /// The controller's attachment index, kept current by every write.
    attachments: Arc<Attachments>,
    /// Where VMs are: a worker whose VM moved to another Proxmox node
    /// (HA, maintenance) finds it there.
    index: Arc<crate::vms::VmIndex>,
    /// Config writes made, for benchmarks and tests.
    pub writes: std::sync::atomic::AtomicU64,
    /// Each VM's hot-plug pace: when a write's task is due to end.
    pace: pace::Pace,
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
    pub fn new(index: Arc<crate::vms::VmIndex>, attachments: Arc<Attachments>) -> Self {
        Self {
            queues: Coalescer::default(),
            attachments,
            index,
            writes: std::sync::atomic::AtomicU64::new(0),
            pace: pace::Pace::default(),
            own: std::sync::Mutex::default(),
        }
    }

    /// Marks VM `vmid` of `region` as one of the controller's own.
    pub fn own_vm(&self, region: &str, vmid: u32) {
        if let Ok(mut own) = self.own.lock() {
            own.insert((region.to_string(), vmid));
        }
    }

    /// Records the round's volumes as attached to VM `vmid`, or not.
    async fn record(&self, region: &str, vmid: u32, present: &[String], absent: &[String]) {
        for volid in present {
            self.attachments.record(region, volid, vmid).await;
        }
        for volid in absent {
            self.attachments.record_absent(region, volid, vmid).await;
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
        let spawn = |r| {
            tokio::spawn(worker(
                self.clone(),
                client.clone(),
                node.to_string(),
                vmid,
                r,
            ));
        };
        self.queues.push(key, job, spawn).await;
        rx.await.map_err(|_| {
            CtlError::Unavailable(format!("attach queue of VM {vmid} stopped; retry"))
        })?
    }
}

/// How long a worker goes on gathering after a job, while more keep coming
/// (each within `gap` of the last): the publishes of one burst arrive a few
/// API calls apart. Without it the first job of a burst is written alone
/// and the rest wait for its hot-plug (Proxmox plugs one disk after
/// another, so the burst costs an extra task). A lone attach pays `gap`,
/// small beside a hot-plug.
const GATHER: Gather = Gather {
    gap: std::time::Duration::from_millis(30),
    max: std::time::Duration::from_millis(150),
};

async fn worker(
    att: Arc<Attacher>,
    client: Arc<Client>,
    mut node: String,
    vmid: u32,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    // The VM as the last write's verification read it; a config changed
    // since is caught by the write's digest.
    let mut view: Option<View> = None;
    loop {
        let mut waiting = queue::backlog(&mut rx);
        if waiting.is_empty() {
            // Idle: whatever the last write read may be old by now.
            view = None;
            match rx.recv().await {
                Some(j) => waiting.push(j),
                None => return,
            }
        }
        // The burst gathers while the config is read: a lone job pays the
        // longer of the two, not their sum. Jobs that queued during the
        // last write are planned on its verification read instead (no read
        // of their own, so the VM's next hot-plug follows the last). A
        // read that failed is made again, and its error met, by the write.
        let mut batch = if view.is_some() {
            queue::gather(waiting, &mut rx, GATHER).await
        } else {
            let d = batch_deadline(&waiting);
            let (batch, read) = tokio::join!(
                queue::gather(waiting, &mut rx, GATHER),
                read_view(&client, &node, vmid, d)
            );
            view = read.ok();
            batch
        };
        batch.extend(queue::backlog(&mut rx));
        run_batch(&att, &client, &mut node, vmid, batch, &mut view).await;
    }
}

/// The latest deadline of a batch's jobs: its writes serve them all.
fn batch_deadline(jobs: &[Job]) -> Deadline {
    jobs.iter()
        .map(|j| j.deadline)
        .max_by_key(|d| d.0)
        .unwrap_or(Deadline::after(std::time::Duration::from_secs(30)))
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

/// How a round ended.
enum Round {
    /// Every change it wrote was answered; jobs left wait for the next round.
    Done,
    /// A write of several changes failed as a whole: they are tried one by
    /// one, so that one bad volume neither fails nor starves the others.
    Split,
}

/// Writes `jobs` to VM `vmid`, round after round until each is answered.
/// `view` is the VM as last read, taken by the first round; each round
/// leaves its verification read there for the next, or nothing.
async fn run_batch(
    att: &Attacher,
    client: &Client,
    node: &mut String,
    vmid: u32,
    mut jobs: Vec<Job>,
    view: &mut Option<View>,
) {
    let deadline = batch_deadline(&jobs);
    let mut attempt = 0;
    let mut rounds = Rounds {
        per_write: usize::MAX,
        view: view.take(),
    };
    while !jobs.is_empty() {
        let outcome = write_once(att, client, node, vmid, &mut jobs, &mut rounds, deadline).await;
        match outcome {
            Ok(Round::Done) => {}
            Ok(Round::Split) => {
                tracing::info!(
                    vmid,
                    jobs = jobs.len(),
                    "a config write of several disks failed; trying them one by one"
                );
                rounds.per_write = 1;
            }
            Err(e) if e.kind() == ErrorKind::NotFound && attempt < 3 => {
                attempt += 1;
                match follow(att, client, node, vmid, deadline).await {
                    Ok(Some(now)) if now != *node => {
                        *node = now;
                        rounds.view = None;
                    }
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
                        let err = Arc::new(CtlError::from(e));
                        for j in jobs.drain(..) {
                            let _ = j.reply.send(Err(CtlError::Shared(err.clone())));
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
                let err = Arc::new(CtlError::from(e));
                for j in jobs.drain(..) {
                    let _ = j.reply.send(Err(CtlError::Shared(err.clone())));
                }
                return;
            }
        }
    }
    *view = rounds.view;
}

/// A VM's committed config and the keys it has pending.
struct View {
    cfg: crate::pve::api::VmConfig,
    pending: BTreeSet<String>,
}

/// VM `vmid`'s [`View`], both read at once.
async fn read_view(client: &Client, node: &str, vmid: u32, d: Deadline) -> Result<View, PveError> {
    let (cfg, pending) = tokio::try_join!(
        client.vm_config(node, vmid, d),
        client.vm_pending(node, vmid, d)
    )?;
    let pending = pending
        .into_iter()
        .filter(|p| p.pending.is_some() || p.delete.is_some())
        .map(|p| p.key)
        .collect();
    Ok(View { cfg, pending })
}

/// What one round of a batch hands the next.
struct Rounds {
    /// Changes a write may hold: one at a time once a write of several
    /// failed as a whole.
    per_write: usize,
    /// The VM as the last round's verification read it, taken by the next.
    view: Option<View>,
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
    rounds: &mut Rounds,
    d: Deadline,
) -> Result<Round, PveError> {
    let region = client.region();
    let View { cfg, pending } = match rounds.view.take() {
        Some(v) => v,
        None => read_view(client, node, vmid, d).await?,
    };
    // Proxmox refuses to remove a disk of a protected VM. The controller's
    // own VMs are unprotected for the write that removes one (and protected
    // again by it); a worker's flag is the operator's, and is kept.
    let vm = VmView {
        vmid,
        config: &cfg.values,
        pending: &pending,
        own: att.is_own(region, vmid, &cfg.values),
    };
    let ops: Vec<&Op> = jobs.iter().map(|j| &j.op).collect();
    let mut c = match plan::plan(&vm, &ops, rounds.per_write) {
        Plan::LiftProtection => {
            let lift = [
                ("delete", "protection".to_string()),
                ("digest", cfg.digest.clone()),
            ];
            client.update_config(node, vmid, &lift, d).await?;
            return Ok(Round::Done);
        }
        Plan::Write(c) => c,
    };
    att.record(region, vmid, &c.present, &c.absent).await;
    // Answer what needed no write.
    answer(jobs, std::mem::take(&mut c.answers));
    if c.is_empty() {
        // An own VM left unprotected (a lift whose removal found nothing
        // left to remove, or a VM of an earlier version) is protected now.
        if c.protect {
            client
                .update_config(node, vmid, &c.form(&cfg.digest), d)
                .await?;
        }
        return Ok(Round::Done);
    }
    let multi = c.len() > 1;
    att.writes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    BATCH_SIZE.observe(c.len() as f64);
    let (plugs, unplugs) = (c.sets.len(), c.deletes.len());
    let expect = att.pace.expect(region, vmid, plugs, unplugs);
    let result = client
        .update_config_expecting(node, vmid, &c.form(&cfg.digest), expect, d)
        .await
        .map(|seen| {
            if let Some(seen) = seen {
                att.pace.learn(region, vmid, plugs, unplugs, seen);
            }
        });
    // A task that failed after its UPID may have left part of the change
    // (qemu-server writes each new disk key in its own step, and a hot-plug
    // failure leaves that key pending): whatever the error's kind, even a
    // transient one, verify and revert before answering. Only a lost digest
    // race wrote nothing (qemu-server checks the digest first).
    let failure = match result {
        Ok(()) => None,
        Err(ref e @ PveError::Task { ref exitstatus, .. })
            if e.kind() != ErrorKind::DigestMismatch =>
        {
            Some(exitstatus.clone())
        }
        Err(ref e @ PveError::Api { ref message, .. }) if e.kind() == ErrorKind::HotplugFailed => {
            Some(message.clone())
        }
        Err(ref e) if e.is_transient() || e.kind() == ErrorKind::DigestMismatch => {
            return result.map(|()| Round::Done);
        }
        // Refused as a whole (nothing written): one change at a time tells
        // which one Proxmox refuses.
        Err(_) if multi => return Ok(Round::Split),
        Err(e) => {
            let err = Arc::new(CtlError::from(e));
            let failed: Vec<Answer> = jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| c.holds(j.op.volid()))
                .map(|(i, _)| (i, Err(CtlError::Shared(err.clone()))))
                .collect();
            answer(jobs, failed);
            return Ok(Round::Done);
        }
    };
    let outcome = WriteOutcome {
        failure,
        // A busy VM or cluster: what did not happen is tried again (after
        // the check below), within the deadline.
        retry_rest: result.as_ref().is_err_and(PveError::is_transient),
        denied: result
            .as_ref()
            .err()
            .filter(|e| e.kind() == ErrorKind::PermissionDenied)
            .map(crate::error::permission_remedy),
    };

    // Verify against the committed config; revert what stayed pending.
    let View {
        cfg: after,
        pending: still_pending,
    } = read_view(client, node, vmid, d).await?;
    let stuck = verify::left_pending(&c, &still_pending);
    if !stuck.is_empty() {
        let own_and_protected = vm.own && crate::vms::is_protected(&after.values);
        verify::revert(client, node, vmid, own_and_protected, &stuck, d).await;
    }
    let ops: Vec<&Op> = jobs.iter().map(|j| &j.op).collect();
    let judged = verify::judge(vmid, &after.values, &c, &ops, &outcome);
    att.record(region, vmid, &judged.present, &judged.absent)
        .await;
    for volid in &judged.kept_unused {
        tracing::warn!(
            vmid,
            volid,
            "Proxmox kept the detached disk as unusedN: the VM owns it (a static volume)"
        );
    }
    answer(jobs, judged.answers);
    if stuck.is_empty() {
        // Nothing was reverted: this is the VM as the next write finds it.
        rounds.view = Some(View {
            cfg: after,
            pending: still_pending,
        });
    }
    if outcome.retry_rest && !jobs.is_empty() {
        return result.map(|()| Round::Done);
    }
    if multi && outcome.failure.is_some() && !jobs.is_empty() {
        return Ok(Round::Split);
    }
    Ok(Round::Done)
}

fn answer(jobs: &mut Vec<Job>, mut done: Vec<Answer>) {
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
