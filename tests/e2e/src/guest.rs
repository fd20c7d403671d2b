//! Booting the guest and talking to it: a shell on the serial console, the
//! node plugin's CSI endpoint through a forwarded port, QMP for pvesim.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Where the guest kernel and initramfs are cached between runs.
pub fn image_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e-guest")
}

/// The driver's binaries, shared with the guest over 9p: `E2E_BIN_DIR`
/// when set (`make test` sets the images' release build:
/// the binaries that ship), else the debug build's.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("E2E_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug"))
}

/// Shared with every guest over 9p at /ext; [`assemble_extension`] puts the
/// Talos extension's tree in it, at /ext/tree in the guest.
pub fn extension_dir() -> PathBuf {
    image_dir().join("extension")
}

/// Assembles the Talos extension's tree (talos-extension/assemble.sh, with
/// `bin_dir`'s hostd and the images' environment) once per run, aside and
/// then moved into place, so that a test can run hostd from the service
/// root Talos would run. Only the tests that need it pay for it.
pub fn assemble_extension() -> Result<()> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let staging = extension_dir().join("tree.new");
        let _ = std::fs::remove_dir_all(&staging);
        let out = Command::new("bash")
            .arg(repo.join("talos-extension/assemble.sh"))
            .arg(&staging)
            .arg(bin_dir().join("proxmox-csi-hostd"))
            .output()
            .map_err(|e| format!("running assemble.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "assemble.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let _ = std::fs::remove_dir_all(extension_dir().join("tree"));
        std::fs::rename(&staging, extension_dir().join("tree")).map_err(|e| e.to_string())
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// What the image is built from; a change rebuilds it.
fn recipe() -> String {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest");
    ["build-guest.sh", "init"]
        .iter()
        .map(|f| std::fs::read_to_string(here.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\0")
}

/// One image build at a time: the tests of a run share the image.
static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// At most two guests at once: they run under software emulation on a
/// small machine, and each needs a core to keep the tests' timeouts honest.
static GUESTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Builds the guest image unless an image of the same recipe is there.
pub fn build_image() -> Result<PathBuf> {
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let dir = image_dir();
    std::fs::create_dir_all(extension_dir())?;
    let stamp = dir.join("recipe");
    let current = recipe();
    if dir.join("vmlinuz").exists()
        && dir.join("initramfs.cpio.gz").exists()
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s == current)
    {
        return Ok(dir);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/build-guest.sh");
    let libs = ["proxmox-csi-hostd", "proxmox-csi-node"]
        .map(|b| bin_dir().join(b).display().to_string())
        .join(" ");
    // Built aside and moved into place, so a reader never sees half an image.
    std::fs::create_dir_all(&dir)?;
    let staging = tempfile::tempdir_in(&dir)?;
    let out = Command::new("bash")
        .arg(&script)
        .arg(staging.path())
        .env("GUEST_LIBS_FOR", libs)
        .output()
        .context("running build-guest.sh")?;
    if !out.status.success() {
        bail!(
            "build-guest.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for f in ["vmlinuz", "initramfs.cpio.gz"] {
        std::fs::rename(staging.path().join(f), dir.join(f))?;
    }
    std::fs::write(&stamp, current)?;
    Ok(dir)
}

#[derive(Debug)]
pub struct Guest {
    qemu: Child,
    console: UnixStream,
    /// Console bytes read but not consumed yet.
    pending: Vec<u8>,
    pub qmp: PathBuf,
    pub csi_port: u16,
    pub boot_time: Duration,
    _dir: tempfile::TempDir,
    _slot: Option<tokio::sync::SemaphorePermit<'static>>,
}

/// Which share of the machine a guest takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Next to at most one other guest.
    Shared,
    /// Alone: for tests whose timing matters (killing a process mid-way).
    Alone,
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Guest {
    /// Boots the guest (TCG) and waits for its shell.
    pub async fn boot() -> Result<Self> {
        Self::boot_with(Share::Shared).await
    }

    pub async fn boot_with(share: Share) -> Result<Self> {
        for b in ["proxmox-csi-hostd", "proxmox-csi-node"] {
            if !bin_dir().join(b).exists() {
                bail!("{b} is not built: run `cargo build --workspace --bins` first");
            }
        }
        let slot = match share {
            Share::Shared => GUESTS.acquire().await?,
            Share::Alone => GUESTS.acquire_many(2).await?,
        };
        let image = tokio::task::spawn_blocking(build_image).await??;
        // The forwarded port is picked free and then bound by QEMU; another
        // guest starting at the same moment can take it first, and QEMU then
        // exits at once. Such a start is tried again on another port.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start(&image).await {
                Ok((mut g, started)) => match g
                    .read_until("E2E-GUEST-READY", Duration::from_secs(120))
                    .await
                {
                    Ok(_) => {
                        g.boot_time = started.elapsed();
                        g._slot = Some(slot);
                        g.sh("export PS1=''; stty -echo; true").await?;
                        return Ok(g);
                    }
                    Err(e) if attempt < 3 && g.qemu_said().contains("hostfwd") => {
                        eprintln!(
                            "guest start {attempt} failed ({e}); QEMU said: {}",
                            g.qemu_said()
                        );
                    }
                    Err(e) => return Err(e.context(format!("QEMU said: {}", g.qemu_said()))),
                },
                Err(e) => return Err(e),
            }
        }
    }

    /// QEMU started with the guest image, its console connected.
    async fn start(image: &Path) -> Result<(Self, Instant)> {
        let dir = tempfile::tempdir()?;
        let console = dir.path().join("console.sock");
        let qmp = dir.path().join("qmp.sock");
        let csi_port = free_port()?;
        let started = Instant::now();
        let qemu = Command::new("qemu-system-x86_64")
            .args([
                "-machine",
                "q35",
                // One host thread runs both vCPUs: with a thread per vCPU
                // (MTTCG), a vCPU's MMIO access can race the other's PCI BAR
                // programming at boot and QEMU aborts in iotlb_to_section
                // ("section_index < d->map.sections_nb", QEMU issue 1921,
                // seen with QEMU 10.0 from bookworm-backports).
                "-accel",
                "tcg,thread=single",
                "-m",
                "1024",
                "-smp",
                "2",
                "-display",
                "none",
                "-no-reboot",
            ])
            .arg("-kernel")
            .arg(image.join("vmlinuz"))
            .arg("-initrd")
            .arg(image.join("initramfs.cpio.gz"))
            .args([
                "-append",
                "console=ttyS0 loglevel=4 panic=-1 nokaslr mitigations=off",
            ])
            .arg("-serial")
            .arg(format!("unix:{},server=on,wait=off", console.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .args(["-device", "virtio-scsi-pci,id=scsihw0"])
            .args([
                "-netdev",
                &format!("user,id=n0,hostfwd=tcp:127.0.0.1:{csi_port}-:10000"),
                "-device",
                "virtio-net-pci,netdev=n0",
            ])
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=host,security_model=none,readonly=on",
                bin_dir().display()
            ))
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=ext,security_model=none,readonly=on",
                extension_dir().display()
            ))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("qemu.err"))?)
            .spawn()
            .context("starting qemu-system-x86_64")?;
        // QEMU binds the socket (the file appears) before it listens: a
        // connect in between is refused, more often on a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(20);
        let console = loop {
            match UnixStream::connect(&console).await {
                Ok(c) => break c,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(anyhow::Error::new(e).context("QEMU's console socket")),
            }
        };
        let g = Self {
            qemu,
            console,
            pending: Vec::new(),
            qmp,
            csi_port,
            boot_time: Duration::ZERO,
            _dir: dir,
            _slot: None,
        };
        Ok((g, started))
    }

    /// What QEMU wrote to its standard error.
    fn qemu_said(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("qemu.err"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Reads the console up to `marker`; returns what came before it and
    /// keeps what came after for the next read.
    async fn read_until(&mut self, marker: &str, limit: Duration) -> Result<String> {
        let mut buf = [0u8; 4096];
        let deadline = Instant::now() + limit;
        loop {
            let text = String::from_utf8_lossy(&self.pending).into_owned();
            if let Some(pos) = text.find(marker) {
                let before = text[..pos].to_string();
                self.pending = text.as_bytes()[pos + marker.len()..].to_vec();
                return Ok(before);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("guest console: no {marker:?} within {limit:?}; got:\n{text}");
            }
            let n = match tokio::time::timeout(left, self.console.read(&mut buf)).await {
                Err(_) => 0,
                // The console closes when the guest stops (panic=-1 with -no-reboot): say what it printed last.
                Ok(Ok(0)) | Ok(Err(_)) => {
                    let tail: String = text
                        .chars()
                        .rev()
                        .take(3000)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    bail!(
                        "guest console closed while waiting for {marker:?} (the guest stopped: kernel panic or QEMU exit); last output:\n{tail}"
                    );
                }
                Ok(Ok(n)) => n,
            };
            self.pending.extend_from_slice(&buf[..n]);
        }
    }

    /// Runs a shell command in the guest; returns its output, failing on a
    /// non-zero exit.
    pub async fn sh(&mut self, cmd: &str) -> Result<String> {
        let (code, out) = self.sh_status(cmd).await?;
        if code != 0 {
            bail!("guest command {cmd:?} exited {code}:\n{out}");
        }
        Ok(out)
    }

    pub async fn sh_status(&mut self, cmd: &str) -> Result<(i32, String)> {
        // The marker is split in the command so that an echo of it does not match.
        let line = format!("{cmd}; echo \"@@R\"\"C=$?@@\"\n");
        self.console.write_all(line.as_bytes()).await?;
        let out = self.read_until("@@RC=", Duration::from_secs(120)).await?;
        let rest = self.read_until("@@", Duration::from_secs(5)).await?;
        let code: i32 = rest.trim().parse().unwrap_or(-1);
        // Drop the echoed command line, if the tty echoed it.
        let out = out
            .lines()
            .filter(|l| !l.contains("@@R\"\"C"))
            .map(|l| l.trim_start_matches("/ # "))
            .collect::<Vec<_>>()
            .join("\n");
        Ok((code, out.trim().to_string()))
    }
}

/// Whether QEMU is installed; a test without it is skipped, except under CI.
pub fn qemu_present() -> bool {
    testkit::skip::qemu()
}

/// The CSI token's secret in the guests' simulated clusters.
pub use testkit::sim::SECRET;

/// pvesim's cluster for one guest: VM 112 (worker-2 on pve2) bound to the
/// guest's QMP socket, local-lvm, and the CSI token with `role`'s privileges.
pub fn guest_cluster(qmp: &Path, role: &str) -> String {
    guest_cluster_of(&[(112, "worker-2", qmp)], role)
}

/// The same for several guests, each a VM on pve2: `(vmid, name, QMP socket)`.
pub fn guest_cluster_of(vms: &[(u32, &str, &Path)], role: &str) -> String {
    let vms: String = vms
        .iter()
        .map(|(vmid, name, qmp)| {
            format!(
                "  - {{ vmid: {vmid}, node: pve2, name: {name}, qmp: \"{}\", config: {{ scsihw: virtio-scsi-pci }} }}\n",
                qmp.display()
            )
        })
        .collect();
    format!(
        r#"
nodes: [{{ name: pve2 }}]
storages: [{{ id: local-lvm, type: lvmthin, total: 107374182400 }}]
vms:
{vms}users:
  - {{ userid: kubernetes-csi@pve, tokens: [{{ name: csi, secret: {SECRET} }}] }}
roles:
  CSI: [{role}]
acl:
  - {{ path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }}
"#
    )
}
