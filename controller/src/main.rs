use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use proxmox_csi_common::Endpoint;
use proxmox_csi_common::goflags;
use proxmox_csi_common::logging::{self, LogFormat};
use proxmox_csi_controller::server::{self, Options};
use proxmox_csi_controller::volume::ClusterId;

/// CSI controller for Proxmox VE.
#[derive(Debug, Parser)]
#[command(name = "proxmox-csi-controller", version)]
struct Args {
    /// CSI endpoint: unix:///path.sock or tcp://host:port.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    csi_address: Endpoint,
    /// Cloud config file (clusters and credentials).
    #[arg(long, env = "PROXMOX_CSI_CLOUD_CONFIG")]
    cloud_config: PathBuf,
    /// CSI driver name.
    #[arg(long, default_value = proxmox_csi_common::contract::DRIVER_NAME)]
    driver_name: String,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:8080, or
    /// :8080 as the Go driver's chart writes it).
    #[arg(long, value_parser = goflags::listen_addr)]
    metrics_address: Option<SocketAddr>,
    /// Timeout of one Proxmox API call, in seconds.
    #[arg(long, default_value_t = 30)]
    api_timeout: u64,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    log_format: LogFormat,
    /// Log level or filter (overrides RUST_LOG), e.g. debug.
    #[arg(long)]
    log_level: Option<String>,
    /// Written into the names of new disks so that `pvecsictl clean` can tell
    /// this cluster's disks from another's on a shared Proxmox cluster
    /// (1-16 of [a-z0-9]). Default: from the kube-system namespace's UID.
    #[arg(long, env = "PROXMOX_CSI_CLUSTER_ID", value_parser = ClusterId::parse)]
    cluster_id: Option<ClusterId>,
    /// How often each Proxmox cluster's `GET /version` is asked, in
    /// seconds (metric `proxmox_cluster_up`, and the log when it changes).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    cluster_check_interval: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let (args, go) = match goflags::parse_args::<Args>() {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("proxmox-csi-controller: {e}");
            return ExitCode::FAILURE;
        }
    };
    let level = args.log_level.as_deref().or(go.log_level());
    if let Err(e) = logging::init(args.log_format, level) {
        eprintln!("proxmox-csi-controller: {e}");
        return ExitCode::FAILURE;
    }
    go.warn_ignored();
    let opts = Options {
        driver_name: args.driver_name,
        csi_address: args.csi_address,
        cloud_config: args.cloud_config,
        metrics_address: args.metrics_address,
        api_timeout: Duration::from_secs(args.api_timeout),
        cluster_id: args.cluster_id,
        cluster_check_interval: Duration::from_secs(args.cluster_check_interval),
        kubeconfig: go.kubeconfig,
    };
    match server::run(opts, proxmox_csi_common::shutdown::signal_received()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "controller failed");
            ExitCode::FAILURE
        }
    }
}
