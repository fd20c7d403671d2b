use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use proxmox_csi_common::Endpoint;
use proxmox_csi_common::logging::{self, LogFormat};
use proxmox_csi_node::server::{self, Options};

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
    #[arg(long, default_value = "csi.proxmox.sinextra.dev")]
    driver_name: String,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:8081).
    #[arg(long)]
    metrics_address: Option<SocketAddr>,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    log_format: LogFormat,
    /// Log level or filter (overrides RUST_LOG), e.g. debug.
    #[arg(long)]
    log_level: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = logging::init(args.log_format, args.log_level.as_deref()) {
        eprintln!("proxmox-csi-node: {e}");
        return ExitCode::FAILURE;
    }
    let opts = Options {
        driver_name: args.driver_name,
        csi_address: args.csi_address,
        hostd_socket: args.hostd_socket,
        metrics_address: args.metrics_address,
    };
    match server::run(opts, proxmox_csi_common::shutdown::signal_received()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "node plugin failed");
            ExitCode::FAILURE
        }
    }
}
