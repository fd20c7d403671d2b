//! Wiring: health reporting, the gRPC service, the unix socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::net::SocketAddr;

use proxmox_csi_common::endpoint::SocketAccess;
use proxmox_csi_common::metrics::{self, Metrics};
use proxmox_csi_common::{Endpoint, EndpointError};
use proxmox_csi_proto::hostd::v1::hostd_server::HostdServer;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;

use crate::bindings::Bindings;
use crate::device::Resolver;
use crate::discovery::{self, DeviceIndex, EventSource, MonitorDied};
use crate::error::HostdError;
use crate::health::Health;
use crate::paths::KubeletPaths;
use crate::peer::PeerPolicy;
use crate::service::HostdService;
use crate::volume::Volumes;

/// Largest request hostd accepts; its requests are a few paths and flags.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct Options {
    pub socket: PathBuf,
    pub socket_access: SocketAccess,
    pub health_file: Option<PathBuf>,
    pub health_interval: Duration,
    pub dmi_dir: PathBuf,
    pub metrics_address: Option<SocketAddr>,
    pub kubelet_root: PathBuf,
    /// The CSI driver's name: its staging directories are kubelet's
    /// `plugins/kubernetes.io/csi/<driver>/…`.
    pub driver_name: String,
    /// Where the records of staged and published volumes are kept.
    pub state_dir: PathBuf,
    pub resolver: Resolver,
    pub event_source: EventSource,
    pub device_wait: Duration,
    pub pbkdf: crate::luks::Pbkdf,
    pub kdf_bounds: crate::luks::KdfBounds,
    pub go_takeover: bool,
    pub peers: PeerPolicy,
    /// Capabilities withheld (test builds playing an older hostd).
    pub without: Vec<proxmox_csi_common::hostd_api::Capability>,
}

