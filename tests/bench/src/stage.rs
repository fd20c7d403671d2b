//! NodeStage against bare `mkfs` + `mount` on the same kind of loop device:
//! hostd's Stage (what NodeStage delegates: wait for the device by WWN,
//! probe for signatures, mkfs, mount) against the two commands alone, with
//! the same mkfs options, alternating, on fresh 1 GiB images. Needs root and
//! hostd built with the loop-resolver test feature.
//!
//! Two hostd rows per filesystem: an unmarked volume (a copy, a static PV:
//! hostd samples the signature-less disk for data before formatting) and a
//! marked one's first stage (`.csf-<cluster id>`, what every CreateVolume
//! makes: hostd zeroes its head and tail, notes the format, skips the
//! sample, formats 1 MiB short and writes a claim). The loop resolver takes
//! a loop device's backing file as the proof of its volume id (no
//! `<image>.noserial` beside it), so the mark counts here as it does on a
//! disk whose serial names the volume. hostd's own per-phase timings
//! (`timings_ms`: see [`PHASES`])
//! are printed, the rest of each Stage as "other"; and the two pieces that
//! differ, the wipe and the sample, are timed alone with the same O_DIRECT
//! I/O on fresh loop devices.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use proxmox_csi_proto::hostd::v1 as pb;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use sha2::{Digest, Sha256};

use testkit::loopdev::Loop;

use crate::percentile;

/// A cluster id, as the controller marks the disks it creates blank.
pub const CLUSTER: &str = "5bc58ec71c2d";
const MIB: u64 = 1 << 20;

/// hostd's timed phases of a filesystem Stage, in the order they run
/// (`timings_ms`, named in hostd.proto): the request's paths and kubelet's
/// records checked, waiting for the device, its WWN and serial verified,
/// the checks before anything is written (mount table, device unused, the
/// claim looked for), a first stage's probe for a signature made since
/// allocation, its wipe, the plan (the probe, and the data sample of an
/// unmarked volume), mkfs alone, the claim written, the mount, hostd's
/// record.
pub const PHASES: [&str; 11] = [
    "request", "wait", "identity", "checks", "probe", "wipe", "plan", "mkfs", "claim", "mount",
    "record",
];

/// hostd's phases of one Stage of `total` ms, as `names` (a subset of
/// `timings_ms`' keys; its "mkfs" includes its plan, taken out here), and
/// the rest of `total`.
pub fn split<const N: usize>(
    names: [&str; N],
    total: f64,
    get: impl Fn(&str) -> f64,
) -> ([f64; N], f64) {
    let phases = names.map(|k| match k {
        "mkfs" => (get("mkfs") - get("plan")).max(0.0),
        k => get(k),
    });
    (phases, total - phases.iter().sum::<f64>())
}

/// Medians of one kind of Stage: the whole call, hostd's phases (as
/// [`PHASES`]) and the rest (the node plugin, the RPCs, untimed steps).
#[derive(Debug, Clone, Default)]
pub struct Phases {
    pub total_ms: f64,
    pub phase_ms: [f64; PHASES.len()],
    pub other_ms: f64,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub fs: String,
    pub unmarked: Phases,
    pub marked: Phases,
    pub bare_ms: f64,
    pub bare_mkfs_ms: f64,
    pub bare_mount_ms: f64,
    pub hostd_rss_kib: u64,
}

/// Medians of the two pieces alone on fresh 1 GiB loop devices.
#[derive(Debug, Clone, Default)]
pub struct Pieces {
    /// `claim::wipe`: 8 MiB at the head and the last MiB zeroed with
    /// BLKZEROOUT, then fsync.
    pub wipe_ms: f64,
    /// The same ranges as the wipe wrote them before: 1 MiB
    /// O_DIRECT|O_SYNC writes of zeros, then fsync.
    pub wipe_written_ms: f64,
    /// `probe::samples` of a 1 GiB disk read with O_DIRECT.
    pub sample_ms: f64,
    /// The same reads again on the same device, right after.
    pub sample_again_ms: f64,
    pub sample_mib: f64,
}

