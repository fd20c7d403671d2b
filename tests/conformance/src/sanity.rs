//! csi-sanity (kubernetes-csi/csi-test, the suite CSI drivers run in CI)
//! against this driver: the controller binary on pvesim, and the node plugin
//! with hostd on this host, where a disk published to the worker VM (112)
//! arrives as a loop device (pvesim's loop host), found by hostd through the
//! kernel's device events as it finds a SCSI disk by its WWN.
//!
//! csi-sanity is built from the csi-test source in `../shared/tools/csi-sanity`
//! (its `build.sh`), under `target/csi-sanity`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Instant;

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
cluster: sanity
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

/// Which specs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Specs {
    /// Identity and Controller specs (the node plugin answers NodeGetInfo).
    Controller,
    /// Everything: Identity, Controller and Node.
    All,
}

/// What one csi-sanity run ended with.
#[derive(Debug)]
pub struct Outcome {
    pub passed: bool,
    /// Ginkgo's closing lines (`Ran N of M Specs`, `SUCCESS! -- …`).
    pub summary: String,
    pub output: String,
}

/// The workspace's root, from this crate's manifest directory.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds csi-sanity (once; `build.sh` reuses a build of the same source).
/// `Ok(None)`: `../shared` is not there. Tests running at the same time
/// wait for one build: two `build.sh` runs would share one directory.
pub fn build() -> Result<Option<PathBuf>, String> {
    static BUILT: std::sync::OnceLock<Result<Option<PathBuf>, String>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_once).clone()
}

fn build_once() -> Result<Option<PathBuf>, String> {
    let script = workspace().join("../shared/tools/csi-sanity/build.sh");
    if !script.exists() {
        return Ok(None);
    }
    let out = Command::new("bash")
        .arg(&script)
        .arg(workspace().join("target/csi-sanity"))
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "building csi-sanity failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Some(PathBuf::from(
        String::from_utf8_lossy(&out.stdout).trim(),
    )))
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

/// Runs a csi-sanity command (verbose, so that skipped specs show their
/// reason) and sums up its outcome.
pub async fn execute(mut cmd: tokio::process::Command, sanity: &Path) -> Result<Outcome, String> {
    cmd.arg("--ginkgo.v");
    let started = Instant::now();
    let out = cmd
        .output()
        .await
        .map_err(|e| format!("{}: {e}", sanity.display()))?;
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Vec<&str> = output
        .lines()
        .filter(|l| {
            l.starts_with("Ran ")
                || l.contains("Passed |")
                || l.starts_with("SUCCESS!")
                || l.starts_with("FAIL!")
        })
        .collect();
    // Ginkgo's verbose report marks a skipped spec `[SKIPPED]` with its reason on a later line.
    let mut reasons: Vec<String> = output
        .lines()
        .filter(|l| l.trim_start().starts_with("[SKIPPED] ") && !l.contains(" in [BeforeEach]"))
        .map(|l| l.trim().trim_start_matches("[SKIPPED] ").to_string())
        .collect();
    reasons.sort();
    reasons.dedup();
    let summary = format!(
        "{} ({:.0?}); skipped because: {reasons:?}",
        summary.join("; "),
        started.elapsed()
    );
    Ok(Outcome {
        passed: out.status.success(),
        summary,
        output,
    })
}

/// Runs csi-sanity's `specs` with volumes on `storage` (a pvesim storage of
/// type `kind`). Needs root (loop devices, mounts).
pub async fn run(
    sanity: &Path,
    storage: &str,
    kind: &str,
    specs: Specs,
) -> Result<Outcome, String> {
    let lab = Lab::start(storage, kind).await?;
    let dir = lab.dir().to_path_buf();
    let ctl_sock = lab.controller_socket.clone();
    let target = &lab.target;
    // kubelet's layouts: csi-sanity makes the last directory of each
    // (`globalmount`, and the pod volume's directory holding `target`).
    let root = &target.root;
    let staging_parent = root.join("plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/5b1e0c4f9d2a7e3c8b6a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100");
    let pod_volumes =
        root.join("pods/0b7c3f52-5e2a-4d0c-9a3e-2f1d7c6b5a40/volumes/kubernetes.io~csi");
    for d in [&staging_parent, &pod_volumes] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let params = dir.join("parameters.yaml");
    std::fs::write(&params, format!("storage: {storage}\n")).map_err(|e| e.to_string())?;
    let mutable = dir.join("mutable.yaml");
    std::fs::write(&mutable, "diskIOPS: \"500\"\n").map_err(|e| e.to_string())?;
    let mut cmd = tokio::process::Command::new(sanity);
    cmd.arg(format!(
        "--csi.endpoint=unix://{}",
        dir.join("sockets/csi.sock").display()
    ))
    .arg(format!(
        "--csi.controllerendpoint=unix://{}",
        ctl_sock.display()
    ))
    .arg(format!(
        "--csi.stagingdir={}",
        staging_parent.join("globalmount").display()
    ))
    .arg(format!(
        "--csi.mountdir={}",
        pod_volumes.join("pvc-sanity").display()
    ))
    .arg(format!("--csi.testvolumeparameters={}", params.display()))
    .arg(format!(
        "--csi.testvolumemutableparameters={}",
        mutable.display()
    ))
    .arg("--csi.testvolumesize=1073741824")
    .arg("--csi.testvolumeexpandsize=2147483648")
    .arg("--ginkgo.no-color")
    .arg("--ginkgo.timeout=20m");
    match specs {
        Specs::Controller => {
            cmd.arg("--ginkgo.skip=Node Service");
        }
        // Publishes as many volumes as NodeGetInfo's max_volumes_per_node,
        // then one more, which must fail.
        Specs::All => {
            cmd.arg("--csi.testnodevolumeattachlimit");
        }
    }
    let result = execute(cmd, sanity).await?;
    if !result.passed {
        eprintln!("{}", lab.logs());
    }
    drop(lab);
    settle();
    Ok(result)
}
