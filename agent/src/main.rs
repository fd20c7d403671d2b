use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use proxmox_csi_common::Endpoint;
use proxmox_csi_common::goflags;
use proxmox_csi_common::logging::{self, LogFormat};
use proxmox_csi_node::server::{self, Options};
use proxmox_csi_node::topology::Topology;

/// Unprivileged CSI node plugin for Proxmox VE.
#[derive(Debug, Parser)]
#[command(name = "proxmox-csi-node", version)]
struct Args {
    /// CSI endpoint: unix:///path.sock or tcp://host:port.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    csi_address: Endpoint,
    /// hostd's unix socket.
    #[arg(long, default_value = "/run/proxmox-csi-hostd/hostd.sock")]
    hostd_socket: PathBuf,
    /// CSI driver name.
    #[arg(long, default_value = proxmox_csi_common::contract::DRIVER_NAME)]
    driver_name: String,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:8081, or :8081).
    #[arg(long, value_parser = goflags::listen_addr)]
    metrics_address: Option<SocketAddr>,
    /// Kubernetes node name (node id without the VM id).
    #[arg(long, env = "NODE_NAME")]
    node_id: String,
    /// Proxmox VM id of this node; read from SMBIOS (serial `i=<vmid>`) when absent.
    #[arg(long)]
    vmid: Option<u32>,
    /// kubelet's root directory.
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_root: PathBuf,
    /// Volumes per node when the Node has no csi.proxmox.sinextra.dev/max-volume-attachments label.
    #[arg(long, default_value_t = proxmox_csi_common::DEFAULT_MAX_VOLUMES, value_parser = clap::value_parser!(i64).range(1..=proxmox_csi_common::SCSI_SLOTS))]
    max_volumes: i64,
    /// Region, instead of reading the Node's labels (with --zone, or
    /// alone for a node that reaches shared storage only).
    #[arg(long)]
    region: Option<String>,
    /// Zone (Proxmox node), instead of reading the Node's labels (needs --region).
    #[arg(long, requires = "region")]
    zone: Option<String>,
    /// Seconds a hostd call may take (waiting for the disk, mkfs).
    #[arg(long, default_value_t = 150)]
    hostd_timeout: u64,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    log_format: LogFormat,
    /// Log level or filter (overrides RUST_LOG), e.g. debug.
    #[arg(long)]
    log_level: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let (args, go) = match goflags::parse_args::<Args>() {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("proxmox-csi-node: {e}");
            return ExitCode::FAILURE;
        }
    };
    let level = args.log_level.as_deref().or(go.log_level());
    if let Err(e) = logging::init(args.log_format, level) {
        eprintln!("proxmox-csi-node: {e}");
        return ExitCode::FAILURE;
    }
    go.warn_ignored();
    // The node name is the part before a '/vmid', as the Go driver accepts it.
    let node = match proxmox_csi_common::NodeId::parse(&args.node_id) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("proxmox-csi-node: --node-id: {e}");
            return ExitCode::FAILURE;
        }
    };
    let fixed_topology = args.region.map(|region| Topology {
        region,
        zone: args.zone,
        max_volumes: None,
    });
    let opts = Options {
        driver_name: args.driver_name,
        csi_address: args.csi_address,
        hostd_socket: args.hostd_socket,
        metrics_address: args.metrics_address,
        node_name: node.name,
        vmid: args.vmid.or(node.vmid),
        kubelet_root: args.kubelet_root,
        max_volumes: args.max_volumes,
        fixed_topology,
        hostd_timeout: Duration::from_secs(args.hostd_timeout),
        kubeconfig: go.kubeconfig,
    };
    match server::run(opts, proxmox_csi_common::shutdown::signal_received()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "node plugin failed");
            ExitCode::FAILURE
        }
    }
}
