//! hostd's promise as invariants over generated call sequences: random
//! Stage / Publish / Unpublish / Unstage / Expand / Stats from the node
//! plugin's uid, with random volume ids on kubelet-shaped paths of several
//! pods and drivers (`vol_data.json` as kubelet writes it, bare targets,
//! block `publish/<pv>/<pod>` files), some calls cancelled mid-way, over
//! real loop devices. After every step the real mount table, the kubelet
//! tree and the disks are checked:
//!
//! - a volume's device is mounted or bound only at its own staging path
//!   and at targets kubelet ties to it with this driver (or that carry no
//!   record at all);
//! - nothing outside a volume's own layout was created, changed or removed
//!   (every kubelet record and foreign file keeps its bytes);
//! - no disk that held data was formatted (a filesystem, once made, keeps
//!   its UUID; the disk of raw data keeps its bytes);
//! - the volume created blank (its id marked, its disk holding a removed
//!   volume's ext4 and noise, as thick LVM hands them over) is formatted by
//!   its first stage, which is never refused, never mounts the filesystem
//!   the storage left, and is never formatted again: not after its disk
//!   grew, nor after its header was zeroed (steps of the generator too);
//! - every call that was not cancelled wrote exactly one audit line.
//!
//! `PROXMOX_CSI_INVARIANT_STEPS` (default 2,000) and
//! `PROXMOX_CSI_INVARIANT_SEED` choose the run; a violation is shrunk to
//! the shortest sequence that still breaks it, which is printed to become
//! a named regression test.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use proxmox_csi_proto::hostd::v1 as pb;
use support::*;

/// A small, seeded generator (xorshift64*): the same seed, the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The volumes: three filesystems and one raw block volume. Volume 2's
/// disk holds raw data (no signature) that no call may ever destroy;
/// volume 1 was created blank, and its disk holds what a removed volume left.
const VOLUMES: usize = 4;
const BLOCK: usize = 3;
const RAW_DATA: usize = 2;
const FRESH: usize = 1;
/// The fresh volume's disk: the controller's 512 MiB steps.
const STEP: u64 = 512 << 20;
const MAX_FRESH: u64 = 4 * STEP;
const PODS: [&str; 2] = ["pod-a", "pod-b"];

fn vol(i: usize) -> String {
    if i == FRESH {
        format!("region-1/pve1/san/vm-9999-pvc-{i}.csf-5bc58ec71c2d")
    } else {
        format!("region-1/pve1/local-lvm/vm-9999-pvc-{i}")
    }
}

fn pv(i: usize) -> String {
    format!("pv-{i}")
}

/// What a target's directory says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// kubelet's vol_data.json names this volume and this driver.
    Ours(usize),
    /// It names this volume, of another driver.
    OtherDriver(usize),
    /// No record: a bare directory.
    Bare,
}

#[derive(Debug, Clone)]
struct Target {
    path: PathBuf,
    record: Record,
    block: bool,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Stage {
        vol: usize,
        at: usize,
    },
    Publish {
        vol: usize,
        from: usize,
        target: usize,
        ro: bool,
    },
    Unpublish {
        vol: usize,
        target: usize,
    },
    Unstage {
        vol: usize,
        at: usize,
    },
    Expand {
        vol: usize,
        target: usize,
    },
    Stats {
        vol: usize,
        target: usize,
    },
    /// The controller grows the fresh volume's disk by a step (no hostd call).
    Grow,
    /// The fresh volume's first 16 MiB are zeroed while nothing mounts it:
    /// its header is gone (no hostd call).
    Damage,
}

#[derive(Debug, Clone, Copy)]
struct Step {
    op: Op,
    /// Cancelled by the caller after this many milliseconds.
    cancel_ms: Option<u64>,
}

