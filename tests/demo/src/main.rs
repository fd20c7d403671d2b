//! `make demo`: starts a simulated Proxmox cluster, the controller, hostd and
//! the node plugin as real processes, and talks CSI to them step by step,
//! showing the evidence of each step.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::hostd::v1 as hostd;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use pvesim::{Sim, State};
use tonic::transport::Channel;

const STEPS: usize = 7;
const TOKEN: &str = "kubernetes-csi@pve!csi";
const SECRET: &str = "0d1e5c1a-demo-4b5c-9d7e-000000000000";

fn step(n: usize, title: &str) {
    println!("\n\x1b[1m{n}/{STEPS} {title}\x1b[0m");
}

fn evidence(line: impl AsRef<str>) {
    println!("    {}", line.as_ref());
}

struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    fn stop(mut self) -> Result<()> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                evidence(format!("{} exited after SIGTERM: {status}", self.name));
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not stop within 10 s of SIGTERM", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    if !path.exists() {
        bail!("{} not built: run `cargo build --workspace --bins` first", path.display());
    }
    Ok(path)
}

fn spawn(name: &'static str, args: &[String], log: &Path) -> Result<Proc> {
    let child = Command::new(bin(name)?)
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    Ok(Proc { name, child })
}

async fn channel(socket: &Path) -> Result<Channel> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if Instant::now() > deadline {
            bail!("{} did not appear within 20 s", socket.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(proxmox_csi_common::client::unix_channel(socket.to_path_buf()).await?)
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    println!("Proxmox CSI driver demo (work directory {})", d.display());
    println!("This build has the Identity service of every component; volume provisioning,");
    println!("attach, stage and publish arrive with the controller, hostd and agent work.");

    step(1, "pvesim: a simulated Proxmox VE cluster over HTTPS");
    let (user, token) = TOKEN.split_once('!').context("token id")?;
    let state = State::from_yaml(&format!(
        "cluster: demo\nusers:\n  - userid: {user}\n    tokens:\n      - name: {token}\n        secret: {SECRET}\n"
    ))?;
    let sim = Sim::new(state).start("127.0.0.1:0").await?;
    let ca = d.join("pvesim-ca.pem");
    std::fs::write(&ca, sim.ca_pem.as_deref().unwrap_or_default())?;
    evidence(format!("API at {} (CA written to {})", sim.api_url(), ca.display()));

    step(2, "proxmox-csi-controller with a Go-driver-compatible cloud config");
    let config = d.join("cloud-config.yaml");
    std::fs::write(
        &config,
        format!(
            "features:\n  controllerVmID: 9999\nclusters:\n  - url: {}\n    ca_file: {}\n    token_id: {TOKEN}\n    token_secret: {SECRET}\n    region: region-1\n",
            sim.api_url(),
            ca.display()
        ),
    )?;
    let ctl_sock = d.join("controller.sock");
    let controller = spawn(
        "proxmox-csi-controller",
        &[
            "--csi-address".into(),
            format!("unix://{}", ctl_sock.display()),
            "--cloud-config".into(),
            config.display().to_string(),
        ],
        &d.join("controller.log"),
    )?;
    let mut ctl = IdentityClient::new(channel(&ctl_sock).await?);
    let info = ctl.get_plugin_info(csi::GetPluginInfoRequest {}).await?.into_inner();
    evidence(format!("GetPluginInfo: {} {}", info.name, info.vendor_version));

    step(3, "controller Probe: every configured cluster answers GET /version");
    let ready = ctl.probe(csi::ProbeRequest {}).await?.into_inner().ready;
    evidence(format!("Probe ready = {ready:?} (token authenticated against pvesim, TLS verified with its CA)"));

    step(4, "proxmox-csi-hostd: the privileged daemon on its unix socket");
    let hostd_sock = d.join("hostd.sock");
    let health_file = d.join("health.json");
    let hostd = spawn(
        "proxmox-csi-hostd",
        &[
            "--socket".into(),
            hostd_sock.display().to_string(),
            "--health-file".into(),
            health_file.display().to_string(),
            "--kubelet-root".into(),
            d.display().to_string(),
        ],
        &d.join("hostd.log"),
    )?;
    let mut h = HostdClient::new(channel(&hostd_sock).await?);
    let id = h.node_identity(hostd::NodeIdentityRequest {}).await?.into_inner();
    evidence(format!(
        "NodeIdentity: SMBIOS uuid {:?}, serial {:?}, vmid {}",
        id.system_uuid, id.system_serial, id.vmid
    ));

    step(5, "proxmox-csi-node: the unprivileged CSI node plugin, probing hostd");
    let node_sock = d.join("node.sock");
    let node = spawn(
        "proxmox-csi-node",
        &[
            "--csi-address".into(),
            format!("unix://{}", node_sock.display()),
            "--hostd-socket".into(),
            hostd_sock.display().to_string(),
            "--node-id".into(),
            "worker-2".into(),
            "--region".into(),
            "region-1".into(),
            "--zone".into(),
            "pve2".into(),
            "--kubelet-root".into(),
            d.display().to_string(),
        ],
        &d.join("node.log"),
    )?;
    let mut n = IdentityClient::new(channel(&node_sock).await?);
    let ready = n.probe(csi::ProbeRequest {}).await?.into_inner().ready;
    evidence(format!("node Probe ready = {ready:?} (hostd answered Health)"));

    step(6, "hostd health file, as `talosctl read /run/proxmox-csi-hostd/health.json` shows it");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !health_file.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health: serde_json::Value = serde_json::from_slice(&std::fs::read(&health_file)?)?;
    evidence(health.to_string());

    step(7, "clean shutdown on SIGTERM");
    node.stop()?;
    hostd.stop()?;
    controller.stop()?;
    let leaked = std::fs::read_to_string(d.join("controller.log"))?.contains(SECRET);
    evidence(format!("token secret in the controller's log: {}", if leaked { "YES (bug)" } else { "no" }));
    if leaked {
        bail!("the token secret reached a log");
    }
    println!("\nDemo finished.");
    Ok(())
}
