//! proxmox-csi-hostd: the privileged half of the node plugin. It alone
//! touches block devices, behind the narrow API of `hostd.proto`.

pub mod health;
pub mod identity;
pub mod server;
pub mod service;
