use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use proxmox_csi_common::endpoint::SocketAccess;
use proxmox_csi_common::logging::{self, LogFormat};
use proxmox_csi_hostd::device::Resolver;
use proxmox_csi_hostd::discovery::EventSource;
use proxmox_csi_hostd::server::{self, Options};

/// Privileged host daemon of the Proxmox CSI driver. Every setting is also
/// read from the environment as PROXMOX_CSI_HOSTD_<SETTING> (a Talos
/// ExtensionServiceConfig sets environment entries, not arguments); an
/// argument wins over the environment.
#[derive(Debug, Parser)]
#[command(name = "proxmox-csi-hostd", version)]
struct Args {
    /// Unix socket the node plugin connects to.
    #[arg(
        long,
        env = "PROXMOX_CSI_HOSTD_SOCKET",
        default_value = "/run/proxmox-csi-hostd/hostd.sock"
    )]
    socket: PathBuf,
    /// Octal mode of the socket.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_SOCKET_MODE", default_value = "660", value_parser = parse_mode)]
    socket_mode: u32,
    /// Numeric group owning the socket (the node plugin's group).
    #[arg(long, env = "PROXMOX_CSI_HOSTD_SOCKET_GROUP")]
    socket_group: Option<u32>,
    /// Health file rewritten every few seconds, for `talosctl read`.
    #[arg(
        long,
        env = "PROXMOX_CSI_HOSTD_HEALTH_FILE",
        default_value = "/run/proxmox-csi-hostd/health.json"
    )]
    health_file: PathBuf,
    /// Seconds between health file updates.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_HEALTH_INTERVAL", default_value_t = 5)]
    health_interval: u64,
    /// Where SMBIOS identity is read from.
    #[arg(
        long,
        env = "PROXMOX_CSI_HOSTD_DMI_DIR",
        default_value = "/sys/class/dmi/id"
    )]
    dmi_dir: PathBuf,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9810). Also
    /// read from the environment: on Talos an ExtensionServiceConfig sets
    /// environment entries, not arguments.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_METRICS_ADDRESS")]
    metrics_address: Option<std::net::SocketAddr>,
    /// kubelet's root directory; target paths must lie in its CSI directories.
    #[arg(
        long,
        env = "PROXMOX_CSI_HOSTD_KUBELET_ROOT",
        default_value = "/var/lib/kubelet"
    )]
    kubelet_root: PathBuf,
    /// The CSI driver's name, as kubelet names its staging directories.
    #[arg(
        long,
        env = "PROXMOX_CSI_HOSTD_DRIVER_NAME",
        default_value = proxmox_csi_common::contract::DRIVER_NAME
    )]
    driver_name: String,
    /// Where hostd records which volume is staged and published where
    /// (a tmpfs: the records live as long as the mounts). Default: beside
    /// the socket, `<socket dir>/volumes`.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Test builds only: find volumes as loop devices backed by <DIR>/<wwn>.raw.
    #[cfg(feature = "loop-resolver")]
    #[arg(long, env = "PROXMOX_CSI_HOSTD_LOOP_DIR")]
    loop_dir: Option<PathBuf>,
    /// Test builds only: withhold a capability (stage.block, stage.luks2,
    /// expand, stats, …), as a hostd of an older release lacks it.
    #[cfg(feature = "loop-resolver")]
    #[arg(long, value_parser = parse_capability)]
    without: Vec<proxmox_csi_common::hostd_api::Capability>,
    /// Device events from udevd (`udev`), or straight from the kernel
    /// (`kernel`) on hosts without udevd.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_DEVICE_EVENTS", default_value = "udev", value_parser = parse_source)]
    device_events: EventSource,
    /// Seconds Stage waits for a hot-plugged disk to appear.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_DEVICE_WAIT", default_value_t = 60)]
    device_wait: u64,
    /// Key derivation for new LUKS key slots: argon2id, argon2id:<ms>:<KiB>, pbkdf2:<iterations>.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_LUKS_PBKDF", default_value = "argon2id")]
    luks_pbkdf: proxmox_csi_hostd::luks::Pbkdf,
    /// The most a LUKS key slot may cost to open:
    /// <memory KiB>:<threads>:<argon2 iterations>:<pbkdf2 iterations>.
    /// Headers above it are refused before any key is derived.
    #[arg(
        long,
        env = "PROXMOX_CSI_HOSTD_LUKS_KDF_BOUNDS",
        default_value = "1048576:4:64:16000000"
    )]
    luks_kdf_bounds: proxmox_csi_hostd::luks::KdfBounds,
    /// Take over disks the Go driver attached, which carry no serial tying
    /// them to a volume, and its unencrypted raw block volumes of encrypted
    /// classes. For the switch from the Go driver only (docs/migrating.md);
    /// see docs/security.md, "What stays".
    #[arg(long, env = "PROXMOX_CSI_HOSTD_GO_TAKEOVER")]
    go_takeover: bool,
    /// Directories the node plugin creates its CSI socket in (kubelet's
    /// `plugins/<driver>`): made and given --socket-group, mode 0770.
    /// Default with --socket-group: `<kubelet root>/plugins/<driver name>`.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_PLUGIN_DIR", value_delimiter = ',')]
    plugin_dir: Vec<PathBuf>,
    /// Caller uids allowed besides root (the node plugin's), comma-separated.
    /// Default: the node plugin image's uid.
    #[arg(
        long,
        env = "PROXMOX_CSI_HOSTD_ALLOW_UID",
        value_delimiter = ',',
        default_value = "65532"
    )]
    allow_uid: Vec<u32>,
    /// Caller gids allowed, comma-separated.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_ALLOW_GID", value_delimiter = ',')]
    allow_gid: Vec<u32>,
    /// Log format: text or json.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Log level or filter (overrides RUST_LOG), e.g. debug.
    #[arg(long, env = "PROXMOX_CSI_HOSTD_LOG_LEVEL")]
    log_level: Option<String>,
}