struct World {
    env: Env,
    node: proxmox_csi_proto::hostd::v1::hostd_client::HostdClient<tonic::transport::Channel>,
    wwns: Vec<String>,
    stagings: Vec<PathBuf>,
    targets: Vec<Target>,
    /// Every file hostd must never change: its bytes.
    sentinels: BTreeMap<PathBuf, Vec<u8>>,
    /// Every path of the tree before the first call.
    initial: BTreeSet<PathBuf>,
    /// Each disk's filesystem UUID, once it has one.
    uuids: HashMap<usize, String>,
    /// The raw data disk's first bytes.
    raw: Vec<u8>,
    /// The UUID of the ext4 the storage left on the fresh volume's disk.
    stale: Option<String>,
    /// The fresh volume's header was zeroed.
    damaged: bool,
    audits: usize,
}

fn generate(rng: &mut Rng, steps: usize, targets: usize) -> Vec<Step> {
    (0..steps)
        .map(|_| {
            let vol = rng.below(VOLUMES);
            // Most requests name paths of their own volume; the rest name
            // another's, as an attacker would.
            let other = |rng: &mut Rng| {
                if rng.below(3) == 0 {
                    rng.below(VOLUMES)
                } else {
                    vol
                }
            };
            let op = match rng.below(11) {
                0..=2 => Op::Stage {
                    vol,
                    at: other(rng),
                },
                3..=5 => Op::Publish {
                    vol,
                    from: other(rng),
                    target: rng.below(targets),
                    ro: rng.below(4) == 0,
                },
                6 => Op::Unpublish {
                    vol,
                    target: rng.below(targets),
                },
                7 => Op::Unstage {
                    vol,
                    at: other(rng),
                },
                8 => Op::Expand {
                    vol,
                    target: rng.below(targets),
                },
                9 if rng.below(4) == 0 => {
                    if rng.below(2) == 0 {
                        Op::Grow
                    } else {
                        Op::Damage
                    }
                }
                _ => Op::Stats {
                    vol,
                    target: rng.below(targets),
                },
            };
            let cancel_ms = (rng.below(12) == 0).then(|| rng.below(40) as u64);
            Step { op, cancel_ms }
        })
        .collect()
}

