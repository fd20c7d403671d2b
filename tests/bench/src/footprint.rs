//! The node side's memory: hostd (built with the loop-resolver test
//! feature) and the node plugin (uid 65534, no capabilities, as the
//! DaemonSet runs it), idle, then with `n` volumes staged (ext4 on loop
//! devices, found by their "WWN") and each published to a pod, as kubelet
//! asks (NodeStageVolume, NodePublishVolume), then after unpublishing and
//! unstaging them all. Resident memory and its peak (VmHWM) are read from
//! /proc. Needs root. Every mount and loop device is undone when the
//! node is dropped (`testkit::node::LoopNode`), on failure too.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use callers::kubelet::{Kubelet, Pod};
use callers::provisioner;
use proxmox_csi_proto::csi::v1 as csi;
use testkit::node::LoopNode;

/// Resident memory and peak resident memory of hostd and the node plugin, KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mem {
    pub hostd: (u64, u64),
    pub node: (u64, u64),
}

#[derive(Debug, Clone)]
pub struct Footprint {
    pub volumes: usize,
    pub idle: Mem,
    pub staged: Mem,
    pub unstaged: Mem,
    /// Wall time of all the stages and publishes, one after the other.
    pub stage_publish_s: f64,
    /// Loop devices and mounts of the run still there after cleanup.
    pub loops_left: usize,
    pub mounts_left: usize,
}

/// hostd's process: the one whose `--socket` is `socket`.
fn hostd_pid(socket: &Path) -> Option<u32> {
    let want = socket.to_str()?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let hostd = args
            .first()
            .is_some_and(|a| a.ends_with(b"proxmox-csi-hostd"));
        let serves = args
            .windows(2)
            .any(|w| w[0] == b"--socket" && w[1] == want.as_bytes());
        (hostd && serves).then_some(pid)
    })
}

fn mem(hostd: u32, node: u32) -> Mem {
    Mem {
        hostd: crate::rss_kib(hostd),
        node: crate::rss_kib(node),
    }
}

/// The PersistentVolume of volume `i`: ext4, ReadWriteOnce, in the node's zone.
fn pv(i: usize, bytes: i64) -> callers::PersistentVolume {
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let name = format!("foot-{i:02}");
    let claim = provisioner::Claim::new(&name, &name, bytes);
    provisioner::persistent_volume(
        &sc,
        &claim,
        &csi::Volume {
            volume_id: format!(
                "{}/{}/local-lvm/vm-9999-pvc-{name}",
                testkit::sim::REGION,
                testkit::node::ZONE
            ),
            capacity_bytes: bytes,
            ..Default::default()
        },
    )
}

fn status(what: &str, r: Result<tonic::Response<impl Sized>, tonic::Status>) -> Result<()> {
    r.map(|_| ())
        .map_err(|s| anyhow::anyhow!("{what}: {}: {}", s.code(), s.message()))
}

/// Loop devices backed by a file under `dir`, and mounts under `root`.
fn left_behind(dir: &Path, root: &Path) -> (usize, usize) {
    let loops = demo::common::sh("losetup", &["--list", "--noheadings", "-O", "BACK-FILE"])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.trim().starts_with(&*dir.to_string_lossy()))
        .count();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&*root.to_string_lossy()))
        .count();
    (loops, mounts)
}

pub async fn run(volumes: usize, image_bytes: u64) -> Result<Footprint> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the footprint benchmark uses loop devices and mounts: run it as root");
    }
    let mut n = LoopNode::start(&[]).await.map_err(anyhow::Error::msg)?;
    let (dir, root) = (n.dir.path().to_path_buf(), n.root.clone());
    let hostd = hostd_pid(&n.hostd_socket).context("hostd's process not found")?;
    let node = n.node_pid();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = mem(hostd, node);

    let kubelet = Kubelet::new(&root.display().to_string());
    let mut staged = Vec::new();
    let t = Instant::now();
    for i in 0..volumes {
        let wwn = n
            .loop_disk(i as u32, image_bytes)
            .map_err(anyhow::Error::msg)?;
        let pc = HashMap::from([("wwn".to_string(), format!("0x{wwn}"))]);
        let pv = pv(i, image_bytes as i64);
        let pod = Pod::new(&format!("6f1e2d3c-4b5a-4968-8776-{i:012x}"));
        for d in kubelet
            .stage_dirs(&pv)
            .into_iter()
            .chain(kubelet.publish_dirs(&pod, &pv))
        {
            std::fs::create_dir_all(&d)?;
        }
        status(
            "NodeStageVolume",
            n.node
                .node_stage_volume(kubelet.node_stage(&pv, &pc, HashMap::new()))
                .await,
        )?;
        status(
            "NodePublishVolume",
            n.node
                .node_publish_volume(kubelet.node_publish(&pv, &pod, &pc))
                .await,
        )?;
        staged.push((pv, pod));
    }
    let stage_publish_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with = mem(hostd, node);

    for (pv, pod) in &staged {
        status(
            "NodeUnpublishVolume",
            n.node
                .node_unpublish_volume(kubelet.node_unpublish(pv, pod))
                .await,
        )?;
        status(
            "NodeUnstageVolume",
            n.node.node_unstage_volume(kubelet.node_unstage(pv)).await,
        )?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let unstaged = mem(hostd, node);
    drop(n);
    let (loops_left, mounts_left) = left_behind(&dir, &root);
    Ok(Footprint {
        volumes,
        idle,
        staged: with,
        unstaged,
        stage_publish_s,
        loops_left,
        mounts_left,
    })
}