/// Why hostd could not start, or stopped. As every hostd error, its
/// `Display` is its context alone and what it failed on is its source;
/// [`StartError::message`] prints both, once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Device(#[from] HostdError),
    #[error("exiting so that the service manager restarts hostd")]
    MonitorDied(#[source] MonitorDied),
    #[error("kubelet root {path}")]
    KubeletRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StartError {
    /// What hostd logs as it exits: the error, then its source.
    pub fn message(&self) -> String {
        match self {
            // common's error prints what lies under it itself.
            Self::Endpoint(e) => e.to_string(),
            // Transparent: the context is the HostdError's, its source too.
            _ => match std::error::Error::source(self) {
                Some(source) => format!("{self}: {}", crate::error::message(source)),
                None => self.to_string(),
            },
        }
    }
}

pub async fn run(
    opts: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let paths = KubeletPaths::new(&opts.kubelet_root, &opts.driver_name).map_err(|source| {
        StartError::KubeletRoot {
            path: opts.kubelet_root.clone(),
            source,
        }
    })?;
    let bindings = Bindings::open(&opts.state_dir).map_err(|source| StartError::StateDir {
        path: opts.state_dir.clone(),
        source,
    })?;
    let health = Arc::new(Health::default());
    let index = Arc::new(DeviceIndex::default());
    let monitor_died = discovery::start_monitor(index.clone(), opts.event_source)?;
    health.set_udev_monitor_alive(true);
    let volumes = Arc::new(Volumes {
        paths,
        bindings,
        resolver: opts.resolver.clone(),
        index,
        device_wait: opts.device_wait,
        pbkdf: opts.pbkdf,
        kdf_bounds: opts.kdf_bounds,
        go_takeover: opts.go_takeover,
    });
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let died = Arc::new(std::sync::Mutex::new(None::<MonitorDied>));
    {
        let died = died.clone();
        let health = health.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown => {}
                reason = monitor_died => {
                    let reason = reason.unwrap_or(MonitorDied::Vanished);
                    let text = crate::error::message(&reason);
                    tracing::error!(reason = %text, "udev monitor died");
                    health.set_udev_monitor_alive(false);
                    health.record_error(&text);
                    *died.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
                }
            }
            let _ = stop_tx.send(true);
        });
    }

    if let Some(path) = opts.health_file.clone() {
        let health = health.clone();
        let volumes = volumes.clone();
        let mut stop = stop_rx.clone();
        let every = opts.health_interval;
        tokio::spawn(async move {
            loop {
                volumes.refresh_health(&health);
                if let Err(e) = health.write_file(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "writing the health file");
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
    }

    let mut metrics = Metrics::new("hostd", env!("CARGO_PKG_VERSION"));
    crate::metrics::register(metrics.registry_mut(), health.clone(), volumes.clone());
    let metrics = Arc::new(metrics);
    if let Some(addr) = opts.metrics_address {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| EndpointError::Io {
                endpoint: format!("metrics {addr}"),
                action: "binding",
                source,
            })?;
        let mut stop = stop_rx.clone();
        tokio::spawn(metrics::serve_on(listener, metrics.clone(), async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
    }

    let endpoint = Endpoint::Unix(opts.socket.clone());
    let listener = endpoint.bind(opts.socket_access).await?;
    tracing::info!(socket = %opts.socket.display(), mode = format!("{:o}", opts.socket_access.mode), "serving hostd");
    let peers = opts.peers.clone();
    let service =
        HostdService::new(health, opts.dmi_dir.clone(), volumes).without(opts.without.clone());
    // The peer check comes first: a caller it refuses is counted by nothing
    // it controls (its paths never become metric labels).
    let counted = tower::Layer::layer(
        &metrics::GrpcMetricsLayer(metrics),
        HostdServer::new(service).max_decoding_message_size(MAX_REQUEST_BYTES),
    );
    // Work in flight is bounded by the service (`service::MAX_CALLS_IN_FLIGHT`),
    // whose permits live as long as the work, not as long as the call.
    let router = tonic::transport::Server::builder().add_service(InterceptedService::new(
        counted,
        move |req: tonic::Request<()>| peers.check(&req).map(|()| req),
    ));
    listener
        .serve(router, async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        })
        .await?;
    if let Some(reason) = died.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(StartError::MonitorDied(reason));
    }
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// Each start error keeps what it failed on as its source, printed once.
    #[test]
    fn start_errors_keep_their_source_and_print_it_once() {
        let io = || std::io::Error::from_raw_os_error(nix::libc::EACCES);
        let e = StartError::StateDir {
            path: "/run/x/volumes".into(),
            source: io(),
        };
        assert_eq!(e.to_string(), "state directory /run/x/volumes");
        assert_eq!(
            e.source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .map(|s| s.kind()),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        assert_eq!(
            e.message(),
            format!("state directory /run/x/volumes: {}", io())
        );
        let e = StartError::KubeletRoot {
            path: "/var/lib/kubelet".into(),
            source: io(),
        };
        assert_eq!(
            e.message(),
            format!("kubelet root /var/lib/kubelet: {}", io())
        );

        // A HostdError prints as HostdError::message did.
        let inner = HostdError::io("opening the", "Kernel netlink monitor", io());
        let want = HostdError::lib("starting", "the udev monitor", inner).message();
        let inner = HostdError::io("opening the", "Kernel netlink monitor", io());
        let e = StartError::from(HostdError::lib("starting", "the udev monitor", inner));
        assert_eq!(e.message(), want);
        assert!(e.source().is_some_and(|s| s.is::<HostdError>()));

        // The monitor's reason, then its errno.
        let e = StartError::MonitorDied(MonitorDied::Poll(nix::Error::EBADF));
        let reason = e.source().and_then(|s| s.downcast_ref::<MonitorDied>());
        assert!(matches!(reason, Some(MonitorDied::Poll(nix::Error::EBADF))));
        assert_eq!(
            e.message(),
            format!(
                "exiting so that the service manager restarts hostd: udev monitor poll failed: {}",
                nix::Error::EBADF
            )
        );

        // common's error prints its source itself: once.
        let e = StartError::from(EndpointError::Io {
            endpoint: "unix:///run/x.sock".into(),
            action: "binding",
            source: io(),
        });
        assert_eq!(
            e.message(),
            format!("endpoint \"unix:///run/x.sock\": binding: {}", io())
        );
    }
}
