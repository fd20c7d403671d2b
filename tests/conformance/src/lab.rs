//! The driver on this host: the controller binary on pvesim, and the node
//! plugin with hostd on this host, where a disk published to the worker VM
//! (112) arrives as a loop device (pvesim's loop host), found by hostd
//! through the kernel's device events as it finds a SCSI disk by its WWN.
//! The tests that drive a volume through the real callers' requests
//! (`tests/kubernetes.rs`) run against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::node;

const SECRET: &str = "5f0c6e8a-1234-4b5c-9d7e-0123456789ab";

/// The simulated cluster: one Proxmox node (pve2), the worker VM 112 and a
/// second worker 113, and `storage` of `kind`.
fn cluster(storage: &str, kind: &str) -> String {
    let shared = match kind {
        "rbd" | "nfs" => ", shared: true",
        // PVE 9's LVM with qcow2 volume chains, where qcow2 is the default format.
        "lvm" => ", snapshot-as-volume-chain: true",
        _ => "",
    };
    format!(
        r#"
cluster: lab
nodes: [{{ name: pve2 }}]
storages:
  - {{ id: {storage}, type: {kind}, total: 214748364800{shared} }}
vms:
  - {{ vmid: 112, node: pve2, name: worker-2, config: {{ scsihw: virtio-scsi-pci }} }}
  - {{ vmid: 113, node: pve2, name: worker-3, config: {{ scsihw: virtio-scsi-pci }} }}
users:
  - userid: kubernetes-csi@pve
    tokens: [{{ name: csi, secret: {SECRET} }}]
roles:
  CSI: [VM.Audit, VM.Config.Disk, VM.Allocate, VM.Clone, VM.Config.Memory, VM.Config.CPU, VM.Config.HWType, VM.Config.Options, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - {{ path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }}
"#
    )
}

/// A child process killed when this is dropped (a test that panics too).
#[derive(Debug)]
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Detaches the loop devices pvesim made for files in `dir`.
fn detach_loops(dir: &Path) {
    for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let out = Command::new("losetup").arg("-j").arg(f.path()).output();
        let listed = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for dev in listed.lines().filter_map(|l| l.split(':').next()) {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

/// The driver on this host: the controller binary on pvesim, hostd and the
/// node plugin (worker-2, VM 112), disks reaching the node as loop devices.
pub struct Lab {
    pub target: node::Target,
    pub sim: pvesim::Running,
    _controller: Killed,
    pub controller_socket: PathBuf,
    pub node_socket: PathBuf,
    /// Where the controller serves `/metrics` (127.0.0.1).
    pub controller_metrics: u16,
}

impl Lab {
    /// Volumes on `storage`, a pvesim storage of type `kind`. Needs root.
    pub async fn start(storage: &str, kind: &str) -> Result<Lab, String> {
        let target = node::start().await?;
        let dir = target.dir.path().to_path_buf();
        let volumes = dir.join("volumes");
        std::fs::create_dir_all(&volumes).map_err(|e| e.to_string())?;
        let state = pvesim::State::from_yaml(&cluster(storage, kind)).map_err(|e| e.to_string())?;
        let sim = pvesim::Sim::new(state)
            .volume_dir(volumes)
            .loop_host(112, target.images.clone())
            .start("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let ca = dir.join("pvesim-ca.pem");
        std::fs::write(&ca, sim.ca_pem.as_deref().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        let config = dir.join("cloud-config.yaml");
        std::fs::write(
            &config,
            format!(
                "features:\n  controllerVmID: 9999\nclusters:\n  - url: {}\n    ca_file: {}\n    token_id: kubernetes-csi@pve!csi\n    token_secret: {SECRET}\n    region: region-1\n",
                sim.api_url(),
                ca.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let controller_socket = dir.join("sockets/controller.sock");
        // hostd's and the node plugin's ports are bound by now.
        let [controller_metrics] = node::free_ports()?;
        let controller = node::spawn(
            &node::bin("proxmox-csi-controller"),
            &[
                "--csi-address",
                &format!("unix://{}", controller_socket.display()),
                "--cloud-config",
                &config.display().to_string(),
                "--metrics-address",
                &format!("127.0.0.1:{controller_metrics}"),
            ],
            &dir.join("controller.log"),
        )
        .map_err(|e| format!("controller: {e}"))?;
        let controller = Killed(controller);
        node::wait_for(&controller_socket).await?;
        let node_socket = dir.join("sockets/csi.sock");
        Ok(Lab {
            target,
            sim,
            _controller: controller,
            controller_socket,
            node_socket,
            controller_metrics,
        })
    }

    pub fn dir(&self) -> &Path {
        self.target.dir.path()
    }

    /// kubelet's root directory of the node.
    pub fn kubelet_root(&self) -> &Path {
        &self.target.root
    }

    /// The logs of the controller, the node plugin and hostd.
    pub fn logs(&self) -> String {
        let log = |name: &str| std::fs::read_to_string(self.dir().join(name)).unwrap_or_default();
        format!(
            "--- controller.log\n{}\n--- node.log\n{}\n--- hostd.log\n{}",
            log("controller.log"),
            log("node.log"),
            log("hostd.log")
        )
    }
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab")
            .field("target", &self.target)
            .field("controller_socket", &self.controller_socket)
            .finish_non_exhaustive()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Loops still in use are detached when their last user lets go.
        detach_loops(&self.target.images);
    }
}

/// Waits for the writeback of what a run wrote (file systems on loop
/// devices, their backing files), so that it does not stall what runs next.
pub fn settle() {
    let _ = Command::new("sync").status();
}
