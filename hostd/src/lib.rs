//! proxmox-csi-hostd: the privileged half of the node plugin. It alone
//! touches block devices, behind the narrow API of `hostd.proto`.

pub mod bindings;
pub mod blockdev;
pub mod claim;
pub mod device;
pub mod direct;
pub mod discovery;
pub mod error;
pub mod grow;
pub mod hardening;
pub mod health;
pub mod host;
pub mod identity;
pub mod kdf;
pub mod luks;
pub mod metrics;
pub mod mkfs;
pub mod mountopts;
pub mod mounts;
pub mod paths;
pub mod peer;
pub mod probe;
pub mod server;
pub mod service;
pub mod share;
pub mod tool;
pub mod volume;