#[derive(Default)]
struct Samples {
    total: Vec<f64>,
    phases: [Vec<f64>; PHASES.len()],
    other: Vec<f64>,
}

impl Samples {
    fn push(&mut self, total: f64, t: &HashMap<String, u64>) {
        let (phases, other) = split(PHASES, total, |k| t.get(k).copied().unwrap_or(0) as f64);
        self.total.push(total);
        for (v, ms) in self.phases.iter_mut().zip(phases) {
            v.push(ms);
        }
        self.other.push(other);
    }

    fn medians(mut self) -> Phases {
        let mut phase_ms = [0.0; PHASES.len()];
        for (m, v) in phase_ms.iter_mut().zip(self.phases.iter_mut()) {
            *m = percentile(v, 50.0);
        }
        Phases {
            total_ms: percentile(&mut self.total, 50.0),
            phase_ms,
            other_ms: percentile(&mut self.other, 50.0),
        }
    }
}

/// A zeroed buffer of `len` bytes aligned for O_DIRECT, inside `raw`.
fn aligned(raw: &mut Vec<u8>, len: usize) -> &mut [u8] {
    *raw = vec![0u8; len + 4096];
    let off = raw.as_ptr().align_offset(4096);
    &mut raw[off..off + len]
}

/// hostd's `probe::samples`: the first MiB, 64 KiB at every MiB to
/// 64 MiB, then every 64 MiB to 4 GiB, and the last MiB.
fn samples(size: u64) -> Vec<(u64, u64)> {
    let mut at: Vec<(u64, u64)> = vec![(0, MIB.min(size))];
    let mut o = MIB;
    while o < size {
        let len = if o < (4 << 30) { 64 << 10 } else { 4 << 10 };
        at.push((o, len.min(size - o)));
        o += if o < (64 << 20) {
            MIB
        } else if o < (4 << 30) {
            64 << 20
        } else {
            1 << 30
        };
    }
    let tail = size.saturating_sub(MIB);
    at.push((tail, size - tail));
    at.sort_unstable();
    at.dedup();
    at
}

nix::ioctl_write_ptr_bad!(blkzeroout, nix::request_code_none!(0x12, 127), [u64; 2]);

/// Times `claim::wipe` on `dev` (ms): BLKZEROOUT of the first 8 MiB and
/// the last MiB, then fsync (`zeroout`), or, as it was before, nine 1 MiB
/// O_DIRECT|O_SYNC writes of zeros, then fsync.
fn wipe(dev: &Path, size: u64, zeroout: bool) -> Result<f64> {
    let mut raw = Vec::new();
    let zeros = aligned(&mut raw, MIB as usize);
    let t = Instant::now();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_DIRECT | if zeroout { 0 } else { nix::libc::O_SYNC })
        .open(dev)
        .with_context(|| dev.display().to_string())?;
    if zeroout {
        for range in [[0, 8 * MIB], [size - MIB, MIB]] {
            // SAFETY: the argument is the two u64s the ioctl reads.
            unsafe { blkzeroout(std::os::fd::AsRawFd::as_raw_fd(&f), &range) }
                .with_context(|| format!("BLKZEROOUT {}", dev.display()))?;
        }
    } else {
        for at in (0..8).map(|i| i * MIB).chain([size - MIB]) {
            f.write_all_at(zeros, at)?;
        }
    }
    f.sync_all()?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// Times reading `probe::samples` of `dev` with O_DIRECT (ms, MiB read).
