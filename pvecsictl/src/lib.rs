//! pvecsictl: what an operator needs without reading Proxmox configs by
//! hand. `doctor` finds what commonly breaks, `clean` finds (and with
//! `--yes` deletes) disks no PersistentVolume refers to, `rename` and
//! `swap` rebind claims, `migrate` moves a local volume to another Proxmox
//! node; all three resumable.

pub mod clean;
pub mod doctor;
pub mod kube_ops;
pub mod migrate;
pub mod output;
pub mod rebind;
pub mod state;
