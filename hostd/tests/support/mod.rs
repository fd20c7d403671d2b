//! hostd's tests' harness: hostd run as its binary against real loop
//! devices, mkfs and mount (needs root; CI is root). hostd runs with
//! `--loop-dir`, so a volume's "WWN" names the loop device backed by
//! `<dir>/<wwn>.raw`.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proxmox_csi_proto::hostd::v1 as pb;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use sha2::{Digest, Sha256};
use testkit::process::Proc;
use tonic::transport::Channel;

pub const DRIVER: &str = "csi.proxmox.sinextra.dev";
/// The uid hostd allows besides root: the node plugin's.
pub const NODE_PLUGIN_UID: u32 = 65534;

pub use testkit::loopdev::Loop;

pub struct Env {
    pub _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub images: PathBuf,
    pub hostd: Proc,
    /// A client connected as root.
    pub client: HostdClient<Channel>,
    pub log: PathBuf,
    pub loops: Vec<Loop>,
    pub pbkdf: &'static str,
}

impl Drop for Env {
    fn drop(&mut self) {
        // Leave no mounts behind under the temporary kubelet root.
        testkit::loopdev::unmount_under(&self.root);
        self.loops.clear();
    }
}

/// kubelet's record of a volume beside a pod's target or under a block
/// volume's `data` directory, with kubelet's keys (pkg/volume/csi
/// csi_plugin.go `volDataKey`, written by `saveVolumeData`).
pub fn write_vol_data(dir: &Path, pv: &str, handle: &str, driver: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let data = serde_json::json!({
        "specVolID": pv,
        "volumeHandle": handle,
        "driverName": driver,
        "nodeName": "worker-1",
        "attachmentID": "csi-0123",
        "volumeLifecycleMode": "Persistent",
    });
    std::fs::write(dir.join("vol_data.json"), data.to_string()).unwrap();
}

pub fn hostd_command(dir: &Path, root: &Path, images: &Path, pbkdf: &str) -> Command {
    let socket = dir.join("hostd.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_proxmox-csi-hostd"));
    cmd.arg("--socket")
        .arg(&socket)
        .arg("--kubelet-root")
        .arg(root)
        .arg("--loop-dir")
        .arg(images)
        .arg("--health-file")
        .arg(dir.join("health.json"))
        // This host runs no udevd: take device events from the kernel.
        .args([
            "--device-events",
            "kernel",
            "--device-wait",
            "5",
            "--driver-name",
            DRIVER,
        ])
        .args(["--luks-pbkdf", pbkdf])
        // The node plugin's uid, as the DaemonSet and the extension run it.
        .args([
            "--socket-mode",
            "666",
            "--allow-uid",
            &NODE_PLUGIN_UID.to_string(),
        ]);
    cmd
}

