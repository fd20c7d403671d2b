//! The connection to hostd over its unix socket.

use std::path::PathBuf;
use std::time::Duration;

use proxmox_csi_common::client::unix_channel_lazy;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use tonic::transport::Channel;

/// A lazily connected client: the agent starts even while hostd is down, and
/// reconnects when hostd restarts.
pub fn connect(socket: PathBuf, timeout: Duration) -> HostdClient<Channel> {
    HostdClient::new(unix_channel_lazy(socket, timeout))
}
