//! The Go driver's attach and detach, one at a time per node, as
//! upstream-driver.md §5.4 and §5.5 describe them: a mutex per Kubernetes
//! node (one worker VM) around the whole operation, the volume checked (3
//! calls) and the VM config read (3 calls); an attach writes the first free
//! LUN and polls its task every second, a detach unlinks the disk; then the
//! config is read again every 5 s until the change shows. It is the
//! baseline of the bursts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use reqwest::Method;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::sim::DirectApi;

#[derive(Debug)]
pub struct GoLike {
    pve: DirectApi,
    /// The per-node-name mutexes (a Kubernetes node is one worker VM).
    node_locks: std::sync::Mutex<HashMap<u32, Arc<Mutex<()>>>>,
}

impl GoLike {
    pub fn new(api: &str) -> Self {
        Self {
            pve: DirectApi::new(api),
            node_locks: std::sync::Mutex::default(),
        }
    }

    fn node_lock(&self, vmid: u32) -> Arc<Mutex<()>> {
        let mut locks = self.node_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(vmid).or_default().clone()
    }

    async fn call(&self, method: Method, path: &str, form: &[(&str, String)]) -> Result<Value> {
        self.pve.call(method, path, form).await
    }

    /// GetVMConfig (upstream-driver.md §5.1): the VM's node from the cached
    /// resource list, then `status/current`, `config` (the "Ping"), and
    /// `config` again: three calls.
    async fn vm_config(&self, node: &str, vmid: u32) -> Result<Value> {
        self.call(
            Method::GET,
            &format!("/nodes/{node}/qemu/{vmid}/status/current"),
            &[],
        )
        .await?;
        let config = format!("/nodes/{node}/qemu/{vmid}/config");
        self.call(Method::GET, &config, &[]).await?;
        self.call(Method::GET, &config, &[]).await
    }

    /// checkVolume: storage status and the volume, before the node's lock.
    async fn check_volume(&self, node: &str, storage: &str, volid: &str) -> Result<()> {
        self.call(
            Method::GET,
            "/cluster/resources",
            &[("type", "storage".into())],
        )
        .await?;
        self.call(
            Method::GET,
            &format!("/nodes/{node}/storage/{storage}/status"),
            &[],
        )
        .await?;
        self.call(
            Method::GET,
            &format!("/nodes/{node}/storage/{storage}/content/{volid}"),
            &[],
        )
        .await?;
        Ok(())
    }

    /// WaitFor: a status read at once, then one a second; the exit status
    /// is not checked.
    async fn wait_for(&self, node: &str, upid: &str) -> Result<()> {
        loop {
            let st = self
                .call(
                    Method::GET,
                    &format!("/nodes/{node}/tasks/{upid}/status"),
                    &[],
                )
                .await?;
            if st["status"] != "running" {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Attaches `volid` (on `storage`) to VM `vmid` on `node`.
    pub async fn attach(
        &self,
        node: &str,
        vmid: u32,
        storage: &str,
        volid: &str,
        wwn: &str,
    ) -> Result<()> {
        self.check_volume(node, storage, volid).await?;
        let lock = self.node_lock(vmid);
        let _g = lock.lock().await;
        let cfg = self.vm_config(node, vmid).await?;
        let lun = (1..=30)
            .find(|n| cfg.get(format!("scsi{n}")).is_none())
            .context("no free LUN")?;
        let upid = self
            .call(
                Method::POST,
                &format!("/nodes/{node}/qemu/{vmid}/config"),
                &[(
                    &format!("scsi{lun}"),
                    format!("{volid},backup=0,iothread=1,wwn={wwn}"),
                )],
            )
            .await?;
        let upid = upid.as_str().context("no UPID")?.to_string();
        self.wait_for(node, &upid).await?;
        // waitAttachVolume: the config every 5 s until the disk shows.
        for _ in 0..7 {
            let cfg = self.vm_config(node, vmid).await?;
            if cfg.as_object().is_some_and(|m| {
                m.values()
                    .any(|v| v.as_str().is_some_and(|s| s.contains(volid)))
            }) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        bail!("volume {volid} is not attached to VM {vmid}")
    }

    /// Detaches `volid` from VM `vmid` on `node` (no `force`: the volume stays).
    pub async fn detach(&self, node: &str, vmid: u32, volid: &str) -> Result<()> {
        let storage = volid.split(':').next().unwrap_or_default();
        self.check_volume(node, storage, volid).await?;
        let lock = self.node_lock(vmid);
        let _g = lock.lock().await;
        let holds = |cfg: &Value| {
            cfg.as_object().and_then(|m| {
                m.iter()
                    .find(|(k, v)| {
                        k.starts_with("scsi") && v.as_str().is_some_and(|s| s.contains(volid))
                    })
                    .map(|(k, _)| k.clone())
            })
        };
        let cfg = self.vm_config(node, vmid).await?;
        if let Some(key) = holds(&cfg) {
            let answer = self
                .call(
                    Method::PUT,
                    &format!("/nodes/{node}/qemu/{vmid}/unlink"),
                    &[("idlist", key)],
                )
                .await?;
            if let Some(upid) = answer.as_str() {
                self.wait_for(node, upid).await?;
            }
        }
        // waitDetachVolume: the config every 5 s until the disk is gone.
        for _ in 0..7 {
            let cfg = self.vm_config(node, vmid).await?;
            if holds(&cfg).is_none() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        bail!("volume {volid} still attached to VM {vmid}")
    }
}