impl World {
    async fn new() -> Self {
        let mut env = Env::start().await;
        let mut wwns = Vec::new();
        let mut stale = None;
        for i in 0..VOLUMES {
            let wwn = if i == FRESH {
                env.image_sized(100 + i as u32, STEP)
            } else {
                env.image_only(100 + i as u32)
            };
            if i == FRESH {
                // A removed volume's ext4, and noise past its metadata; the
                // first 4 KiB zeroed, as lvcreate does (its signature gone).
                let img = env.image(&wwn);
                support::run("mkfs.ext4", &["-q", "-F"], &img);
                stale = ext4_uuid(&img);
                let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &[0xa5; 1 << 20], 64 << 20).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &[0; 4096], 0).unwrap();
            }
            if i == RAW_DATA {
                // A database written to the raw disk: bytes, no signature.
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(env.image(&wwn))
                    .unwrap();
                std::io::Write::write_all(&mut f, &[0u8; 4096]).unwrap();
                std::io::Write::write_all(&mut f, &[0x5a; 1 << 20]).unwrap();
            }
            env.attach(&wwn);
            wwns.push(wwn);
        }
        let stagings = (0..VOLUMES)
            .map(|i| {
                if i == BLOCK {
                    env.block_staging(&pv(i))
                } else {
                    env.staging(&vol(i))
                }
            })
            .collect();
        let mut targets = Vec::new();
        let block_data = |i: usize| {
            env.root
                .join("plugins/kubernetes.io/csi/volumeDevices")
                .join(pv(i))
                .join("data")
        };
        for i in 0..VOLUMES {
            if i == BLOCK {
                write_vol_data(&block_data(i), &pv(i), &vol(i), DRIVER);
            }
            for (n, pod) in PODS.iter().enumerate() {
                if i == BLOCK {
                    targets.push(Target {
                        path: env.block_target(&pv(i), pod),
                        record: Record::Ours(i),
                        block: true,
                    });
                    continue;
                }
                let dir = env.target(pod, "volumes", &pv(i));
                let record = match n {
                    0 => Record::Ours(i),
                    _ if i == 0 => Record::OtherDriver(i),
                    _ => Record::Bare,
                };
                match record {
                    Record::Ours(v) => write_vol_data(&dir, &pv(i), &vol(v), DRIVER),
                    Record::OtherDriver(v) => {
                        write_vol_data(&dir, &pv(i), &vol(v), "secrets-store.csi.k8s.io")
                    }
                    Record::Bare => {}
                }
                targets.push(Target {
                    path: dir.join("mount"),
                    record,
                    block: false,
                });
            }
        }
        let mut sentinels = BTreeMap::new();
        let initial: BTreeSet<PathBuf> = walk(&env.root).into_iter().collect();
        for f in &initial {
            if f.is_file() {
                sentinels.insert(f.clone(), std::fs::read(f).unwrap());
            }
        }
        let node = env.node_plugin().await;
        let raw = head(&env.image(&wwns[RAW_DATA]));
        Self {
            env,
            node,
            wwns,
            stagings,
            targets,
            sentinels,
            initial,
            uuids: HashMap::new(),
            raw,
            stale,
            damaged: false,
            audits: 0,
        }
    }

    /// Whether anything mounts or binds the fresh volume's loop device.
    fn fresh_in_use(&self) -> bool {
        let img = self.env.image(&self.wwns[FRESH]);
        let dev = std::fs::read_to_string(format!(
            "/sys/block/{}/dev",
            loop_of(&img).file_name().unwrap().to_string_lossy()
        ))
        .unwrap_or_default();
        let dev = dev.trim();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(2) == Some(dev))
            || self.stagings[BLOCK].join("device").exists()
    }

    /// The steps that are not hostd calls.
    fn outside(&mut self, op: Op) {
        let img = self.env.image(&self.wwns[FRESH]);
        match op {
            Op::Grow => {
                let len = std::fs::metadata(&img).unwrap().len();
                if len < MAX_FRESH {
                    grow(&img, &loop_of(&img), len + STEP);
                }
            }
            Op::Damage if !self.fresh_in_use() => {
                let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &vec![0u8; 16 << 20], 0).unwrap();
                f.sync_all().unwrap();
                self.damaged = true;
            }
            _ => {}
        }
    }

    fn staging_req(&self, vol_i: usize, at: usize) -> pb::StageRequest {
        let staging = &self.stagings[at];
        let mut req = stage_req(&vol(vol_i), &self.wwns[vol_i], staging, "ext4");
        if at == BLOCK || vol_i == BLOCK {
            req.access = Some(pb::stage_request::Access::Block(pb::RawBlock {}));
        }
        req
    }

    /// Runs one step: whether it ran to its answer (not cancelled), and
    /// whether that answer was OK.
    async fn apply(&mut self, step: Step) -> (bool, bool) {
        if matches!(step.op, Op::Grow | Op::Damage) {
            self.outside(step.op);
            return (true, true);
        }
        let mut node = self.node.clone();
        let this = &*self;
        let t = |i: usize| this.targets[i].path.display().to_string();
        let call = async move {
            match step.op {
                Op::Stage { vol: v, at } => node.stage(this.staging_req(v, at)).await.is_ok(),
                Op::Publish {
                    vol: v,
                    from,
                    target,
                    ro,
                } => node
                    .publish(pb::PublishRequest {
                        volume_id: vol(v),
                        staging_path: this.stagings[from].display().to_string(),
                        target_path: t(target),
                        read_only: ro,
                        block: this.targets[target].block,
                        mount_flags: vec![],
                        single_writer: false,
                        device: None,
                    })
                    .await
                    .is_ok(),
                Op::Unpublish { vol: v, target } => node
                    .unpublish(pb::UnpublishRequest {
                        volume_id: vol(v),
                        target_path: t(target),
                    })
                    .await
                    .is_ok(),
                Op::Unstage { vol: v, at } => node
                    .unstage(pb::UnstageRequest {
                        volume_id: vol(v),
                        staging_path: this.stagings[at].display().to_string(),
                    })
                    .await
                    .is_ok(),
                Op::Expand { vol: v, target } => node
                    .expand(pb::ExpandRequest {
                        volume_id: vol(v),
                        volume_path: t(target),
                        required_bytes: 0,
                        encryption: None,
                    })
                    .await
                    .is_ok(),
                Op::Stats { vol: v, target } => node
                    .stats(pb::StatsRequest {
                        volume_id: vol(v),
                        volume_path: t(target),
                    })
                    .await
                    .is_ok(),
                Op::Grow | Op::Damage => true,
            }
        };
        match step.cancel_ms {
            None => (true, call.await),
            Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), call).await {
                Ok(ok) => (true, ok),
                Err(_) => (false, false),
            },
        }
    }

    /// Waits for a cancelled call's work on `v` to end: a no-op mutation of
    /// the same volume (Unpublish of a path nothing is at) takes its lock.
    async fn barrier(&mut self, v: usize) {
        let spare = self
            .env
            .target("pod-barrier", "volumes", &pv(v))
            .join("mount");
        self.node
            .unpublish(pb::UnpublishRequest {
                volume_id: vol(v),
                target_path: spare.display().to_string(),
            })
            .await
            .unwrap();
    }

    fn audit_lines(&self) -> usize {
        std::fs::read_to_string(&self.env.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("audit:"))
            .count()
    }

    /// Every invariant, against the real mount table, tree and disks.
    /// `audit`: how many audit lines the step must have written, if known.
    fn check(&mut self, audit: Option<usize>) -> Result<(), String> {
        let root = self.env.root.clone();
        // Which volume each loop device is.
        let mut volume_of: HashMap<String, usize> = HashMap::new();
        for l in &self.env.loops {
            let name = l.dev.file_name().unwrap().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
                .unwrap_or_default();
            let dev = std::fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap_or_default();
            if let Some(i) = self
                .wwns
                .iter()
                .position(|w| backing.trim().ends_with(&format!("{w}.raw")))
            {
                volume_of.insert(dev.trim().to_string(), i);
            }
        }
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for line in table.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let point = PathBuf::from(f[4]);
            if !point.starts_with(&root) {
                continue;
            }
            let sep = f.iter().position(|x| *x == "-").unwrap();
            let majmin = if f[sep + 1] == "devtmpfs" {
                std::fs::metadata(&point)
                    .map(|m| {
                        use std::os::unix::fs::MetadataExt;
                        format!(
                            "{}:{}",
                            nix::sys::stat::major(m.rdev()),
                            nix::sys::stat::minor(m.rdev())
                        )
                    })
                    .unwrap_or_default()
            } else {
                f[2].to_string()
            };
            if volume_of.get(&majmin) == Some(&FRESH)
                && self.stale.is_some()
                && ext4_uuid(&self.env.image(&self.wwns[FRESH])) == self.stale
            {
                return Err(format!(
                    "the ext4 the storage left on the fresh volume's disk is mounted at {}",
                    point.display()
                ));
            }
            let Some(&v) = volume_of.get(&majmin) else {
                return Err(format!(
                    "{} holds device {majmin}, which is no volume's",
                    point.display()
                ));
            };
            let own_staging = if v == BLOCK {
                self.stagings[v].join("device")
            } else {
                self.stagings[v].clone()
            };
            let allowed = point == own_staging
                || self.targets.iter().any(|t| {
                    t.path == point
                        && (matches!(t.record, Record::Ours(o) if o == v)
                            || t.record == Record::Bare)
                });
            if !allowed {
                return Err(format!(
                    "volume {v}'s device is mounted at {}",
                    point.display()
                ));
            }
        }
        for (file, bytes) in &self.sentinels {
            match std::fs::read(file) {
                Ok(b) if b == *bytes => {}
                Ok(_) => return Err(format!("{} was changed", file.display())),
                Err(e) => return Err(format!("{} is gone: {e}", file.display())),
            }
        }
        // Nothing new outside what publish and stage make, nothing of
        // kubelet's removed.
        let now: BTreeSet<PathBuf> = walk(&root).into_iter().collect();
        for p in now.difference(&self.initial) {
            let made_by_hostd = self.stagings[BLOCK].join("device") == *p
                || self.stagings.contains(p)
                || p.starts_with(root.join("pods/pod-barrier"))
                || self
                    .targets
                    .iter()
                    .any(|t| t.path == *p && !matches!(t.record, Record::OtherDriver(_)));
            if !made_by_hostd {
                return Err(format!("{} appeared", p.display()));
            }
        }
        if let Some(gone) = self.initial.difference(&now).next() {
            return Err(format!("{} was removed", gone.display()));
        }
        for (i, wwn) in self.wwns.iter().enumerate() {
            let img = self.env.image(wwn);
            if i == RAW_DATA {
                if head(&img) != self.raw {
                    return Err("the disk of raw data was written".into());
                }
                continue;
            }
            // The ext4 the storage left is not the fresh volume's own.
            let uuid = ext4_uuid(&img).filter(|u| i != FRESH || Some(u) != self.stale.as_ref());
            match (self.uuids.get(&i), uuid) {
                (Some(before), Some(now)) if *before != now => {
                    return Err(format!(
                        "volume {i}'s filesystem was made again ({before} → {now})"
                    ));
                }
                (Some(_), None) if i == FRESH && self.damaged => {}
                (Some(before), None) => {
                    return Err(format!("volume {i}'s filesystem {before} was wiped"));
                }
                (None, Some(now)) => {
                    self.uuids.insert(i, now);
                }
                _ => {}
            }
        }
        let audits = self.audit_lines();
        if let Some(want) = audit
            && audits != self.audits + want
        {
            return Err(format!(
                "{} audit lines for a call that must write {want}",
                audits - self.audits
            ));
        }
        self.audits = audits;
        Ok(())
    }
}

