//! proxmox-csi-node: the CSI node plugin. Unprivileged: it speaks CSI to
//! kubelet, validates every request, and asks hostd to act.

pub mod csi;
pub mod error;
pub mod hostd;
pub mod offer;
pub mod request;
pub mod server;
pub mod topology;
