//! A node of kubelet's on this host: hostd (root) and the node plugin as
//! uid 65534 with no capabilities, as the DaemonSet runs it. Disks arrive
//! as loop devices: hostd's test resolver (`--loop-dir`) reads a volume's
//! "WWN" as the loop device backed by `<images>/<wwn>.raw`. Needs root and
//! hostd built with the `loop-resolver` feature.

use std::path::{Path, PathBuf};
use std::process::Command;

use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use tonic::transport::Channel;

use crate::loopdev::{Loop, unmount_under};
use crate::process::Proc;
use crate::sim::REGION;
use crate::{bin, chmod, free_ports, wait_for};

/// The node plugin's uid: the chart's `runAsUser` for the unprivileged container.
pub const NODE_PLUGIN_UID: &str = "65534";

/// The node plugin's identity: the worker VM it runs in.
pub const NODE_ID: &str = "worker-2";
pub const VMID: &str = "112";
pub const ZONE: &str = "pve2";

/// hostd and the node plugin, their scratch directory, loops and sockets.
pub struct LoopNode {
    // Dropped in this order: the node plugin, hostd, the loops, the client,
    // and last the scratch directory.
    node_proc: Proc,
    hostd_proc: Proc,
    pub loops: Vec<Loop>,
    pub node: NodeClient<Channel>,
    pub dir: tempfile::TempDir,
    /// kubelet's root directory.
    pub root: PathBuf,
    /// The files behind the loop devices (`<wwn>.raw`).
    pub images: PathBuf,
    pub hostd_socket: PathBuf,
    pub csi_socket: PathBuf,
    /// Where hostd and the node plugin serve `/metrics` (127.0.0.1).
    pub hostd_metrics: u16,
    pub node_metrics: u16,
}

impl std::fmt::Debug for LoopNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopNode")
            .field("root", &self.root)
            .field("images", &self.images)
            .finish_non_exhaustive()
    }
}

/// hostd's binary, checked for the loop resolver.
pub fn hostd_bin() -> Result<PathBuf, String> {
    let hostd = bin("proxmox-csi-hostd");
    let help = Command::new(&hostd)
        .arg("--help")
        .output()
        .map_err(|e| format!("{}: {e}", hostd.display()))?;
    if !String::from_utf8_lossy(&help.stdout).contains("--loop-dir") {
        return Err(
            "hostd was built without the loop-resolver test feature: run \
             `cargo build -p proxmox-csi-hostd --features loop-resolver`"
                .into(),
        );
    }
    Ok(hostd)
}

impl LoopNode {
    /// Starts hostd (with `hostd_args` after the lab's own) and the node
    /// plugin, and connects to the node plugin.
    pub async fn start(hostd_args: &[&str]) -> Result<LoopNode, String> {
        let hostd = hostd_bin()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        chmod(dir.path(), 0o755).map_err(|e| e.to_string())?;
        let (root, images, sockets) = (
            dir.path().join("kubelet"),
            dir.path().join("images"),
            dir.path().join("sockets"),
        );
        for d in [&root, &images, &sockets] {
            std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
        }
        // The node plugin (uid 65534) creates its CSI socket here.
        chmod(&sockets, 0o777).map_err(|e| e.to_string())?;
        let (hostd_socket, csi_socket) = (sockets.join("hostd.sock"), sockets.join("csi.sock"));
        let s = |p: &Path| p.display().to_string();
        let [hostd_metrics, node_metrics] = free_ports()?;
        let mut args = vec![
            "--socket".to_string(),
            s(&hostd_socket),
            "--socket-mode".into(),
            "666".into(),
            "--allow-uid".into(),
            NODE_PLUGIN_UID.into(),
            "--kubelet-root".into(),
            s(&root),
            "--loop-dir".into(),
            s(&images),
            // This host runs no udevd: device events from the kernel.
            "--device-events".into(),
            "kernel".into(),
            "--device-wait".into(),
            "5".into(),
            "--health-file".into(),
            s(&dir.path().join("health.json")),
            "--metrics-address".into(),
            format!("127.0.0.1:{hostd_metrics}"),
        ];
        args.extend(hostd_args.iter().map(|a| a.to_string()));
        let hostd_proc = Proc::spawn("hostd", &hostd, &args, &dir.path().join("hostd.log"))?;
        wait_for(&hostd_socket).await?;
        let node_proc = Proc::spawn(
            "node plugin",
            "setpriv",
            &[
                &format!("--reuid={NODE_PLUGIN_UID}"),
                &format!("--regid={NODE_PLUGIN_UID}"),
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                &s(&bin("proxmox-csi-node")),
                "--csi-address",
                &format!("unix://{}", csi_socket.display()),
                "--hostd-socket",
                &s(&hostd_socket),
                "--node-id",
                NODE_ID,
                "--vmid",
                VMID,
                "--region",
                REGION,
                "--zone",
                ZONE,
                "--kubelet-root",
                &s(&root),
                "--metrics-address",
                &format!("127.0.0.1:{node_metrics}"),
            ],
            &dir.path().join("node.log"),
        )?;
        wait_for(&csi_socket).await?;
        let ch = proxmox_csi_common::client::unix_channel(csi_socket.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(LoopNode {
            dir,
            root,
            images,
            hostd_socket,
            csi_socket,
            hostd_metrics,
            node_metrics,
            loops: Vec::new(),
            node: NodeClient::new(ch),
            node_proc,
            hostd_proc,
        })
    }

    /// A new disk of `bytes` reaching the node: a loop device whose "WWN"
    /// (returned, without `0x`) is `5000c500` and `n` in hex.
    pub fn loop_disk(&mut self, n: u32, bytes: u64) -> Result<String, String> {
        let wwn = format!("5000c500{n:08x}");
        let dev = Loop::create(&self.image(&wwn), bytes)?;
        self.loops.push(dev);
        Ok(wwn)
    }

    /// The file behind the disk with `wwn`.
    pub fn image(&self, wwn: &str) -> PathBuf {
        self.images.join(format!("{wwn}.raw"))
    }

    /// The node plugin's process id.
    pub fn node_pid(&self) -> u32 {
        self.node_proc.pid()
    }

    pub fn node_log(&self) -> String {
        self.node_proc.log()
    }

    pub fn hostd_log(&self) -> String {
        self.hostd_proc.log()
    }
}

impl Drop for LoopNode {
    fn drop(&mut self) {
        unmount_under(&self.root);
    }
}