/// A client whose connection is made as `uid`, as the node plugin's is:
/// hostd checks the credentials the kernel recorded at connect
/// (SO_PEERCRED), which are the connecting thread's. A thread of its own
/// takes that effective uid by the raw system call, which (unlike libc's
/// wrapper) changes that thread alone, and ends after connecting.
pub async fn connect_as(socket: &Path, uid: u32) -> HostdClient<Channel> {
    let socket = socket.to_path_buf();
    let stream = std::thread::spawn(move || {
        // SAFETY: setresuid(2) with -1 keeps the real and saved uids; only this thread changes.
        let rc =
            unsafe { nix::libc::syscall(nix::libc::SYS_setresuid, -1i64, i64::from(uid), -1i64) };
        assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
        std::os::unix::net::UnixStream::connect(&socket)
    })
    .join()
    .unwrap()
    .unwrap();
    stream.set_nonblocking(true).unwrap();
    let slot = std::sync::Mutex::new(Some(stream));
    let ch = tonic::transport::Endpoint::from_static("http://unix.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let s = slot.lock().unwrap().take();
            async move {
                let s = s.ok_or_else(|| {
                    std::io::Error::other("the connection made as another uid is used up")
                })?;
                tokio::net::UnixStream::from_std(s).map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .unwrap();
    HostdClient::new(ch)
}

pub async fn connect(socket: PathBuf) -> HostdClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(ch) = proxmox_csi_common::client::unix_channel(socket.clone()).await {
            return HostdClient::new(ch);
        }
        assert!(Instant::now() < deadline, "hostd socket never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Env {
    /// hostd with a fast key derivation (pbkdf2, 1000 iterations).
    pub async fn start() -> Self {
        Self::start_with_pbkdf("pbkdf2:1000").await
    }

    pub async fn start_with_pbkdf(pbkdf: &'static str) -> Self {
        Self::start_with_args(pbkdf, &[]).await
    }

    /// hostd with `extra` arguments besides the usual ones.
    pub async fn start_with_args(pbkdf: &'static str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        let images = dir.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::create_dir_all(root.join("plugins/kubernetes.io/csi").join(DRIVER)).unwrap();
        let log = dir.path().join("hostd.log");
        let mut cmd = hostd_command(dir.path(), &root, &images, pbkdf);
        cmd.args(extra);
        let hostd = Proc::start("hostd", cmd, &log).unwrap();
        let client = connect(dir.path().join("hostd.sock")).await;
        Self {
            root: root.canonicalize().unwrap(),
            images,
            hostd,
            client,
            log,
            _dir: dir,
            loops: Vec::new(),
            pbkdf,
        }
    }

    /// A 320 MiB sparse image (mkfs.xfs needs 300 MB) attached as a loop device; returns its WWN.
    pub fn disk(&mut self, n: u32) -> String {
        let wwn = self.image_only(n);
        self.attach(&wwn);
        wwn
    }

    /// A sparse image of `size` bytes attached as a loop device; returns its WWN.
    pub fn disk_sized(&mut self, n: u32, size: u64) -> String {
        let wwn = self.image_sized(n, size);
        self.attach(&wwn);
        wwn
    }

    /// Creates the image without attaching it.
    pub fn image_only(&self, n: u32) -> String {
        self.image_sized(n, 320 << 20)
    }

    pub fn image_sized(&self, n: u32, size: u64) -> String {
        let wwn = format!("5000c500{n:08x}");
        let img = self.images.join(format!("{wwn}.raw"));
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(size).unwrap();
        wwn
    }

    pub fn attach(&mut self, wwn: &str) {
        self.loops.push(Loop::attach(&self.image(wwn)).unwrap());
    }

    /// SIGKILLs hostd and starts a new one on the same socket.
    pub async fn restart_hostd(&mut self) {
        self.restart_hostd_with_tools(None).await;
    }

    /// SIGKILLs hostd and starts a new one whose tools (mkfs, …) are
    /// looked up first in `tools`, when given.
    pub async fn restart_hostd_with_tools(&mut self, tools: Option<&Path>) {
        self.hostd.kill();
        let dir = self._dir.path().to_path_buf();
        let mut cmd = hostd_command(&dir, &self.root, &self.images, self.pbkdf);
        if let Some(t) = tools {
            cmd.env(
                "PATH",
                format!(
                    "{}:{}",
                    t.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            );
        }
        self.hostd = Proc::start("hostd", cmd, &self.log).unwrap();
        self.client = connect(dir.join("hostd.sock")).await;
    }

    /// Restarts hostd with an `mkfs.ext4` of its own first on its PATH: a
    /// shell script whose body `script` writes from the real mkfs.ext4's
    /// path. The directory holding it is kept while the answer lives.
    pub async fn restart_hostd_with_mkfs_ext4(
        &mut self,
        script: impl FnOnce(&str) -> String,
    ) -> tempfile::TempDir {
        let tools = tempfile::tempdir().unwrap();
        let real = String::from_utf8(
            Command::new("sh")
                .args(["-c", "command -v mkfs.ext4"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let path = tools.path().join("mkfs.ext4");
        std::fs::write(&path, script(real.trim())).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        self.restart_hostd_with_tools(Some(tools.path())).await;
        tools
    }

    /// A client connected as the node plugin's uid.
    pub async fn node_plugin(&self) -> HostdClient<Channel> {
        connect_as(&self._dir.path().join("hostd.sock"), NODE_PLUGIN_UID).await
    }

    pub fn image(&self, wwn: &str) -> PathBuf {
        self.images.join(format!("{wwn}.raw"))
    }

    /// kubelet's staging path of a volume: `<driver>/<sha256(volume id)>/globalmount`.
    pub fn staging(&self, vol: &str) -> PathBuf {
        let p = self
            .root
            .join("plugins/kubernetes.io/csi")
            .join(DRIVER)
            .join(format!("{:x}", Sha256::digest(vol.as_bytes())));
        std::fs::create_dir_all(&p).unwrap();
        p.join("globalmount")
    }

    /// kubelet's raw block staging directory (csi_block.go `GetStagingPath`).
    pub fn block_staging(&self, pv: &str) -> PathBuf {
        let p = self
            .root
            .join("plugins/kubernetes.io/csi/volumeDevices/staging")
            .join(pv);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// kubelet's raw block publish path (csi_block.go `getPublishPath`):
    /// kubelet makes the directory, the driver the file.
    pub fn block_target(&self, pv: &str, pod: &str) -> PathBuf {
        let p = self
            .root
            .join("plugins/kubernetes.io/csi/volumeDevices/publish")
            .join(pv);
        std::fs::create_dir_all(&p).unwrap();
        p.join(pod)
    }

    pub fn target(&self, pod: &str, kind: &str, pv: &str) -> PathBuf {
        // kubelet makes the volume's directory; the driver makes `mount` in it.
        let p = self
            .root
            .join("pods")
            .join(pod)
            .join(kind)
            .join("kubernetes.io~csi")
            .join(pv);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

pub fn stage_req(vol: &str, wwn: &str, staging: &Path, fs: &str) -> pb::StageRequest {
    pb::StageRequest {
        volume_id: vol.into(),
        device: Some(pb::Device {
            wwn: format!("0x{wwn}"),
            serial: String::new(),
        }),
        staging_path: staging.display().to_string(),
        access: Some(pb::stage_request::Access::Filesystem(pb::Filesystem {
            fs_type: fs.into(),
            block_size: 0,
            inode_size: 0,
            mount_flags: vec![],
        })),
        encryption: None,
        read_only: false,
    }
}

pub fn mount_at(p: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (Path::new(f[4]) == p).then(|| f[sep + 1].to_string())
    })
}

pub fn sha_of(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 4 << 20];
    f.read_exact(&mut buf).unwrap();
    format!("{:x}", Sha256::digest(&buf))
}

pub fn run(tool: &str, args: &[&str], img: &Path) {
    let st = Command::new(tool).args(args).arg(img).output().unwrap();
    assert!(
        st.status.success(),
        "{tool}: {}",
        String::from_utf8_lossy(&st.stderr)
    );
}

pub fn sfdisk(img: &Path, script: &str) {
    let mut c = Command::new("sfdisk")
        .arg("-q")
        .arg(img)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success());
}

pub fn luks(img: &Path) {
    let mut c = Command::new("cryptsetup")
        .args([
            "luksFormat",
            "--batch-mode",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            "-",
        ])
        .arg(img)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"passphrase").unwrap();
    assert!(c.wait().unwrap().success(), "cryptsetup luksFormat");
}

pub fn libc_erofs() -> i32 {
    nix::errno::Errno::EROFS as i32
}

/// Grows an image and tells its loop device, as a Proxmox resize looks to the guest.
pub fn grow(img: &Path, dev_of: &Path, new_len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .unwrap()
        .set_len(new_len)
        .unwrap();
    // What a Proxmox resize looks like to the guest: the disk's capacity changes.
    let st = Command::new("losetup")
        .arg("-c")
        .arg(dev_of)
        .status()
        .unwrap();
    assert!(st.success());
}

/// The loop device an image is attached as.
pub fn loop_of(img: &Path) -> PathBuf {
    let out = Command::new("losetup")
        .args(["-j"])
        .arg(img)
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    PathBuf::from(line.split(':').next().unwrap().trim())
}

/// ext4 grows online only with CAP_SYS_RESOURCE, which some sandboxes
/// withhold even from root.
pub fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    eff & (1 << 24) != 0
}
