//! In two guest VMs bound to pvesim over QMP (VMs 112 and 113 on pve2,
//! Kubernetes nodes worker-2 and worker-3): a new ext4 volume's way to a
//! pod, phase by phase, as the sidecars and kubelet call the driver; then
//! the same volume moving to another pod on the same node, and to a pod on
//! the other node. Beside each, its floor, done by hand on another disk of
//! the same size with the fewest steps Proxmox and the guest allow.
//!
//! The driver's phases, timed from the host:
//! - a new volume: CreateVolume (the provisioner's request), ControllerPublish
//!   (the attacher's: hot-plug into VM 112), NodeStage split into hostd's
//!   phases (its `timings_ms`, from the node plugin's "volume staged" log
//!   line: the wait for the disk, which on a fresh attachment is the udev
//!   event, then checks, wipe, plan, mkfs, claim, mount) and the rest (the
//!   node plugin, the RPC), and NodePublish (kubelet's);
//! - to another pod on the same node: kubelet's NodeUnpublish and
//!   NodeUnstage for the old pod, NodeStage and NodePublish for the new one
//!   (the disk stays attached: the new pod is scheduled before the
//!   attach-detach controller detaches it);
//! - to another node: NodeUnpublish and NodeUnstage in the first guest,
//!   ControllerUnpublish (hot-unplug from VM 112), ControllerPublish
//!   (hot-plug into VM 113), the udev event, NodeStage and NodePublish in
//!   the second guest.
//!
//! The floors: a new volume is Proxmox's allocation (one `POST
//! …/storage/…/content`), one hot-plug (one `POST …/config` and its task,
//! polled every 10 ms), then, timed inside the guest, the disk's link in
//! /dev/disk/by-id appearing, `mkfs.ext4` with the driver's options and
//! `mount` (timed by the guest kernel's clock). The same-node move is `umount` and `mount`; the other-node move
//! is `umount`, one hot-unplug, one hot-plug into the other VM, the link
//! appearing there and `mount`. The data written by the first pod is read
//! back after each move.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use callers::kubelet::{Kubelet, Pod};
use callers::{attacher, provisioner};
use e2e::guest::Guest;
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::volume::ClusterId;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use reqwest::Method;
use serde_json::Value;
use tonic::Request;
use tonic::transport::Channel;

use crate::percentile;
use crate::sim::{SECRET, TOKEN};

const GIB: u64 = 1 << 30;
/// A cluster id, as the controller reads it from the kube-system namespace.
const CLUSTER: &str = "5bc58ec71c2d";
const NODE_A: &str = "worker-2/112";
const NODE_B: &str = "worker-3/113";
/// The slot the floor's disk takes; the driver's disks take the lowest free.
const FLOOR_SLOT: &str = "scsi30";
/// hostd's wait for the disk inside NodeStage: on a fresh attachment, the
/// udev event.
const WAIT: &str = "hostd's wait for the disk (udev event)";

/// One journey's phases, in order: (name, ms).
pub type Phases = Vec<(&'static str, f64)>;

/// Medians of every journey, the driver's beside its floor.
#[derive(Debug, Default)]
pub struct Report {
    pub rounds: usize,
    pub new_volume: (Phases, Phases),
    pub same_node: (Phases, Phases),
    pub other_node: (Phases, Phases),
    /// The median round trip of NodeGetCapabilities from the host into a
    /// guest (QEMU's user network and the guest's TCP, where kubelet uses
    /// a local unix socket): what every node RPC pays before any work.
    pub rpc_ms: f64,
}

/// Per-phase samples of one journey, in the order first pushed.
#[derive(Default)]
struct Journey(Vec<(&'static str, Vec<f64>)>);

impl Journey {
    fn push(&mut self, phase: &'static str, ms: f64) {
        match self.0.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, v)) => v.push(ms),
            None => self.0.push((phase, vec![ms])),
        }
    }

    fn medians(mut self) -> Phases {
        self.0
            .iter_mut()
            .map(|(p, v)| (*p, percentile(v, 50.0)))
            .collect()
    }
}

fn since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// The Proxmox API as the floor calls it: the bench's token, no retries.
struct Pve {
    api: String,
    http: reqwest::Client,
}

