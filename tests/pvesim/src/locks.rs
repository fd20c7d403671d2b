//! The per-VM config lock (a flock in Proxmox, 10 s to acquire; shared or
//! exclusive) and the per-storage allocation lock, with Proxmox's exact
//! timeout messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

#[derive(Debug, Default)]
pub struct Locks {
    map: Mutex<HashMap<String, Arc<RwLock<()>>>>,
}

/// A held lock; released on drop.
#[derive(Debug)]
pub enum Guard {
    Exclusive(OwnedRwLockWriteGuard<()>),
    Shared(OwnedRwLockReadGuard<()>),
}

impl Locks {
    fn lock_for(&self, name: &str) -> Arc<RwLock<()>> {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(name.to_string()).or_default().clone()
    }

    async fn acquire(
        &self,
        name: &str,
        timeout: Duration,
        message: String,
    ) -> Result<Guard, String> {
        let lock = self.lock_for(name);
        tokio::time::timeout(timeout, lock.write_owned())
            .await
            .map(Guard::Exclusive)
            .map_err(|_| message)
    }

    /// The shared flock (pve-guest-common AbstractConfig.pm
    /// lock_config_shared): many holders at once, none beside an exclusive one.
    pub async fn vm_shared(&self, vmid: u32, timeout: Duration) -> Result<Guard, String> {
        let lock = self.lock_for(&format!("vm-{vmid}"));
        tokio::time::timeout(timeout, lock.read_owned())
            .await
            .map(Guard::Shared)
            .map_err(|_| {
                format!("can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout")
            })
    }

    pub async fn vm(&self, vmid: u32, timeout: Duration) -> Result<Guard, String> {
        self.acquire(
            &format!("vm-{vmid}"),
            timeout,
            format!("can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"),
        )
        .await
    }

    pub async fn storage(
        &self,
        storage: &str,
        shared: bool,
        timeout: Duration,
    ) -> Result<Guard, String> {
        let message = if shared {
            format!("cfs-lock 'storage-{storage}' error: got lock request timeout")
        } else {
            format!("can't lock file '/var/lock/pve-manager/pve-storage-{storage}' - got timeout")
        };
        self.acquire(&format!("storage-{storage}"), timeout, message)
            .await
    }

    /// Holds a storage's allocation lock for `hold`.
    pub fn hold_storage(self: &Arc<Self>, storage: &str, hold: Duration) {
        let lock = self.lock_for(&format!("storage-{storage}"));
        tokio::spawn(async move {
            let _g = lock.write_owned().await;
            tokio::time::sleep(hold).await;
        });
    }

    /// Holds a VM's lock for `hold` (a knob for tests: a slow backup hook,
    /// another client's long config write).
    pub fn hold_vm(self: &Arc<Self>, vmid: u32, hold: Duration) {
        let lock = self.lock_for(&format!("vm-{vmid}"));
        tokio::spawn(async move {
            let _g = lock.write_owned().await;
            tokio::time::sleep(hold).await;
        });
    }
}
