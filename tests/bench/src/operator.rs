//! What operators and Proxmox do behind the driver's back, for the soak:
//! disks detached and attached in the UI, worker VMs stopped, started and
//! moved to another node, a backup holding a VM's lock for a minute, an NFS
//! server going away, a node going offline. Each action is a real Proxmox
//! API call (the UI's own requests) or the simulator's model of an outside
//! event, and most are undone later, from the campaign's loop, so that the
//! campaign can keep its model of the world true.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use reqwest::Method;
use serde_json::Value;

use crate::sim::Sim;

/// The kinds of change made behind the driver's back, as the soak counts them.
pub const KINDS: [&str; 7] = [
    "UI: a published disk detached",
    "UI: an idle disk attached to a worker",
    "worker VM stopped, started later",
    "worker VM moved to the other node",
    "backup holding lock: backup for the long lock",
    "NFS storage offline for a while",
    "node offline (595) for a while",
];

/// What an operator puts back, depending on what the driver did meanwhile
/// (so the campaign's loop does it, with its model at hand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// The operator detaches again the disk they attached in the UI.
    Detach {
        vmid: u32,
        key: String,
        volid: String,
    },
    /// The VM is moved back to its node, once it holds no local disk.
    MoveBack { vmid: u32, node: &'static str },
}

/// What comes back on its own time, whatever the driver does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// The VM is started again.
    Start { vmid: u32 },
    /// The backup ends: `lock: backup` is cleared.
    Unlock { vmid: u32 },
    /// The node answers again.
    NodeOnline { node: &'static str },
    /// The NFS server answers again.
    StorageOnline { storage: &'static str },
}

impl Restore {
    pub async fn apply(&self, sim: &Sim) -> Result<()> {
        match self {
            Restore::Start { vmid } => set_running(sim, *vmid, true).await,
            Restore::Unlock { vmid } => set_backup_lock(sim, *vmid, false).await,
            Restore::NodeOnline { node } => set_node_online(sim, node, true).await,
            Restore::StorageOnline { storage } => set_storage_online(sim, storage, true).await,
        }
    }
}

/// An undo and when it is due.
#[derive(Debug, Clone)]
pub struct Pending {
    pub due: Instant,
    pub undo: Undo,
}

impl Pending {
    pub fn after(wait: Duration, undo: Undo) -> Self {
        Self {
            due: Instant::now() + wait,
            undo,
        }
    }
}

/// A VM's node and config as pvesim holds them.
pub async fn vm(sim: &Sim, vmid: u32) -> Result<(String, serde_json::Map<String, Value>)> {
    let v = sim.admin(Method::GET, &format!("vms/{vmid}"), "").await?;
    let node = v["node"].as_str().context("VM without a node")?.to_string();
    let config = v["config"].as_object().cloned().unwrap_or_default();
    Ok((node, config))
}

/// Whether VM `vmid` holds one of the driver's local disks: Proxmox moves
/// such a VM only with its disks.
pub async fn holds_local_disk(sim: &Sim, vmid: u32) -> Result<bool> {
    let (_, config) = vm(sim, vmid).await?;
    Ok(config.values().any(|v| {
        v.as_str()
            .is_some_and(|s| s.starts_with("local-lvm:vm-9999-"))
    }))
}

/// The config key that holds `volid` on VM `vmid`, if any.
pub async fn slot_of(sim: &Sim, vmid: u32, volid: &str) -> Result<Option<String>> {
    let (_, config) = vm(sim, vmid).await?;
    Ok(config
        .iter()
        .find(|(k, v)| {
            k.starts_with("scsi")
                && v.as_str()
                    .and_then(|s| s.split(',').next())
                    .is_some_and(|s| s == volid)
        })
        .map(|(k, _)| k.clone()))
}

/// The UI's "Detach" of a disk: `PUT …/config delete=<key>` (a disk of
/// another VM's, such as the driver's `vm-9999-…`, leaves no `unusedN`).
pub async fn detach(sim: &Sim, vmid: u32, key: &str) -> Result<()> {
    let (node, _) = vm(sim, vmid).await?;
    sim.api(
        Method::PUT,
        &format!("/nodes/{node}/qemu/{vmid}/config"),
        &[("delete", key)],
    )
    .await
    .map(|_| ())
}

/// The UI's "Add: existing disk" (`PUT …/config scsiN=<volid>`) on the
/// first free slot; the key used.
pub async fn attach(sim: &Sim, vmid: u32, volid: &str) -> Result<String> {
    let (node, config) = vm(sim, vmid).await?;
    let Some(n) = (1..=30).find(|n| !config.contains_key(&format!("scsi{n}"))) else {
        bail!("VM {vmid} has no free SCSI slot");
    };
    let key = format!("scsi{n}");
    sim.api(
        Method::PUT,
        &format!("/nodes/{node}/qemu/{vmid}/config"),
        &[(key.as_str(), volid)],
    )
    .await?;
    Ok(key)
}

/// Stops or starts a worker VM (a shutdown in the UI, or HA).
pub async fn set_running(sim: &Sim, vmid: u32, running: bool) -> Result<()> {
    sim.admin(
        Method::PUT,
        &format!("vms/{vmid}/running?value={}", u8::from(running)),
        "",
    )
    .await
    .map(|_| ())
}

/// vzdump's `lock: backup` on a VM, or its end.
pub async fn set_backup_lock(sim: &Sim, vmid: u32, locked: bool) -> Result<()> {
    let method = if locked { Method::PUT } else { Method::DELETE };
    sim.admin(method, &format!("vms/{vmid}/lock?value=backup"), "")
        .await
        .map(|_| ())
}

/// HA or an operator moved the VM to `node`.
pub async fn relocate(sim: &Sim, vmid: u32, node: &str) -> Result<()> {
    sim.admin(
        Method::POST,
        &format!("vms/{vmid}/relocate?node={node}"),
        "",
    )
    .await
    .map(|_| ())
}

pub async fn set_node_online(sim: &Sim, node: &str, online: bool) -> Result<()> {
    sim.admin(
        Method::PUT,
        &format!("nodes/{node}/online?value={}", u8::from(online)),
        "",
    )
    .await
    .map(|_| ())
}

pub async fn set_storage_online(sim: &Sim, storage: &str, online: bool) -> Result<()> {
    sim.admin(
        Method::PUT,
        &format!("storages/{storage}/online?value={}", u8::from(online)),
        "",
    )
    .await
    .map(|_| ())
}