impl Pve {
    async fn call(&self, method: Method, path: &str, form: &[(&str, String)]) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.api))
            .header("Authorization", format!("PVEAPIToken={TOKEN}={SECRET}"));
        req = if method == Method::GET {
            req.query(form)
        } else {
            req.form(form)
        };
        let r = req.send().await?;
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{method} {path}: {status} {body}");
        }
        Ok(body["data"].clone())
    }

    /// `POST …/config` on VM `vmid` and its task to the end, polled every 10 ms.
    async fn config(&self, vmid: u32, form: &[(&str, String)]) -> Result<()> {
        let upid = self
            .call(
                Method::POST,
                &format!("/nodes/pve2/qemu/{vmid}/config"),
                form,
            )
            .await?;
        let Some(upid) = upid.as_str() else {
            return Ok(());
        };
        loop {
            let s = self
                .call(
                    Method::GET,
                    &format!("/nodes/pve2/tasks/{upid}/status"),
                    &[],
                )
                .await?;
            if s["status"] == "stopped" {
                if s["exitstatus"] != "OK" {
                    bail!("task {upid}: {}", s["exitstatus"]);
                }
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Initializes the guest kernel's random pool before anything is timed:
/// the test guest has no hardware RNG under TCG, and the first getrandom
/// (mke2fs's UUIDs, cryptsetup's salts) blocks about 3 s while the kernel
/// gathers jitter entropy. A read of /dev/random blocks the same way, once.
/// A worker VM with the host's CPU model has RDRAND and is ready at boot.
pub async fn random_ready(g: &mut Guest) -> Result<()> {
    g.sh("head -c 1 /dev/random > /dev/null").await.map(|_| ())
}

/// A guest and the node plugin inside it.
struct Worker {
    guest: Guest,
    node: NodeClient<Channel>,
    /// Kernel marks written so far (see [`Worker::timed`]).
    marks: usize,
}

impl Worker {
    async fn start(mut guest: Guest) -> Result<Self> {
        random_ready(&mut guest).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        // QEMU accepts the forwarded port before the guest listens: ready
        // is when Probe says hostd answers.
        loop {
            if let Ok(ch) = tonic::transport::Endpoint::from_shared(format!(
                "http://127.0.0.1:{}",
                guest.csi_port
            ))?
            .connect()
            .await
            {
                let mut probe = IdentityClient::new(ch.clone());
                if probe
                    .probe(callers::identity::probe())
                    .await
                    .is_ok_and(|r| r.into_inner().ready == Some(true))
                {
                    return Ok(Self {
                        guest,
                        node: NodeClient::new(ch),
                        marks: 0,
                    });
                }
            }
            if Instant::now() > deadline {
                bail!("the node plugin in a guest never answered");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn mkdirs(&mut self, dirs: Vec<String>) -> Result<()> {
        self.guest
            .sh(&format!("mkdir -p {}", dirs.join(" ")))
            .await
            .map(|_| ())
    }

    /// hostd's phases of the last NodeStage, from the node plugin's log
    /// line (`timings_ms=[("checks", 8), ("wait", 12), …]`).
    async fn last_timings(&mut self) -> Result<HashMap<String, f64>> {
        let line = self
            .guest
            .sh("grep 'volume staged' /run/node.log | tail -1")
            .await?;
        let list = line
            .split("timings_ms=[")
            .nth(1)
            .and_then(|r| r.split(']').next())
            .with_context(|| format!("no timings in the node plugin's line: {line}"))?;
        Ok(list
            .split("), ")
            .filter_map(|pair| {
                let (k, v) = pair
                    .trim_matches(|c| c == '(' || c == ')')
                    .split_once(", ")?;
                Some((k.trim_matches('"').to_string(), v.parse().ok()?))
            })
            .collect())
    }

    /// Runs `steps` (shell, one per phase) in the guest, each timed there
    /// by the kernel's clock: a line written to /dev/kmsg before and after
    /// each (the guest's `date` has no sub-second field); the ms of each.
    async fn timed(&mut self, steps: &[&str]) -> Result<Vec<f64>> {
        self.marks += 1;
        let tag = |i: usize| format!("bench-mark-{}-{i}", self.marks);
        // Unlimited: the kernel drops /dev/kmsg lines past 10 in 5 s otherwise.
        let mut script = format!(
            "echo on > /proc/sys/kernel/printk_devkmsg && echo {} > /dev/kmsg",
            tag(0)
        );
        for (i, s) in steps.iter().enumerate() {
            script.push_str(&format!(" && {s} && echo {} > /dev/kmsg", tag(i + 1)));
        }
        script.push_str(&format!(" && dmesg | grep 'bench-mark-{}-'", self.marks));
        let out = self.guest.sh(&script).await?;
        // `[   12.345678] bench-mark-3-1`
        let at: Vec<f64> = (0..=steps.len())
            .map(|i| {
                let t = tag(i);
                out.lines()
                    .find(|l| l.trim_end().ends_with(&t))
                    .and_then(|l| l.split(']').next())
                    .and_then(|s| s.trim_start_matches('[').trim().parse::<f64>().ok())
                    .with_context(|| format!("no kernel mark {t} in: {out}"))
            })
            .collect::<Result<_>>()?;
        Ok(at.windows(2).map(|w| (w[1] - w[0]) * 1000.0).collect())
    }
}

fn cluster(qmp_a: &std::path::Path, qmp_b: &std::path::Path) -> String {
    format!(
        "nodes: [{{ name: pve2 }}]\nstorages: [{{ id: local-lvm, type: lvmthin, total: 107374182400 }}]\n\
         vms:\n  - {{ vmid: 112, node: pve2, name: worker-2, qmp: \"{}\", config: {{ scsihw: virtio-scsi-pci }} }}\n\
         \x20 - {{ vmid: 113, node: pve2, name: worker-3, qmp: \"{}\", config: {{ scsihw: virtio-scsi-pci }} }}\n\
         users:\n  - {{ userid: kubernetes-csi@pve, tokens: [{{ name: csi, secret: {SECRET} }}] }}\n\
         roles:\n  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]\n\
         acl:\n  - {{ path: /, roles: [CSI], tokens: [\"{TOKEN}\"], users: [kubernetes-csi@pve] }}\n",
        qmp_a.display(),
        qmp_b.display()
    )
}

pub async fn run(rounds: usize) -> Result<Report> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (a, b) = tokio::join!(Guest::boot(), Guest::boot());
    let (a, b) = (a?, b?);
    let images = tempfile::tempdir()?;
    let sim = testkit::sim::plain_with(&cluster(&a.qmp, &b.qmp), |s| {
        s.volume_dir(images.path().to_path_buf())
    })
    .await
    .map_err(anyhow::Error::msg)?;
    let cfg = CloudConfig::parse(&testkit::sim::config_of(&sim))?;
    let mut controller = Controller::from_config(
        &cfg,
        Duration::from_secs(30),
        Default::default(),
        Duration::from_secs(60),
    )?;
    // As deployed: the controller reads the cluster's id at start, and the
    // disks it creates blank carry it (their first stage skips the sample).
    controller.cluster_id = Some(ClusterId::parse(CLUSTER).context("cluster id")?);
    let ctl = ControllerService(Arc::new(controller));
    let pve = Pve {
        api: sim.api_url(),
        http: reqwest::Client::new(),
    };
    let (mut a, mut b) = (Worker::start(a).await?, Worker::start(b).await?);
    let kubelet = Kubelet::new("/var/lib/kubelet");
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let mut report = Report {
        rounds,
        ..Default::default()
    };
    let (mut new, mut new_floor) = (Journey::default(), Journey::default());
    let (mut same, mut same_floor) = (Journey::default(), Journey::default());
    let (mut other, mut other_floor) = (Journey::default(), Journey::default());
    // One unmeasured round first: the guests' page caches and mkfs's
    // first run warm up alike for both sides.
    for i in 0..=rounds {
        let measured = i > 0;
        let keep = |j: &mut Journey, p: &'static str, ms: f64| {
            if measured {
                j.push(p, ms);
            }
        };

        // A new volume to a pod, through the driver.
        let uid = format!("pod-journey-{i}");
        let claim = provisioner::Claim::new(&uid, &uid, GIB as i64);
        let t = Instant::now();
        let pv = crate::sim::provision(&ctl, &sc, &claim, "pve2").await?;
        keep(&mut new, "CreateVolume", since(t));
        let t = Instant::now();
        let pc = ctl
            .controller_publish_volume(Request::new(attacher::controller_publish(&pv, NODE_A)))
            .await?
            .into_inner()
            .publish_context;
        keep(&mut new, "ControllerPublish (hot-plug)", since(t));
        a.mkdirs(kubelet.stage_dirs(&pv)).await?;
        let t = Instant::now();
        a.node
            .node_stage_volume(kubelet.node_stage(&pv, &pc, HashMap::new()))
            .await
            .map_err(|e| anyhow::anyhow!("NodeStage: {}", e.message()))?;
        let stage = since(t);
        for (p, ms) in stage_rows(stage, &a.last_timings().await?) {
            keep(&mut new, p, ms);
        }
        let first = Pod::new(&format!("0a0b0c0d-0000-4000-8000-{i:012}"));
        a.mkdirs(kubelet.publish_dirs(&first, &pv)).await?;
        let t = Instant::now();
        a.node
            .node_publish_volume(kubelet.node_publish(&pv, &first, &pc))
            .await
            .map_err(|e| anyhow::anyhow!("NodePublish: {}", e.message()))?;
        keep(&mut new, "NodePublish", since(t));
        let target = kubelet.target_path(&first, &pv);
        a.guest
            .sh(&format!("echo journey-{i} > {target}/kept && sync"))
            .await?;

        // To another pod on the same node.
        let t = Instant::now();
        a.node
            .node_unpublish_volume(kubelet.node_unpublish(&pv, &first))
            .await
            .map_err(|e| anyhow::anyhow!("NodeUnpublish: {}", e.message()))?;
        keep(&mut same, "NodeUnpublish", since(t));
        let t = Instant::now();
        a.node
            .node_unstage_volume(kubelet.node_unstage(&pv))
            .await
            .map_err(|e| anyhow::anyhow!("NodeUnstage: {}", e.message()))?;
        keep(&mut same, "NodeUnstage", since(t));
        let t = Instant::now();
        a.node
            .node_stage_volume(kubelet.node_stage(&pv, &pc, HashMap::new()))
            .await
            .map_err(|e| anyhow::anyhow!("NodeStage again: {}", e.message()))?;
        let stage = since(t);
        for (p, ms) in stage_rows(stage, &a.last_timings().await?) {
            keep(&mut same, p, ms);
        }
        let second = Pod::new(&format!("1a0b0c0d-0000-4000-8000-{i:012}"));
        a.mkdirs(kubelet.publish_dirs(&second, &pv)).await?;
        let t = Instant::now();
        a.node
            .node_publish_volume(kubelet.node_publish(&pv, &second, &pc))
            .await
            .map_err(|e| anyhow::anyhow!("NodePublish: {}", e.message()))?;
        keep(&mut same, "NodePublish", since(t));
        let target = kubelet.target_path(&second, &pv);
        let kept = a.guest.sh(&format!("cat {target}/kept")).await?;
        if !kept.contains(&format!("journey-{i}")) {
            bail!("the second pod on the same node reads {kept:?}");
        }

        // To a pod on the other node.
        let t = Instant::now();
        a.node
            .node_unpublish_volume(kubelet.node_unpublish(&pv, &second))
            .await
            .map_err(|e| anyhow::anyhow!("NodeUnpublish: {}", e.message()))?;
        keep(&mut other, "NodeUnpublish", since(t));
        let t = Instant::now();
        a.node
            .node_unstage_volume(kubelet.node_unstage(&pv))
            .await
            .map_err(|e| anyhow::anyhow!("NodeUnstage: {}", e.message()))?;
        keep(&mut other, "NodeUnstage", since(t));
        let t = Instant::now();
        ctl.controller_unpublish_volume(Request::new(attacher::controller_unpublish(&pv, NODE_A)))
            .await?;
        keep(&mut other, "ControllerUnpublish (hot-unplug)", since(t));
        let t = Instant::now();
        let pc = ctl
            .controller_publish_volume(Request::new(attacher::controller_publish(&pv, NODE_B)))
            .await?
            .into_inner()
            .publish_context;
        keep(&mut other, "ControllerPublish (hot-plug)", since(t));
        b.mkdirs(kubelet.stage_dirs(&pv)).await?;
        let t = Instant::now();
        b.node
            .node_stage_volume(kubelet.node_stage(&pv, &pc, HashMap::new()))
            .await
            .map_err(|e| anyhow::anyhow!("NodeStage on the other node: {}", e.message()))?;
        let stage = since(t);
        for (p, ms) in stage_rows(stage, &b.last_timings().await?) {
            keep(&mut other, p, ms);
        }
        let third = Pod::new(&format!("2a0b0c0d-0000-4000-8000-{i:012}"));
        b.mkdirs(kubelet.publish_dirs(&third, &pv)).await?;
        let t = Instant::now();
        b.node
            .node_publish_volume(kubelet.node_publish(&pv, &third, &pc))
            .await
            .map_err(|e| anyhow::anyhow!("NodePublish: {}", e.message()))?;
        keep(&mut other, "NodePublish", since(t));
        let target = kubelet.target_path(&third, &pv);
        let kept = b.guest.sh(&format!("cat {target}/kept")).await?;
        if !kept.contains(&format!("journey-{i}")) {
            bail!("the pod on the other node reads {kept:?}");
        }
        // Done with it, untimed.
        b.node
            .node_unpublish_volume(kubelet.node_unpublish(&pv, &third))
            .await?;
        b.node
            .node_unstage_volume(kubelet.node_unstage(&pv))
            .await?;
        ctl.controller_unpublish_volume(Request::new(attacher::controller_unpublish(&pv, NODE_B)))
            .await?;
        ctl.delete_volume(Request::new(provisioner::delete_volume(&pv)))
            .await?;

        // The floor: the same journeys by hand on another disk.
        let wwn = format!("0x5000c5f100{i:06x}");
        let link = format!("/dev/disk/by-id/wwn-{wwn}");
        let t = Instant::now();
        let volid = pve
            .call(
                Method::POST,
                "/nodes/pve2/storage/local-lvm/content",
                &[
                    ("filename", format!("vm-112-disk-{}", 900 + i)),
                    ("format", "raw".into()),
                    ("vmid", "112".into()),
                    ("size", format!("{}", GIB / 1024)),
                ],
            )
            .await?;
        let volid = volid.as_str().context("allocation: no volid")?.to_string();
        keep(&mut new_floor, "allocation", since(t));
        let drive = format!("{volid},backup=0,iothread=1,wwn={wwn}");
        let t = Instant::now();
        pve.config(112, &[(FLOOR_SLOT, drive.clone())]).await?;
        keep(&mut new_floor, "hot-plug", since(t));
        let wait = format!("while [ ! -e {link} ]; do sleep 0.005; done");
        let made = a
            .timed(&[
                &wait,
                &format!("mkfs.ext4 -q -m0 -E nodiscard {link}"),
                &format!("mkdir -p /mnt/floor && mount {link} /mnt/floor"),
            ])
            .await?;
        for (p, ms) in ["udev event", "mkfs", "mount"].into_iter().zip(made) {
            keep(&mut new_floor, p, ms);
        }
        let moved = a
            .timed(&["umount /mnt/floor", &format!("mount {link} /mnt/floor")])
            .await?;
        for (p, ms) in ["umount", "mount"].into_iter().zip(moved) {
            keep(&mut same_floor, p, ms);
        }
        let gone = a.timed(&["umount /mnt/floor"]).await?;
        keep(&mut other_floor, "umount", gone[0]);
        let t = Instant::now();
        pve.config(112, &[("delete", FLOOR_SLOT.into())]).await?;
        keep(&mut other_floor, "hot-unplug", since(t));
        let t = Instant::now();
        pve.config(113, &[(FLOOR_SLOT, drive)]).await?;
        keep(&mut other_floor, "hot-plug", since(t));
        let there = b
            .timed(&[
                &wait,
                &format!("mkdir -p /mnt/floor && mount {link} /mnt/floor"),
            ])
            .await?;
        for (p, ms) in ["udev event", "mount"].into_iter().zip(there) {
            keep(&mut other_floor, p, ms);
        }
        b.guest.sh("umount /mnt/floor").await?;
        pve.config(113, &[("delete", FLOOR_SLOT.into())]).await?;
        pve.call(
            Method::DELETE,
            &format!("/nodes/pve2/storage/local-lvm/content/{volid}"),
            &[],
        )
        .await?;
    }
    let mut rtt = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        a.node
            .node_get_capabilities(callers::identity::node_get_capabilities())
            .await?;
        rtt.push(since(t));
    }
    report.rpc_ms = percentile(&mut rtt, 50.0);
    report.new_volume = (new.medians(), new_floor.medians());
    report.same_node = (same.medians(), same_floor.medians());
    report.other_node = (other.medians(), other_floor.medians());
    Ok(report)
}

/// A NodeStage of `total` ms as rows: hostd's phases (`timings_ms`: its
/// "mkfs" includes its plan) and the rest (the node plugin, the RPCs,
/// steps hostd does not time).
fn stage_rows(total: f64, t: &HashMap<String, f64>) -> Vec<(&'static str, f64)> {
    let get = |k: &str| t.get(k).copied().unwrap_or(0.0);
    let rows = vec![
        (WAIT, get("wait")),
        ("NodeStage: hostd's checks", get("checks")),
        ("NodeStage: wipe", get("wipe")),
        ("NodeStage: plan (probe)", get("plan")),
        ("NodeStage: mkfs", (get("mkfs") - get("plan")).max(0.0)),
        ("NodeStage: claim", get("claim")),
        ("NodeStage: mount", get("mount")),
    ];
    let timed: f64 = rows.iter().map(|(_, ms)| ms).sum();
    let mut rows = rows;
    rows.push(("NodeStage: node plugin, RPC, untimed", total - timed));
    rows
}

/// The floor's phases a driver phase stands against (none: the floor has
/// no such step, as kubelet's bind mount of a pod's directory).
fn counterpart(phase: &str) -> &'static [&'static str] {
    match phase {
        "CreateVolume" => &["allocation"],
        "ControllerPublish (hot-plug)" => &["hot-plug"],
        "ControllerUnpublish (hot-unplug)" => &["hot-unplug"],
        WAIT => &["udev event"],
        "NodeStage: mkfs" => &["mkfs"],
        "NodeStage: mount" => &["mount"],
        "NodeUnstage" => &["umount"],
        _ => &[],
    }
}

/// Prints one journey: the driver's phases beside their floor, the
/// totals, the largest gap.
fn print_journey(name: &str, (ours, floor): &(Phases, Phases)) {
    let total = |p: &Phases| p.iter().map(|(_, ms)| ms).sum::<f64>();
    let (t, f) = (total(ours), total(floor));
    println!(
        "  {name}: {t:.0} ms against a floor of {f:.0} ms ({:.2}x)",
        t / f
    );
    println!("  | driver phase | ms | floor counterpart | ms | gap ms |");
    let mut largest: Option<(&str, f64)> = None;
    for (phase, ms) in ours {
        let names = counterpart(phase);
        // `+ 0.0`: an empty sum of floats is -0.0.
        let base: f64 = floor
            .iter()
            .filter(|(f, _)| names.contains(f))
            .map(|(_, ms)| ms)
            .sum::<f64>()
            + 0.0;
        if ms.abs() < 0.5 && base < 0.5 {
            continue;
        }
        let gap = ms - base;
        println!(
            "  | {phase} | {ms:.0} | {} | {base:.0} | {gap:+.0} |",
            if names.is_empty() {
                "(none)".to_string()
            } else {
                names.join(" + ")
            }
        );
        if largest.is_none_or(|(_, g)| gap > g) {
            largest = Some((phase, gap));
        }
    }
    if let Some((phase, gap)) = largest {
        println!("  largest gap: {phase}, {gap:+.0} ms");
    }
}

/// Prints what [`run`] measured.
pub fn print(r: &Report) {
    println!(
        "guest pod: median of {} rounds, ext4 on hot-plugged 1 GiB disks, two QEMU TCG guests (VMs 112 and 113), pvesim over QMP",
        r.rounds
    );
    println!(
        "  a node RPC's round trip from the host into the guest (NodeGetCapabilities, median of 20): {:.1} ms",
        r.rpc_ms
    );
    print_journey("a new volume to a pod", &r.new_volume);
    print_journey("to another pod on the same node", &r.same_node);
    print_journey("to a pod on another node", &r.other_node);
}