/// Files and directories under `dir`, not descending into mounts.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let dev = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(p).map(|m| m.dev()).unwrap_or(0)
    };
    let top = dev(dir);
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.clone());
            if e.file_type().is_ok_and(|t| t.is_dir()) && dev(&p) == top {
                todo.push(p);
            }
        }
    }
    out
}

/// The UUID of the ext4 filesystem on `img`, read from its superblock
/// (at 1024 bytes: the magic 0xEF53 at 0x38, the UUID at 0x68), if it has one.
fn ext4_uuid(img: &Path) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut sb = [0u8; 1024];
    std::fs::File::open(img)
        .ok()?
        .read_exact_at(&mut sb, 1024)
        .ok()?;
    (sb[0x38..0x3a] == [0x53, 0xef]).then(|| {
        sb[0x68..0x78]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    })
}

/// The first 2 MiB of `img`, where the raw data lies.
fn head(img: &Path) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 2 << 20];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut buf, 0)
        .unwrap();
    buf
}

fn mutating(op: &Op) -> bool {
    !matches!(op, Op::Stats { .. } | Op::Grow | Op::Damage)
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Stage { .. } => "Stage",
        Op::Publish { .. } => "Publish",
        Op::Unpublish { .. } => "Unpublish",
        Op::Unstage { .. } => "Unstage",
        Op::Expand { .. } => "Expand",
        Op::Stats { .. } => "Stats",
        Op::Grow => "Grow",
        Op::Damage => "Damage",
    }
}