#[cfg(feature = "loop-resolver")]
fn parse_capability(s: &str) -> Result<proxmox_csi_common::hostd_api::Capability, String> {
    proxmox_csi_common::hostd_api::Capability::parse(s)
        .ok_or_else(|| format!("no capability {s:?}"))
}

fn parse_source(s: &str) -> Result<EventSource, String> {
    match s {
        "udev" => Ok(EventSource::Udev),
        "kernel" => Ok(EventSource::Kernel),
        other => Err(format!("{other:?} is not one of: udev, kernel")),
    }
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("socket mode {s:?} is not an octal mode such as 660"))
}

#[cfg(feature = "loop-resolver")]
fn resolver(args: &Args) -> Resolver {
    match &args.loop_dir {
        Some(dir) => Resolver::Loop { dir: dir.clone() },
        None => Resolver::default(),
    }
}

#[cfg(not(feature = "loop-resolver"))]
fn resolver(_: &Args) -> Resolver {
    Resolver::default()
}

fn main() -> ExitCode {
    // libdevmapper creates /dev/mapper nodes itself instead of waiting on a
    // udev cookie: a cookie that is never completed (a hostd killed in the
    // middle of an activation, udev rules missing in the rootfs) would
    // otherwise hang every later dm-crypt call on that volume. Set before
    // any thread starts.
    if std::env::var_os("DM_DISABLE_UDEV").is_none() {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("DM_DISABLE_UDEV", "1") };
    }
    if let Err(e) = proxmox_csi_hostd::hardening::harden() {
        eprintln!("proxmox-csi-hostd: disabling core dumps: {e}");
        return ExitCode::FAILURE;
    }
    // hostd's own child for one key derivation (see `kdf`).
    if std::env::args_os().nth(1).as_deref() == Some(proxmox_csi_hostd::kdf::CHILD_ARG.as_ref()) {
        return proxmox_csi_hostd::kdf::child_main();
    }
    // Blocking threads: one per call in flight, and a few for the device
    // wait's rescans and the health file; never tokio's default 512.
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(proxmox_csi_hostd::service::MAX_CALLS_IN_FLIGHT + 8)
        .build()
    {
        Ok(rt) => rt.block_on(run()),
        Err(e) => {
            eprintln!("proxmox-csi-hostd: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let mut args = Args::parse();
    if args.plugin_dir.is_empty() && args.socket_group.is_some() {
        args.plugin_dir = vec![args.kubelet_root.join("plugins").join(&args.driver_name)];
    }
    if let Err(e) = logging::init(args.log_format, args.log_level.as_deref()) {
        eprintln!("proxmox-csi-hostd: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(gid) = args.socket_group {
        // The node plugin runs in that group, without capabilities: it must
        // reach hostd's socket and create its own under kubelet's plugins.
        let socket_dir = args.socket.parent().map(|d| (d.to_path_buf(), 0o750));
        for (dir, mode) in socket_dir
            .into_iter()
            .chain(args.plugin_dir.iter().map(|d| (d.clone(), 0o770)))
        {
            if let Err(e) = proxmox_csi_hostd::share::share_dir(&dir, gid, mode) {
                tracing::error!(error = e.message(), "hostd cannot start");
                return ExitCode::FAILURE;
            }
        }
    } else if !args.plugin_dir.is_empty() {
        tracing::error!("--plugin-dir needs --socket-group (the node plugin's group)");
        return ExitCode::FAILURE;
    }
    let resolver = resolver(&args);
    let opts = Options {
        socket: args.socket.clone(),
        socket_access: SocketAccess {
            mode: args.socket_mode,
            group: args.socket_group,
        },
        health_file: Some(args.health_file),
        health_interval: Duration::from_secs(args.health_interval.max(1)),
        dmi_dir: args.dmi_dir,
        metrics_address: args.metrics_address,
        kubelet_root: args.kubelet_root,
        state_dir: args.state_dir.unwrap_or_else(|| {
            args.socket
                .parent()
                .unwrap_or(std::path::Path::new("/run/proxmox-csi-hostd"))
                .join("volumes")
        }),
        driver_name: args.driver_name,
        resolver,
        event_source: args.device_events,
        device_wait: Duration::from_secs(args.device_wait),
        pbkdf: args.luks_pbkdf,
        kdf_bounds: args.luks_kdf_bounds,
        go_takeover: args.go_takeover,
        peers: proxmox_csi_hostd::peer::PeerPolicy {
            uids: args.allow_uid,
            gids: args.allow_gid,
        },
        #[cfg(feature = "loop-resolver")]
        without: args.without,
        #[cfg(not(feature = "loop-resolver"))]
        without: Vec::new(),
    };
    match server::run(opts, proxmox_csi_common::shutdown::signal_received()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = e.message(), "hostd failed");
            ExitCode::FAILURE
        }
    }
}
