//! What both versions of the demo share: the narration, the processes,
//! the cluster, and pvesim's admin view as evidence.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use callers::kubelet::Pod;
use callers::provisioner;
use tonic::transport::Channel;

pub const STEPS: usize = 12;
pub use testkit::sim::SECRET;

pub const CLUSTER: &str = r#"
cluster: demo
nodes: [{ name: pve1 }, { name: pve2 }, { name: pve3 }]
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
vms:
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci, scsi0: "local-lvm:vm-112-disk-0,iothread=1,size=32G" } }
volumes:
  - { volid: "local-lvm:vm-112-disk-0", node: pve2, size: 34359738368 }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
"#;

pub fn tty() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal()
}

pub fn step(n: usize, title: &str) {
    if tty() {
        println!("\n\x1b[1m{n}/{STEPS} {title}\x1b[0m");
    } else {
        println!("\n{n}/{STEPS} {title}");
    }
}

pub fn evidence(line: impl AsRef<str>) {
    for l in line.as_ref().lines() {
        println!("    {l}");
    }
}

pub use testkit::process::Proc;

/// A binary of the workspace beside this executable.
pub fn bin(name: &str) -> Result<PathBuf> {
    let path = testkit::bin(name);
    if !path.is_file() {
        bail!(
            "{name} is not built at {}: run `cargo build --workspace` (or `make demo`)",
            path.display()
        );
    }
    Ok(path)
}

pub fn spawn(name: &'static str, program: &Path, args: &[String], log: &Path) -> Result<Proc> {
    Proc::spawn(name, program, args, log).map_err(anyhow::Error::msg)
}

/// Stops `p` with SIGTERM; what happened, for the narration.
pub async fn stop(p: Proc) -> Result<String> {
    let name = p.name().to_string();
    let status = p.stop().await.map_err(anyhow::Error::msg)?;
    Ok(format!("{name} exited after SIGTERM: {status}"))
}

pub async fn channel(socket: &Path) -> Result<Channel> {
    testkit::wait_for(socket)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(proxmox_csi_common::client::unix_channel(socket.to_path_buf()).await?)
}

pub fn sh(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn mount_line(path: &Path) -> String {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .rfind(|l| l.split(' ').nth(1) == Some(path.to_str().unwrap_or("-")))
        .unwrap_or("(not mounted)")
        .to_string()
}

/// The claim both walks provision: `data` in `default`, 1 GiB, ReadWriteOnce;
/// the provisioner names its volume (and the PV) `pvc-<uid>`.
pub fn claim() -> provisioner::Claim {
    provisioner::Claim::new("data", "0c6e8a1b-5d2f-4e7a-9b3c-1f0e2d4c6a8b", 1 << 30)
}

/// The pod that mounts it.
pub fn pod() -> Pod {
    Pod::new("6f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0")
}

/// The node's topology term as NodeGetInfo reports it (kubelet labels the
/// Node with it; the provisioner's requirement names the selected node's).
pub fn term(segments: &std::collections::HashMap<String, String>) -> Vec<(&str, &str)> {
    segments
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// Writes a Go-driver-compatible cloud config (with `features`, YAML lines
/// indented by two, when given) and starts the controller on a socket in `d`;
/// its log goes to `d/controller.log`.
pub fn start_controller(
    d: &Path,
    api_url: &str,
    ca: &Path,
    features: &str,
) -> Result<(Proc, PathBuf)> {
    start_controller_with(d, &testkit::sim::cloud_config(api_url, Some(ca), features))
}

/// Starts the controller with this cloud config on a socket in `d`; its
/// log goes to `d/controller.log` (appended, so restarts keep the history).
pub fn start_controller_with(d: &Path, cloud_config: &str) -> Result<(Proc, PathBuf)> {
    let config = d.join("cloud-config.yaml");
    std::fs::write(&config, cloud_config)?;
    let socket = d.join("controller.sock");
    let controller = spawn(
        "proxmox-csi-controller",
        &bin("proxmox-csi-controller")?,
        &[
            "--csi-address".into(),
            format!("unix://{}", socket.display()),
            "--cloud-config".into(),
            config.display().to_string(),
        ],
        &d.join("controller.log"),
    )?;
    Ok((controller, socket))
}

/// Reads pvesim's admin view (the evidence of what Proxmox holds).
pub async fn reqwest_json(addr: &str, path: &str) -> Result<serde_json::Value> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()?;
    let v: serde_json::Value = client
        .get(format!("https://{addr}/pvesim/{path}"))
        .send()
        .await?
        .json()
        .await?;
    Ok(v["data"].clone())
}