fn op_volume(op: &Op) -> usize {
    match *op {
        Op::Stage { vol, .. }
        | Op::Publish { vol, .. }
        | Op::Unpublish { vol, .. }
        | Op::Unstage { vol, .. }
        | Op::Expand { vol, .. }
        | Op::Stats { vol, .. } => vol,
        Op::Grow | Op::Damage => FRESH,
    }
}

/// Runs `steps` on a new world; the index and text of the first
/// violation. Counts the OK answers of each kind of call in `oks`.
async fn run(
    steps: &[Step],
    oks: &mut BTreeMap<&'static str, usize>,
) -> Result<(), (usize, String)> {
    let mut w = World::new().await;
    w.check(Some(0)).map_err(|e| (0, e))?;
    for (i, step) in steps.iter().enumerate() {
        let never_formatted = !w.uuids.contains_key(&FRESH);
        let (ran, ok) = w.apply(*step).await;
        if ok {
            *oks.entry(op_name(&step.op)).or_default() += 1;
        }
        // Its own stage, at its own staging path: a first stage is never
        // refused, whatever the storage left.
        if ran
            && !ok
            && never_formatted
            && matches!(
                step.op,
                Op::Stage {
                    vol: FRESH,
                    at: FRESH
                }
            )
        {
            return Err((i, "the fresh volume's first stage was refused".into()));
        }
        let audit = if ran {
            Some(usize::from(mutating(&step.op)))
        } else {
            // The cancelled call's line is there or not, as it got to its
            // lock or not; the barrier's is.
            w.barrier(op_volume(&step.op)).await;
            None
        };
        w.check(audit).map_err(|e| (i, e))?;
    }
    Ok(())
}

