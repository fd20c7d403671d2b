//! The connection to hostd over its unix socket.

use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// A lazily connected channel: the agent starts even while hostd is down,
/// and reconnects when hostd restarts.
pub fn connect(socket: PathBuf, timeout: Duration) -> Result<HostdClient<Channel>, tonic::transport::Error> {
    // The URI is required by tonic but unused: the connector dials the socket.
    let channel = Endpoint::from_static("http://hostd.invalid")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }));
    Ok(HostdClient::new(channel))
}
