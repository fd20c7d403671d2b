//! NodeStage against bare `mkfs` + `mount` on the same kind of loop device:
//! hostd's Stage (what NodeStage delegates: wait for the device by WWN,
//! probe for signatures, mkfs, mount) against the two commands alone, with
//! the same mkfs options, alternating, on fresh 1 GiB images. Needs root and
//! hostd built with the loop-resolver test feature.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use proxmox_csi_proto::hostd::v1 as pb;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use sha2::{Digest, Sha256};

use testkit::loopdev::Loop;

use crate::percentile;

#[derive(Debug, Clone)]
pub struct Row {
    pub fs: String,
    pub hostd_ms: f64,
    pub bare_ms: f64,
    pub hostd_rss_kib: u64,
}

/// A fresh 1 GiB image at `img` on a loop device.
fn attach(img: &Path) -> Result<Loop> {
    Loop::create(img, 1 << 30).map_err(anyhow::Error::msg)
}

fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| cmd.to_string())?;
    if !out.status.success() {
        bail!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The options hostd's mkfs uses (hostd/src/mkfs.rs).
fn bare_mkfs(fs: &str, dev: &str) -> Result<()> {
    match fs {
        "ext4" => run("mkfs.ext4", &["-q", "-m0", "-E", "nodiscard", dev]),
        _ => run(
            "mkfs.xfs",
            &["-q", "-K", "-b", "size=4096", "-i", "size=512", dev],
        ),
    }
}

/// The rows, and the idle resident memory of hostd and the node plugin (KiB).
pub async fn compare(rounds: usize) -> Result<(Vec<Row>, (u64, u64))> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the stage benchmark uses loop devices and mounts: run it as root");
    }
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let (root, images) = (d.join("kubelet"), d.join("images"));
    std::fs::create_dir_all(&images)?;
    std::fs::create_dir_all(root.join("plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev"))?;
    let socket = d.join("hostd.sock");
    let s = |p: &Path| p.display().to_string();
    let hostd = demo::common::spawn(
        "proxmox-csi-hostd",
        &demo::common::bin("proxmox-csi-hostd")?,
        &[
            "--socket",
            &s(&socket),
            "--kubelet-root",
            &s(&root),
            "--loop-dir",
            &s(&images),
            "--device-events",
            "kernel",
            "--health-file",
            &s(&d.join("health.json")),
        ]
        .map(String::from),
        &d.join("hostd.log"),
    )?;
    let mut client = HostdClient::new(demo::common::channel(&socket).await?);
    // The node plugin beside it, for its memory.
    let node_sock = d.join("node.sock");
    let node = demo::common::spawn(
        "proxmox-csi-node",
        &demo::common::bin("proxmox-csi-node")?,
        &[
            "--csi-address",
            &format!("unix://{}", node_sock.display()),
            "--hostd-socket",
            &s(&socket),
            "--node-id",
            "worker-1",
            "--vmid",
            "200",
            "--region",
            "region-1",
            "--zone",
            "pve1",
            "--kubelet-root",
            &s(&root),
        ]
        .map(String::from),
        &d.join("node.log"),
    )?;
    demo::common::channel(&node_sock).await?;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let idle_rss = (crate::rss_kib(hostd.pid()).0, crate::rss_kib(node.pid()).0);
    let mut rows = Vec::new();
    for fs in ["ext4", "xfs"] {
        let (mut ours, mut bare) = (Vec::new(), Vec::new());
        for i in 0..rounds {
            // hostd: Stage finds the loop device by its image's name.
            let wwn = format!("5000c500{:04x}{i:04x}", fs.len());
            let dev = attach(&images.join(format!("{wwn}.raw")))?;
            // kubelet's staging path: the SHA-256 of the volume id (csi_attacher.go makeDeviceMountPath).
            let volume_id = format!("region-1/pve1/local-lvm/vm-9999-{fs}-{i}");
            let hash: String = Sha256::digest(volume_id.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let staging = root
                .join("plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev")
                .join(hash);
            std::fs::create_dir_all(&staging)?;
            let staging = staging.join("globalmount");
            let req = pb::StageRequest {
                volume_id: volume_id.clone(),
                device: Some(pb::Device {
                    wwn: format!("0x{wwn}"),
                    serial: String::new(),
                }),
                staging_path: s(&staging),
                access: Some(pb::stage_request::Access::Filesystem(pb::Filesystem {
                    fs_type: fs.into(),
                    ..Default::default()
                })),
                encryption: None,
                read_only: false,
            };
            let t = Instant::now();
            client
                .stage(req)
                .await
                .map_err(|e| anyhow::anyhow!("hostd Stage: {}", e.message()))?;
            ours.push(t.elapsed().as_secs_f64() * 1000.0);
            client
                .unstage(pb::UnstageRequest {
                    volume_id,
                    staging_path: s(&staging),
                })
                .await
                .map_err(|e| anyhow::anyhow!("hostd Unstage: {}", e.message()))?;
            drop(dev);

            // Bare: the same mkfs and a mount, nothing else.
            let dev = attach(&d.join(format!("bare-{fs}-{i}.raw")))?;
            let mnt = d.join(format!("bare-{fs}-{i}"));
            std::fs::create_dir_all(&mnt)?;
            let t = Instant::now();
            bare_mkfs(fs, &s(&dev.dev))?;
            run("mount", &[&s(&dev.dev), &s(&mnt)])?;
            bare.push(t.elapsed().as_secs_f64() * 1000.0);
            run("umount", &[&s(&mnt)])?;
            drop(dev);
        }
        rows.push(Row {
            fs: fs.into(),
            hostd_ms: percentile(&mut ours, 50.0),
            bare_ms: percentile(&mut bare, 50.0),
            hostd_rss_kib: crate::rss_kib(hostd.pid()).0,
        });
    }
    node.stop().await.map_err(anyhow::Error::msg)?;
    hostd.stop().await.map_err(anyhow::Error::msg)?;
    Ok((rows, idle_rss))
}
