//! Plumbing shared by `proxmox-csi-controller`, `proxmox-csi-node` and
//! `proxmox-csi-hostd`: where they listen, how they log, how they expose
//! metrics, how they stop, and how secrets are kept out of logs.

pub mod client;
pub mod contract;
pub mod endpoint;
pub mod goflags;
pub mod handles;
pub mod hostd_api;
pub mod ids;
#[cfg(feature = "kube")]
pub mod kubeclient;
pub mod logging;
pub mod metrics;
pub mod mount_options;
pub mod rpc;
pub mod secret;
pub mod shutdown;
pub mod support;

pub use endpoint::{Endpoint, EndpointError, Listener};
pub use ids::{
    DEFAULT_MAX_VOLUMES, MAX_VOLUMES_LABEL, NodeId, NodeIdError, SCSI_SLOTS, max_volumes_label,
};
pub use secret::Secret;
