//! The CSI controller for Proxmox VE. It alone holds the Proxmox API token.

pub mod attach;
pub mod attachments;
pub mod config;
pub mod csi;
pub mod ctl;
pub mod drive;
pub mod error;
pub mod kube;
pub mod naming;
pub mod params;
pub mod progress;
pub mod pve;
pub mod server;
pub mod vms;
pub mod volume;
pub mod warnings;
