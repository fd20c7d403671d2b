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
//!   event, then checks, probe, wipe, plan, mkfs, claim, mount) and the rest (the
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
use callers::{PersistentVolume, attacher, provisioner};
use e2e::guest::Guest;
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::volume::ClusterId;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use reqwest::Method;
use tonic::Request;

use crate::guest_node::{Journey, Phases, WAIT, Worker, print_journey, since};
use crate::percentile;
use crate::sim::DirectApi;
use crate::stage::CLUSTER;

const GIB: u64 = 1 << 30;
const NODE_A: &str = "worker-2/112";
const NODE_B: &str = "worker-3/113";
/// The slot the floor's disk takes; the driver's disks take the lowest free.
const FLOOR_SLOT: &str = "scsi30";
/// Medians of every journey, the driver's beside its floor.
#[derive(Debug)]
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

/// `POST …/config` on VM `vmid` and its task to the end, polled every 10 ms.
async fn config(pve: &DirectApi, vmid: u32, form: &[(&str, String)]) -> Result<()> {
    let upid = pve
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
        let s = pve
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

/// The attacher's ControllerPublish of `pv` to `node`: its publish context.
async fn publish(
    ctl: &ControllerService,
    pv: &PersistentVolume,
    node: &str,
) -> Result<HashMap<String, String>> {
    Ok(ctl
        .controller_publish_volume(Request::new(attacher::controller_publish(pv, node)))
        .await?
        .into_inner()
        .publish_context)
}

pub async fn run(rounds: usize) -> Result<Report> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (a, b) = tokio::join!(Guest::boot(), Guest::boot());
    let (a, b) = (a?, b?);
    let images = tempfile::tempdir()?;
    let state = e2e::guest::guest_cluster_of(
        &[(112, "worker-2", &a.qmp), (113, "worker-3", &b.qmp)],
        testkit::sim::MINIMAL_ROLE,
    );
    let sim = testkit::sim::plain_with(&state, |s| s.volume_dir(images.path().to_path_buf()))
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
    let pve = DirectApi::new(&sim.api_url());
    let (mut a, mut b) = (Worker::start(a).await?, Worker::start(b).await?);
    let kubelet = Kubelet::new("/var/lib/kubelet");
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
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
        let pc = publish(&ctl, &pv, NODE_A).await?;
        keep(&mut new, "ControllerPublish (hot-plug)", since(t));
        for (p, ms) in a.stage(&kubelet, &pv, &pc, HashMap::new()).await? {
            keep(&mut new, p, ms);
        }
        let first = Pod::new(&format!("0a0b0c0d-0000-4000-8000-{i:012}"));
        keep(
            &mut new,
            "NodePublish",
            a.publish(&kubelet, &pv, &first, &pc).await?,
        );
        let target = kubelet.target_path(&first, &pv);
        a.guest
            .sh(&format!("echo journey-{i} > {target}/kept && sync"))
            .await?;

        // To another pod on the same node.
        let [unpublished, unstaged] = a.release(&kubelet, &pv, &first).await?;
        keep(&mut same, "NodeUnpublish", unpublished);
        keep(&mut same, "NodeUnstage", unstaged);
        for (p, ms) in a.stage(&kubelet, &pv, &pc, HashMap::new()).await? {
            keep(&mut same, p, ms);
        }
        let second = Pod::new(&format!("1a0b0c0d-0000-4000-8000-{i:012}"));
        keep(
            &mut same,
            "NodePublish",
            a.publish(&kubelet, &pv, &second, &pc).await?,
        );
        a.reads_kept(&kubelet, &pv, &second, i).await?;

        // To a pod on the other node.
        let [unpublished, unstaged] = a.release(&kubelet, &pv, &second).await?;
        keep(&mut other, "NodeUnpublish", unpublished);
        keep(&mut other, "NodeUnstage", unstaged);
        let t = Instant::now();
        ctl.controller_unpublish_volume(Request::new(attacher::controller_unpublish(&pv, NODE_A)))
            .await?;
        keep(&mut other, "ControllerUnpublish (hot-unplug)", since(t));
        let t = Instant::now();
        let pc = publish(&ctl, &pv, NODE_B).await?;
        keep(&mut other, "ControllerPublish (hot-plug)", since(t));
        for (p, ms) in b.stage(&kubelet, &pv, &pc, HashMap::new()).await? {
            keep(&mut other, p, ms);
        }
        let third = Pod::new(&format!("2a0b0c0d-0000-4000-8000-{i:012}"));
        keep(
            &mut other,
            "NodePublish",
            b.publish(&kubelet, &pv, &third, &pc).await?,
        );
        b.reads_kept(&kubelet, &pv, &third, i).await?;
        // Done with it, untimed.
        b.release(&kubelet, &pv, &third).await?;
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
        config(&pve, 112, &[(FLOOR_SLOT, drive.clone())]).await?;
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
        config(&pve, 112, &[("delete", FLOOR_SLOT.into())]).await?;
        keep(&mut other_floor, "hot-unplug", since(t));
        let t = Instant::now();
        config(&pve, 113, &[(FLOOR_SLOT, drive)]).await?;
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
        config(&pve, 113, &[("delete", FLOOR_SLOT.into())]).await?;
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
    Ok(Report {
        rounds,
        new_volume: (new.medians(), new_floor.medians()),
        same_node: (same.medians(), same_floor.medians()),
        other_node: (other.medians(), other_floor.medians()),
        rpc_ms: percentile(&mut rtt, 50.0),
    })
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
    for (name, journey) in [
        ("a new volume to a pod", &r.new_volume),
        ("to another pod on the same node", &r.same_node),
        ("to a pod on another node", &r.other_node),
    ] {
        print_journey(name, "a floor", journey, counterpart);
    }
}
