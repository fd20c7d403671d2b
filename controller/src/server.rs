//! Wiring: config → Proxmox clients → gRPC services → listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proxmox_csi_common::endpoint::SocketAccess;
use proxmox_csi_common::metrics::{self, Metrics};
use proxmox_csi_common::{Endpoint, EndpointError};
use proxmox_csi_proto::csi::v1::controller_server::ControllerServer;
use proxmox_csi_proto::csi::v1::identity_server::IdentityServer;
use tokio::sync::watch;

use crate::config::{CloudConfig, ConfigError};
use crate::csi::controller::ControllerService;
use crate::csi::identity::{ClusterHealth, Identity};
use crate::ctl::Controller;
use crate::pve;
use crate::volume::ClusterId;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Proxmox(#[from] pve::PveError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct Options {
    pub driver_name: String,
    pub csi_address: Endpoint,
    pub cloud_config: PathBuf,
    pub metrics_address: Option<SocketAddr>,
    pub api_timeout: Duration,
    /// Set by the operator; else read from the cluster (`kube::cluster_id`).
    pub cluster_id: Option<ClusterId>,
    /// How often each Proxmox cluster's health is checked.
    pub cluster_check_interval: Duration,
    /// A kubeconfig instead of the in-cluster configuration (Go's `--kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    opts: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let config = CloudConfig::load(&opts.cloud_config)?;
    for key in &config.ignored_keys {
        tracing::warn!(key = %key, "cloud config: key not recognised, ignored");
    }
    for warning in config.warnings() {
        tracing::warn!("cloud config: {warning}");
    }
    let api_metrics = pve::metrics::ApiMetrics::default();
    let mut controller = Controller::from_config(
        &config,
        opts.api_timeout,
        api_metrics.clone(),
        Duration::from_secs(60),
    )?;
    tracing::info!(
        regions = ?controller.regions(),
        controller_vmid = config.controller_vmid,
        vmid_range = %config.vmid_range,
        "cloud config loaded"
    );

    let mut metrics = Metrics::new("controller", env!("CARGO_PKG_VERSION"));
    api_metrics.register(metrics.registry_mut());
    crate::warnings::register(metrics.registry_mut());
    crate::progress::register(metrics.registry_mut());
    crate::attach::register(metrics.registry_mut());
    let identity = Identity::new(opts.driver_name.clone());
    let health = ClusterHealth::default();
    health.register(metrics.registry_mut());
    tokio::spawn(health.watch(
        controller.clients.values().cloned().collect(),
        Duration::from_secs(5),
        opts.cluster_check_interval,
    ));
    let metrics = Arc::new(metrics);
    // Read as the Go driver reads it: exactly "true".
    controller.unsafe_mount = std::env::var("UNSAFEMOUNT").is_ok_and(|v| v == "true");
    if controller.unsafe_mount {
        tracing::warn!(
            "UNSAFEMOUNT=true: disks are attached without a backup option, so Proxmox's default \
             (backup=1) puts them in vzdump backups"
        );
    }
    match proxmox_csi_common::kubeclient::client(opts.kubeconfig.as_deref()).await {
        Ok(k) => controller = controller.with_kube(crate::kube::Kube::new(k), &opts.driver_name),
        Err(e) => tracing::warn!(
            error = %e,
            "Kubernetes API not available: node lookup by providerID, `lifecycle: keep` and \
             VolumeAttributesClasses at attach are off"
        ),
    }
    let (cluster_id, why_none) = match (opts.cluster_id, &controller.kube) {
        (Some(id), _) => (Some(id), String::new()),
        (None, Some(k)) => match crate::kube::cluster_id(k.client()).await {
            Ok(id) => (id, "namespace kube-system has no UID".into()),
            Err(e) => (None, format!("reading namespace kube-system: {e}")),
        },
        (None, None) => (None, "no Kubernetes API".into()),
    };
    match &cluster_id {
        Some(id) => tracing::info!(cluster_id = %id, "new disks carry this cluster id"),
        None => tracing::warn!(
            cause = %why_none,
            "no cluster id: new disks are named without one, so `pvecsictl clean` cannot \
             attribute them (set --cluster-id)"
        ),
    }
    controller.cluster_id = cluster_id;
    let controller = Arc::new(controller);

    // One shutdown signal fanned out to the gRPC and metrics servers.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    if let Some(addr) = opts.metrics_address {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Metrics { addr, source })?;
        tracing::info!(%addr, "serving metrics on /metrics");
        tokio::spawn(metrics::serve_on(
            listener,
            metrics.clone(),
            stopped(stop_rx.clone()),
        ));
    }

    let listener = opts.csi_address.bind(SocketAccess::default()).await?;
    tracing::info!(endpoint = %opts.csi_address, driver = %opts.driver_name, "serving CSI");
    let router = tonic::transport::Server::builder()
        .layer(metrics::GrpcMetricsLayer(metrics.clone()))
        .add_service(IdentityServer::new(identity))
        .add_service(ControllerServer::new(ControllerService(controller)));
    listener.serve(router, stopped(stop_rx)).await?;
    tracing::info!("stopped");
    Ok(())
}
