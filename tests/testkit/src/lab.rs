//! A volume's whole life on this host: the controller binary on pvesim,
//! and hostd with the node plugin ([`LoopNode`]) on the worker VM 112,
//! where a disk published to VM 112 arrives as a loop device (pvesim's loop
//! host), found by hostd through the kernel's device events as it finds a
//! SCSI disk by its WWN. Needs root. The cluster is
//! [`storage_cluster`] with the single node pve2. With
//! [`Lab::start_in_kubernetes`] the controller also reads a Kubernetes API
//! (kubesim), as a deployed one does.

use std::path::{Path, PathBuf};

use crate::loopdev::detach_backed_by;
use crate::node::LoopNode;
use crate::process::Proc;
use crate::sim::{Running, Sim, State, cloud_config, storage_cluster};
use crate::{bin, free_ports, kubeconfig as kubeconfig_text, wait_for};

/// The controller binary on pvesim (TLS, its CA in the cloud config), and
/// the node on loop devices.
pub struct Lab {
    // Dropped first: the controller, then the node, then pvesim.
    controller: Proc,
    pub node: LoopNode,
    pub sim: Running,
    /// The Kubernetes API the controller reads, when started in one.
    pub kube: Option<kubesim::Running>,
    pub controller_socket: PathBuf,
    /// Where the controller serves `/metrics` (127.0.0.1).
    pub controller_metrics: u16,
}

impl Lab {
    /// Volumes on `storage`, a pvesim storage of type `kind`. Needs root.
    pub async fn start(storage: &str, kind: &str) -> Result<Lab, String> {
        Lab::start_with(storage, kind, None).await
    }

    /// Like `start`, the controller given a kubeconfig of kubesim, whose
    /// namespace kube-system has the UID `namespace_uid` (the cluster's id).
    pub async fn start_in_kubernetes(
        storage: &str,
        kind: &str,
        namespace_uid: &str,
    ) -> Result<Lab, String> {
        Lab::start_with(storage, kind, Some(namespace_uid)).await
    }

    async fn start_with(
        storage: &str,
        kind: &str,
        namespace_uid: Option<&str>,
    ) -> Result<Lab, String> {
        let node = LoopNode::start(&["--luks-pbkdf", "pbkdf2:1000"]).await?;
        let dir = node.dir.path().to_path_buf();
        let volumes = dir.join("volumes");
        std::fs::create_dir_all(&volumes).map_err(|e| e.to_string())?;
        let state = State::from_yaml(&storage_cluster(storage, kind, 214_748_364_800, &["pve2"]))
            .map_err(|e| e.to_string())?;
        let sim = Sim::new(state)
            .volume_dir(volumes)
            .loop_host(112, node.images.clone())
            .start("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let ca = dir.join("pvesim-ca.pem");
        std::fs::write(&ca, sim.ca_pem.as_deref().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        let config = dir.join("cloud-config.yaml");
        std::fs::write(
            &config,
            cloud_config(&sim.api_url(), Some(&ca), "  controllerVmID: 9999\n"),
        )
        .map_err(|e| e.to_string())?;
        let controller_socket = dir.join("sockets/controller.sock");
        // hostd's and the node plugin's ports are bound by now.
        let [controller_metrics] = free_ports()?;
        let mut args = vec![
            "--csi-address".to_string(),
            format!("unix://{}", controller_socket.display()),
            "--cloud-config".into(),
            config.display().to_string(),
            "--metrics-address".into(),
            format!("127.0.0.1:{controller_metrics}"),
        ];
        let kube = match namespace_uid {
            None => None,
            Some(uid) => {
                let kube = kubesim::start()
                    .await
                    .map_err(|e| format!("kubesim: {e}"))?;
                kube.put(
                    "namespaces",
                    serde_json::json!({"metadata": {"name": "kube-system", "uid": uid}}),
                );
                let kubeconfig = dir.join("kubeconfig");
                std::fs::write(&kubeconfig, kubeconfig_text(&kube.url, None))
                    .map_err(|e| e.to_string())?;
                args.extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
                Some(kube)
            }
        };
        let controller = Proc::spawn(
            "controller",
            bin("proxmox-csi-controller"),
            &args,
            &dir.join("controller.log"),
        )?;
        wait_for(&controller_socket).await?;
        Ok(Lab {
            controller,
            node,
            sim,
            kube,
            controller_socket,
            controller_metrics,
        })
    }

    pub fn dir(&self) -> &Path {
        self.node.dir.path()
    }

    /// kubelet's root directory of the node.
    pub fn kubelet_root(&self) -> &Path {
        &self.node.root
    }

    pub fn node_socket(&self) -> &Path {
        &self.node.csi_socket
    }

    /// The logs of the controller, the node plugin and hostd.
    pub fn logs(&self) -> String {
        format!(
            "--- controller.log\n{}\n--- node.log\n{}\n--- hostd.log\n{}",
            self.controller.log(),
            self.node.node_log(),
            self.node.hostd_log()
        )
    }
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab")
            .field("node", &self.node)
            .field("controller_socket", &self.controller_socket)
            .finish_non_exhaustive()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // pvesim's loop host attached these; loops still in use are
        // detached when their last user lets go.
        detach_backed_by(&self.node.images);
    }
}

/// Waits for the writeback of what a run wrote (file systems on loop
/// devices, their backing files), so that it does not stall what runs next.
pub fn settle() {
    let _ = std::process::Command::new("sync").status();
}
