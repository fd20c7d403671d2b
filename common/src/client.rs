//! gRPC channels over unix sockets: to hostd, and to a CSI endpoint in tests
//! and the demo.

use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

fn endpoint() -> Endpoint {
    // tonic needs a URI; the connector below dials the socket instead.
    Endpoint::from_static("http://unix.invalid")
}

/// A channel that connects on first use and reconnects after the server
/// restarts, so a client can start before its server.
pub fn unix_channel_lazy(socket: PathBuf, timeout: Duration) -> Channel {
    endpoint()
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
}

/// Connects now, failing if nobody serves the socket.
pub async fn unix_channel(socket: PathBuf) -> Result<Channel, tonic::transport::Error> {
    endpoint()
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
}
