//! The end-to-end harness: a QEMU guest playing a Kubernetes worker VM on
//! Proxmox, with hostd and the node plugin running inside it, and pvesim
//! hot-plugging disks into it over QMP exactly as Proxmox VE 9 does.

pub mod guest;
pub mod lab;
