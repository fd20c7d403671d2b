//! Where a gRPC server listens: `unix:///path/to.sock` or `tcp://host:port`.
//!
//! A stale unix socket left by a crashed process is removed; a socket that a
//! live process still answers on, or a path that is not a socket at all, is an
//! error rather than something to delete.

use std::fs::Permissions;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::body::Body;
use tonic::service::Routes;
use tonic::transport::server::Router;
use tower::{Layer, Service};

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("endpoint {0:?} is not valid: expected unix:///absolute/path.sock or tcp://host:port")]
    Invalid(String),
    #[error("endpoint {endpoint:?}: {path} exists and is not a socket; refusing to replace it")]
    NotASocket { endpoint: String, path: PathBuf },
    #[error("endpoint {0:?}: another process is serving on this socket")]
    InUse(String),
    #[error("endpoint {endpoint:?}: {action}: {source}")]
    Io {
        endpoint: String,
        action: &'static str,
        source: io::Error,
    },
    #[error("serving gRPC on {endpoint:?}: {source}")]
    Serve {
        endpoint: String,
        source: tonic::transport::Error,
    },
}

/// A parsed listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

impl std::str::FromStr for Endpoint {
    type Err = EndpointError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || EndpointError::Invalid(s.to_string());
        if let Some(path) = s.strip_prefix("unix://") {
            let path = PathBuf::from(path);
            if !path.is_absolute() || path.file_name().is_none() {
                return Err(invalid());
            }
            Ok(Self::Unix(path))
        } else if let Some(addr) = s.strip_prefix("tcp://") {
            let (host, port) = addr.rsplit_once(':').ok_or_else(invalid)?;
            if port.parse::<u16>().is_err() {
                return Err(invalid());
            }
            // An empty host means every interface, as in ":8080".
            let host = if host.is_empty() { "0.0.0.0" } else { host };
            Ok(Self::Tcp(format!("{host}:{port}")))
        } else if s.starts_with('/') {
            Ok(Self::Unix(PathBuf::from(s)))
        } else {
            Err(invalid())
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix://{}", p.display()),
            Self::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

/// Ownership and mode applied to a unix socket after it is bound.
#[derive(Debug, Clone, Copy)]
pub struct SocketAccess {
    pub mode: u32,
    pub group: Option<u32>,
}

impl Default for SocketAccess {
    fn default() -> Self {
        Self {
            mode: 0o660,
            group: None,
        }
    }
}

/// A bound listener, ready to serve.
#[derive(Debug)]
pub enum Listener {
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
    Tcp {
        listener: TcpListener,
    },
}

impl Endpoint {
    pub async fn bind(&self, access: SocketAccess) -> Result<Listener, EndpointError> {
        let io = |action: &'static str| {
            let endpoint = self.to_string();
            move |source| EndpointError::Io {
                endpoint,
                action,
                source,
            }
        };
        match self {
            Self::Tcp(addr) => {
                let listener = TcpListener::bind(addr).await.map_err(io("binding"))?;
                Ok(Listener::Tcp { listener })
            }
            Self::Unix(path) => {
                remove_stale_socket(self, path)?;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(io("creating the socket directory"))?;
                }
                // Bound and listening under a temporary name, given its mode
                // and group, then renamed into place: a client that sees the
                // path can connect (bind and listen are two calls), and never
                // with the wrong access.
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default();
                let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                let listener = UnixListener::bind(&tmp).map_err(io("binding"))?;
                let placed = (|| {
                    std::fs::set_permissions(&tmp, Permissions::from_mode(access.mode))
                        .map_err(io("setting the socket mode"))?;
                    if let Some(gid) = access.group {
                        nix::unistd::chown(&tmp, None, Some(nix::unistd::Gid::from_raw(gid)))
                            .map_err(|e| io("setting the socket group")(io::Error::from(e)))?;
                    }
                    std::fs::rename(&tmp, path).map_err(io("placing the socket"))
                })();
                if let Err(e) = placed {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                Ok(Listener::Unix {
                    listener,
                    path: path.clone(),
                })
            }
        }
    }
}

fn remove_stale_socket(endpoint: &Endpoint, path: &Path) -> Result<(), EndpointError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(EndpointError::Io {
                endpoint: endpoint.to_string(),
                action: "inspecting the socket path",
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(EndpointError::NotASocket {
            endpoint: endpoint.to_string(),
            path: path.to_path_buf(),
        });
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(EndpointError::InUse(endpoint.to_string()));
    }
    std::fs::remove_file(path).map_err(|source| EndpointError::Io {
        endpoint: endpoint.to_string(),
        action: "removing the stale socket",
        source,
    })
}

impl Listener {
    /// The local address, for logs and for tests that bind port 0.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Self::Tcp { listener } => listener.local_addr().ok(),
            Self::Unix { .. } => None,
        }
    }

    /// Serves `router` until `shutdown` resolves, then removes the unix socket.
    pub async fn serve<L, ResBody>(
        self,
        router: Router<L>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), EndpointError>
    where
        L: Layer<Routes>,
        L::Service: Service<http::Request<Body>, Response = http::Response<ResBody>>
            + Clone
            + Send
            + 'static,
        <L::Service as Service<http::Request<Body>>>::Future: Send,
        <L::Service as Service<http::Request<Body>>>::Error:
            Into<Box<dyn std::error::Error + Send + Sync>> + Send,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match self {
            Self::Tcp { listener } => {
                let endpoint = format!("tcp://{:?}", listener.local_addr().ok());
                router
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
                    .await
                    .map_err(|source| EndpointError::Serve { endpoint, source })
            }
            Self::Unix { listener, path } => {
                let endpoint = format!("unix://{}", path.display());
                let result = router
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
                    .await
                    .map_err(|source| EndpointError::Serve { endpoint, source });
                let _ = std::fs::remove_file(&path);
                result
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_kubelet_and_operators_use() {
        assert_eq!(
            "unix:///csi/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/csi/csi.sock".into())
        );
        assert_eq!(
            "/run/x.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/run/x.sock".into())
        );
        assert_eq!(
            "tcp://127.0.0.1:10000".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("127.0.0.1:10000".into())
        );
        assert_eq!(
            "tcp://:9000".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("0.0.0.0:9000".into())
        );
        for bad in [
            "unix://relative.sock",
            "tcp://host",
            "tcp://h:notaport",
            "http://x:1",
            "",
        ] {
            let err = bad.parse::<Endpoint>().unwrap_err().to_string();
            assert!(err.contains("unix:///absolute/path.sock"), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn binds_tcp() {
        let l = "tcp://127.0.0.1:0"
            .parse::<Endpoint>()
            .unwrap()
            .bind(SocketAccess::default())
            .await
            .unwrap();
        assert!(l.local_addr().unwrap().port() > 0);
    }

    #[tokio::test]
    async fn replaces_a_stale_socket_but_not_a_live_one_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let ep = Endpoint::Unix(path.clone());

        // A socket whose owner died: bound, then dropped without unlinking.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let live = ep.bind(SocketAccess::default()).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);

        // Now a live listener owns it: a second bind must refuse.
        let err = ep.bind(SocketAccess::default()).await.unwrap_err();
        assert!(matches!(err, EndpointError::InUse(_)), "{err}");
        drop(live);

        let file = dir.path().join("data");
        std::fs::write(&file, b"keep me").unwrap();
        let err = Endpoint::Unix(file.clone())
            .bind(SocketAccess::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is not a socket"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    }
}