fn sample(dev: &Path, size: u64) -> Result<(f64, f64)> {
    let mut raw = Vec::new();
    let buf = aligned(&mut raw, MIB as usize);
    let at = samples(size);
    let t = Instant::now();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(dev)
        .with_context(|| dev.display().to_string())?;
    for &(o, len) in &at {
        let b = &mut buf[..len as usize];
        f.read_exact_at(b, o)?;
        if b.iter().any(|&x| x != 0) {
            bail!("{}: data at byte {o}", dev.display());
        }
    }
    let mib = at.iter().map(|(_, l)| l).sum::<u64>() as f64 / MIB as f64;
    Ok((t.elapsed().as_secs_f64() * 1000.0, mib))
}

/// Prints what [`compare`] measured.
pub fn print(rounds: usize, rows: &[Row], idle: (u64, u64), pieces: &Pieces) {
    println!("stage: median of {rounds} rounds on fresh 1 GiB loop devices");
    println!(
        "  resident memory idle: hostd {} KiB, node plugin {} KiB",
        idle.0, idle.1
    );
    println!(
        "  | filesystem | volume | Stage ms | bare mkfs + mount ms | overhead ms | x bare | {} | other (node plugin, RPCs) | hostd RSS after KiB |",
        PHASES.join(" | ")
    );
    for r in rows {
        for (kind, p) in [
            ("unmarked", &r.unmarked),
            ("marked, first stage", &r.marked),
        ] {
            let phases: Vec<String> = p.phase_ms.iter().map(|m| format!("{m:.0}")).collect();
            println!(
                "  | {} | {kind} | {:.0} | {:.0} | {:+.0} | {:.2} | {} | {:.0} | {} |",
                r.fs,
                p.total_ms,
                r.bare_ms,
                p.total_ms - r.bare_ms,
                p.total_ms / r.bare_ms,
                phases.join(" | "),
                p.other_ms,
                r.hostd_rss_kib
            );
        }
        // The bare commands under hostd's mkfs and mount columns.
        let bare: Vec<String> = PHASES
            .iter()
            .map(|p| match *p {
                "mkfs" => format!("{:.0} (mkfs alone)", r.bare_mkfs_ms),
                "mount" => format!("{:.0}", r.bare_mount_ms),
                _ => String::new(),
            })
            .collect();
        println!(
            "  | {} | bare | {:.0} | {:.0} | | | {} | | |",
            r.fs,
            r.bare_ms,
            r.bare_ms,
            bare.join(" | ")
        );
    }
    println!(
        "  pieces alone, on a fresh 1 GiB loop device each: wipe (8 MiB head + last MiB, BLKZEROOUT + fsync) {:.1} ms, the same as nine 1 MiB O_DIRECT|O_SYNC writes {:.1} ms; data sample ({:.1} MiB read, O_DIRECT) {:.1} ms, the same reads again {:.1} ms",
        pieces.wipe_ms,
        pieces.wipe_written_ms,
        pieces.sample_mib,
        pieces.sample_ms,
        pieces.sample_again_ms
    );
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

/// One Stage and its Unstage of `volume_id` on the loop device named
/// `wwn`: the call's ms and hostd's phases.
async fn stage_once(
    client: &mut HostdClient<tonic::transport::Channel>,
    root: &Path,
    volume_id: &str,
    wwn: &str,
    fs: &str,
) -> Result<(f64, HashMap<String, u64>)> {
    let s = |p: &Path| p.display().to_string();
    // kubelet's staging path: the SHA-256 of the volume id (csi_attacher.go makeDeviceMountPath).
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
        volume_id: volume_id.into(),
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
    let reply = client
        .stage(req)
        .await
        .map_err(|e| anyhow::anyhow!("hostd Stage {volume_id}: {}", e.message()))?
        .into_inner();
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let marked = volume_id.contains(".csf-");
    if marked != reply.actions.iter().any(|a| a.starts_with("wiped")) {
        bail!(
            "{volume_id}: not staged as a {} volume: {:?}",
            if marked { "marked" } else { "unmarked" },
            reply.actions
        );
    }
    client
        .unstage(pb::UnstageRequest {
            volume_id: volume_id.into(),
            staging_path: s(&staging),
        })
        .await
        .map_err(|e| anyhow::anyhow!("hostd Unstage: {}", e.message()))?;
    Ok((ms, reply.timings_ms))
}

/// The rows, the idle resident memory of hostd and the node plugin (KiB),
/// and the wipe and sample timed alone.
pub async fn compare(rounds: usize) -> Result<(Vec<Row>, (u64, u64), Pieces)> {
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
    let (mut wipes, mut written) = (Vec::new(), Vec::new());
    let (mut reads, mut again, mut mib) = (Vec::new(), Vec::new(), 0.0);
    for fs in ["ext4", "xfs"] {
        let (mut unmarked, mut marked) = (Samples::default(), Samples::default());
        let (mut bare, mut bare_made, mut bare_mount) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rounds {
            // hostd: Stage finds the loop device by its image's name.
            for (k, volume_id) in [
                format!("region-1/pve1/local-lvm/vm-9999-{fs}-{i}"),
                format!("region-1/pve1/local-lvm/vm-9999-{fs}-{i}.csf-{CLUSTER}"),
            ]
            .into_iter()
            .enumerate()
            {
                let wwn = format!("5000c5{k:02x}{:04x}{i:04x}", fs.len());
                let dev = attach(&images.join(format!("{wwn}.raw")))?;
                let (ms, t) = stage_once(&mut client, &root, &volume_id, &wwn, fs).await?;
                if k == 0 { &mut unmarked } else { &mut marked }.push(ms, &t);
                drop(dev);
            }

            // Bare: the same mkfs and a mount, nothing else.
            let dev = attach(&d.join(format!("bare-{fs}-{i}.raw")))?;
            let mnt = d.join(format!("bare-{fs}-{i}"));
            std::fs::create_dir_all(&mnt)?;
            let t = Instant::now();
            bare_mkfs(fs, &s(&dev.dev))?;
            let made = t.elapsed().as_secs_f64() * 1000.0;
            run("mount", &[&s(&dev.dev), &s(&mnt)])?;
            let all = t.elapsed().as_secs_f64() * 1000.0;
            bare.push(all);
            bare_made.push(made);
            bare_mount.push(all - made);
            run("umount", &[&s(&mnt)])?;
            drop(dev);

            // The pieces alone: the sample, then the wipe, each on a fresh device.
            let dev = attach(&d.join(format!("sample-{fs}-{i}.raw")))?;
            let (ms, m) = sample(&dev.dev, 1 << 30)?;
            reads.push(ms);
            again.push(sample(&dev.dev, 1 << 30)?.0);
            mib = m;
            drop(dev);
            let dev = attach(&d.join(format!("wipe-{fs}-{i}.raw")))?;
            wipes.push(wipe(&dev.dev, 1 << 30, true)?);
            drop(dev);
            let dev = attach(&d.join(format!("written-{fs}-{i}.raw")))?;
            written.push(wipe(&dev.dev, 1 << 30, false)?);
            drop(dev);
        }
        rows.push(Row {
            fs: fs.into(),
            unmarked: unmarked.medians(),
            marked: marked.medians(),
            bare_ms: percentile(&mut bare, 50.0),
            bare_mkfs_ms: percentile(&mut bare_made, 50.0),
            bare_mount_ms: percentile(&mut bare_mount, 50.0),
            hostd_rss_kib: crate::rss_kib(hostd.pid()).0,
        });
    }
    let pieces = Pieces {
        wipe_ms: percentile(&mut wipes, 50.0),
        wipe_written_ms: percentile(&mut written, 50.0),
        sample_ms: percentile(&mut reads, 50.0),
        sample_again_ms: percentile(&mut again, 50.0),
        sample_mib: mib,
    };
    node.stop().await.map_err(anyhow::Error::msg)?;
    hostd.stop().await.map_err(anyhow::Error::msg)?;
    Ok((rows, idle_rss, pieces))
}
