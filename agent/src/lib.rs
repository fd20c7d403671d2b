//! proxmox-csi-node: the CSI node plugin. Unprivileged: it speaks CSI to
//! kubelet, validates every request, and asks hostd to act.

pub mod csi;
pub mod hostd;
pub mod server;
