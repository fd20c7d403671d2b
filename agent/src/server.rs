//! Wiring: hostd connection → gRPC services → listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proxmox_csi_common::endpoint::SocketAccess;
use proxmox_csi_common::metrics::{self, Metrics};
use proxmox_csi_common::{Endpoint, EndpointError};
use proxmox_csi_proto::csi::v1::identity_server::IdentityServer;
use proxmox_csi_proto::csi::v1::node_server::NodeServer;
use tokio::sync::watch;

use crate::csi::identity::Identity;
use crate::csi::node::{Node, TopologySource};
use crate::offer::HostdOffer;
use crate::request::Rules;
use crate::topology::Topology;

/// How often a node plugin waiting for hostd to share its socket directory
/// tries again, and says so every 15th time.
const BIND_RETRY: Duration = Duration::from_secs(2);

/// Why the node plugin could not start. As [`crate::error::AgentError`],
/// a variant's `Display` holds its source's words and is all that is
/// printed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Text: `kubeclient::client` (common) answers its error as a string.
    #[error("Kubernetes client: {0}")]
    Kubernetes(String),
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct Options {
    pub driver_name: String,
    pub csi_address: Endpoint,
    pub hostd_socket: PathBuf,
    pub metrics_address: Option<SocketAddr>,
    pub node_name: String,
    pub vmid: Option<u32>,
    pub kubelet_root: PathBuf,
    pub max_volumes: i64,
    /// Region and zone given on the command line instead of Node labels.
    pub fixed_topology: Option<Topology>,
    /// hostd calls may wait for a hot-plugged disk and run mkfs.
    pub hostd_timeout: Duration,
    /// A kubeconfig instead of the in-cluster configuration (Go's `--kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
}

pub async fn run(
    opts: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let hostd = crate::hostd::connect(opts.hostd_socket.clone(), opts.hostd_timeout);
    let topology = match opts.fixed_topology.clone() {
        Some(t) => TopologySource::Fixed(t),
        None => TopologySource::Kubernetes(
            proxmox_csi_common::kubeclient::client(opts.kubeconfig.as_deref())
                .await
                .map_err(StartError::Kubernetes)?,
        ),
    };
    let node = Node {
        rules: Rules {
            kubelet_root: opts.kubelet_root.clone(),
        },
        hostd: hostd.clone(),
        node_name: opts.node_name.clone(),
        vmid: opts.vmid,
        topology,
        max_volumes: opts.max_volumes,
        offer: HostdOffer::default(),
    };
    let metrics = Arc::new(Metrics::new("node", env!("CARGO_PKG_VERSION")));
    let identity = Identity::new(opts.driver_name.clone(), hostd, Duration::from_secs(5))
        .with_offer(node.offer.clone());

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
        tokio::spawn(metrics::serve_on(
            listener,
            metrics.clone(),
            stopped(stop_rx.clone()),
        ));
    }
    let mut attempt = 0u32;
    let listener = loop {
        attempt += 1;
        match opts.csi_address.bind(SocketAccess::default()).await {
            Ok(l) => break l,
            // kubelet's plugins/<driver> directory is made writable for this
            // unprivileged plugin by hostd (--plugin-dir): on a node where
            // hostd never ran, wait for it rather than crash-loop.
            Err(EndpointError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                if attempt % 15 == 1 {
                    tracing::error!(
                        endpoint = %opts.csi_address,
                        hostd = %opts.hostd_socket.display(),
                        "hostd has not run on this node: the CSI socket's directory is made writable by hostd; \
                         install hostd (on Talos the proxmox-csi-hostd extension, docs/talos.md; elsewhere deploy/hostd) or keep this node out with the chart's node.nodeSelector; waiting for it"
                    );
                }
                let mut stop = stop_rx.clone();
                tokio::select! {
                    _ = tokio::time::sleep(BIND_RETRY) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    tracing::info!(endpoint = %opts.csi_address, hostd = %opts.hostd_socket.display(), "serving CSI");
    let router = tonic::transport::Server::builder()
        .layer(metrics::GrpcMetricsLayer(metrics.clone()))
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node));
    listener.serve(router, stopped(stop_rx)).await?;
    tracing::info!("stopped");
    Ok(())
}
