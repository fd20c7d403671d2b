//! The CSI controller for Proxmox VE. It alone holds the Proxmox API token.

pub mod config;
pub mod csi;
pub mod pve;
pub mod server;