/// The shortest prefix-and-subset of `steps` that still fails: greedy
/// removal of one step at a time, bounded.
async fn shrink(mut steps: Vec<Step>) -> Vec<Step> {
    let mut tries = 0;
    let mut i = 0;
    while i < steps.len() && tries < 300 {
        let mut fewer = steps.clone();
        fewer.remove(i);
        tries += 1;
        if run(&fewer, &mut BTreeMap::new()).await.is_err() {
            steps = fewer;
        } else {
            i += 1;
        }
    }
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_call_sequences_keep_every_invariant() {
    testkit::require_root!();
    let total: usize = std::env::var("PROXMOX_CSI_INVARIANT_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let seed: u64 = std::env::var("PROXMOX_CSI_INVARIANT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
    // Sequences of 250 steps, each on a new world, until `total` ran.
    let per_run = 250;
    let mut rng = Rng(seed);
    let targets = VOLUMES * PODS.len();
    let mut done = 0;
    let mut oks = BTreeMap::new();
    while done < total {
        let steps = generate(&mut rng, per_run.min(total - done), targets);
        if let Err((at, why)) = run(&steps, &mut oks).await {
            let failing: Vec<Step> = steps[..=at].to_vec();
            let shrunk = shrink(failing).await;
            panic!(
                "invariant broken after {} steps (seed {seed}): {why}\nshrunk to {} steps:\n{:#?}",
                done + at + 1,
                shrunk.len(),
                shrunk
            );
        }
        done += steps.len();
    }
    println!("{done} generated steps, 0 violations (seed {seed}); answered OK: {oks:?}");
}

/// The sequences the generator found against hostd before its calls were
/// bound to their volume at both ends, shrunk, kept as named cases.
async fn regression(steps: &[Step]) {
    testkit::require_root!();
    if let Err((at, why)) = run(steps, &mut BTreeMap::new()).await {
        panic!("step {at}: {why}");
    }
}

#[tokio::test]
async fn regression_stage_at_the_staging_directory_kubelet_names_for_another_volume() {
    regression(&[Step {
        op: Op::Stage { vol: 0, at: 1 },
        cancel_ms: None,
    }])
    .await;
}

#[tokio::test]
async fn regression_stage_at_another_volumes_block_staging_directory() {
    regression(&[Step {
        op: Op::Stage { vol: 0, at: BLOCK },
        cancel_ms: None,
    }])
    .await;
}

#[tokio::test]
async fn regression_publish_onto_a_target_kubelet_gave_another_volume() {
    regression(&[
        Step {
            op: Op::Stage { vol: 0, at: 0 },
            cancel_ms: None,
        },
        Step {
            op: Op::Publish {
                vol: 0,
                from: 0,
                target: 2,
                ro: false,
            },
            cancel_ms: None,
        },
    ])
    .await;
}

/// What the generator found against claims searched only at the disk's
/// current end: a disk grown by the controller before its next stage.
#[tokio::test]
async fn regression_a_fresh_volume_grown_before_its_next_stage_is_not_formatted_again() {
    let stage = Step {
        op: Op::Stage {
            vol: FRESH,
            at: FRESH,
        },
        cancel_ms: None,
    };
    regression(&[
        stage,
        Step {
            op: Op::Unstage {
                vol: FRESH,
                at: FRESH,
            },
            cancel_ms: None,
        },
        Step {
            op: Op::Grow,
            cancel_ms: None,
        },
        stage,
    ])
    .await;
}
