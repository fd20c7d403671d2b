//! Typed Proxmox endpoints the controller uses.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use super::client::{Client, Deadline, PveError};
use super::errors::ErrorKind;

#[derive(Debug, Clone, Deserialize)]
pub struct StorageStatus {
    #[serde(default)]
    pub enabled: u8,
    #[serde(default)]
    pub active: u8,
    #[serde(default)]
    pub shared: u8,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub total: u64,
    #[serde(default)]
    pub avail: u64,
    #[serde(default)]
    pub content: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct VolumeInfo {
    pub size: u64,
    #[serde(default)]
    pub format: String,
    /// `size` is an upper bound: a qcow2 volume of a thick LVM volume chain
    /// listed where its LV is inactive has only the LV's `approximate-size`
    /// (pve-storage LVMPlugin.pm list_images).
    #[serde(default)]
    pub approximate: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StorageConfig {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub shared: Option<u8>,
    #[serde(default)]
    pub nodes: Option<String>,
    /// LVM: a removed volume's extents are zeroed (pve-storage
    /// src/PVE/Storage/LVMPlugin.pm `saferemove`, a boolean sent as 0/1).
    #[serde(default)]
    pub saferemove: Option<u8>,
    /// LVM: qcow2 volumes as volume chains (PVE 9; pve-storage
    /// LVMPlugin.pm `snapshot-as-volume-chain`, a boolean sent as 0/1).
    #[serde(default, rename = "snapshot-as-volume-chain")]
    pub snapshot_as_volume_chain: Option<u8>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct VmResource {
    pub vmid: u32,
    pub node: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub template: Option<u8>,
    /// `;`-separated tags (the controller's own VMs carry `proxmox-csi`).
    #[serde(default)]
    pub tags: Option<String>,
    /// The HA service state of an HA-managed VM (`started`, `migrate`,
    /// `error`, …; pve-manager PVE/API2/Cluster.pm resources).
    #[serde(default)]
    pub hastate: Option<String>,
}

impl VmResource {
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags
            .as_deref()
            .is_some_and(|t| t.split([';', ',', ' ']).any(|x| x == tag))
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct StorageResource {
    pub storage: String,
    pub node: String,
    #[serde(default)]
    pub shared: u8,
    #[serde(default)]
    pub plugintype: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub maxdisk: u64,
    #[serde(default)]
    pub disk: u64,
    /// Content types, `,`-separated (`images` for VM disks).
    #[serde(default)]
    pub content: String,
}

impl StorageResource {
    pub fn holds_images(&self) -> bool {
        self.content.is_empty() || self.content.split(',').any(|c| c.trim() == "images")
    }
}

/// A VM config: option → value, with `digest`.
#[derive(Debug, Clone, Default)]
pub struct VmConfig {
    pub values: BTreeMap<String, String>,
    pub digest: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PendingItem {
    pub key: String,
    #[serde(default)]
    pub value: Option<Value>,
    #[serde(default)]
    pub pending: Option<Value>,
    #[serde(default)]
    pub delete: Option<u8>,
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A volume's row of a storage listing.
fn listed_info(row: &Value) -> VolumeInfo {
    let (size, approximate) = match row["size"].as_u64() {
        Some(size) => (size, false),
        None => (row["approximate-size"].as_u64().unwrap_or(0), true),
    };
    VolumeInfo {
        size,
        format: row["format"].as_str().unwrap_or_default().to_string(),
        approximate,
    }
}

/// A disk image of a storage's content list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageImage {
    /// `<storage>:<volume>`.
    pub volid: String,
    /// The VM that owns it, as Proxmox reads it from the name.
    pub vmid: Option<u32>,
    /// Bytes.
    pub size: u64,
}

impl Client {
    pub async fn storage_status(
        &self,
        node: &str,
        storage: &str,
        d: Deadline,
    ) -> Result<StorageStatus, PveError> {
        self.call(
            Method::GET,
            &format!("/nodes/{node}/storage/{storage}/status"),
            &[],
            d,
        )
        .await
    }

    /// One volume's size, without listing the storage. `None` if it does
    /// not exist. Proxmox answers a missing volume with a storage type's own
    /// text (pve-storage API2/Storage/Content.pm info → the plugin's
    /// volume_size_info): those the error corpus knows settle it; any other
    /// 500 is settled by the storage's listing of the owner's volumes, never
    /// guessed. The listing stays off the common path: it grows with the
    /// number of volumes.
    pub async fn volume_info(
        &self,
        node: &str,
        storage: &str,
        volname: &str,
        d: Deadline,
    ) -> Result<Option<VolumeInfo>, PveError> {
        let path = format!("/nodes/{node}/storage/{storage}/content/{storage}:{volname}");
        match self.call(Method::GET, &path, &[], d).await {
            Ok(v) => Ok(Some(v)),
            // A qcow2 volume of a thick LVM volume chain whose LV is not
            // active on `node` answers as a missing one (Content.pm info:
            // "volume_size_info on '…' failed - no format"): the listing,
            // which has it either way, settles it.
            Err(e) if e.is_not_found() && volname.ends_with(".qcow2") => {
                match self.listed_volume(node, storage, volname, d).await {
                    // The storage itself is not there: nor is the volume.
                    Err(e) if e.is_not_found() => Ok(None),
                    other => other,
                }
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e)
                if e.kind() == ErrorKind::Other
                    && e.status().is_some_and(|s| s.as_u16() == 500) =>
            {
                tracing::debug!(storage, volname, error = %e, "unknown answer for a volume; asking the storage's listing");
                self.listed_volume(node, storage, volname, d).await
            }
            Err(e) => Err(e),
        }
    }

    /// A volume as `GET …/content?vmid=<owner>` lists it (pve-storage
    /// API2/Storage/Content.pm index: `volid`, `size`, `format`).
    async fn listed_volume(
        &self,
        node: &str,
        storage: &str,
        volname: &str,
        d: Deadline,
    ) -> Result<Option<VolumeInfo>, PveError> {
        let mut query = vec![("content", "images".to_string())];
        if let Some(owner) = crate::volume::owner_of(volname) {
            query.push(("vmid", owner.to_string()));
        }
        let listed: Vec<Value> = self
            .call(
                Method::GET,
                &format!("/nodes/{node}/storage/{storage}/content"),
                &query,
                d,
            )
            .await?;
        let volid = format!("{storage}:{volname}");
        Ok(listed
            .iter()
            .find(|v| v["volid"].as_str() == Some(volid.as_str()))
            .map(listed_info))
    }

    /// Allocates `filename` (size in bytes, sent in KiB) owned by `vmid`
    /// in `format`; returns the volid. The format is always sent: without
    /// it Proxmox takes the storage's default, which for LVM with
    /// `snapshot-as-volume-chain` is qcow2 (pve-storage LVMPlugin.pm
    /// get_formats; API2/Storage/Content.pm create → Storage.pm vdisk_alloc).
    #[allow(clippy::too_many_arguments)]
    pub async fn allocate(
        &self,
        node: &str,
        storage: &str,
        filename: &str,
        format: &str,
        vmid: u32,
        bytes: u64,
        d: Deadline,
    ) -> Result<String, PveError> {
        let form = [
            ("filename", filename.to_string()),
            ("format", format.to_string()),
            ("vmid", vmid.to_string()),
            ("size", format!("{}", bytes.div_ceil(1024))),
        ];
        self.call(
            Method::POST,
            &format!("/nodes/{node}/storage/{storage}/content"),
            &form,
            d,
        )
        .await
    }

    pub async fn delete_volume(
        &self,
        node: &str,
        storage: &str,
        volname: &str,
        d: Deadline,
    ) -> Result<(), PveError> {
        let path = format!("/nodes/{node}/storage/{storage}/content/{storage}:{volname}");
        let upid: Option<String> = self.call(Method::DELETE, &path, &[], d).await?;
        match upid {
            Some(u) => self.wait_task(&u, d).await,
            None => Ok(()),
        }
    }

    pub async fn storage_config(
        &self,
        storage: &str,
        d: Deadline,
    ) -> Result<StorageConfig, PveError> {
        self.call(Method::GET, &format!("/storage/{storage}"), &[], d)
            .await
    }

    pub async fn vms(&self, d: Deadline) -> Result<Vec<VmResource>, PveError> {
        let all: Vec<VmResource> = self
            .call(
                Method::GET,
                "/cluster/resources",
                &[("type", "vm".to_string())],
                d,
            )
            .await?;
        Ok(all
            .into_iter()
            .filter(|v| v.kind == "qemu" && v.template != Some(1))
            .collect())
    }

    /// The VMIDs that own a disk on a storage of `node` the token sees
    /// (content `images`): a new VM of the driver takes none of them, so
    /// that no disk of another owner is ever listed under it (and freed by
    /// a destroy with `destroy-unreferenced-disks` from the UI, where the
    /// flag is lifted). A storage whose content cannot be read is left out.
    pub async fn disk_owners(
        &self,
        node: &str,
        d: Deadline,
    ) -> Result<std::collections::HashSet<u32>, PveError> {
        let images = || ("content", "images".to_string());
        let storages: Vec<Value> = self
            .call(
                Method::GET,
                &format!("/nodes/{node}/storage"),
                &[("enabled", "1".to_string()), images()],
                d,
            )
            .await?;
        let mut owners = std::collections::HashSet::new();
        for st in &storages {
            let Some(id) = st["storage"].as_str() else {
                continue;
            };
            match self.storage_images(node, id, d).await {
                Ok(list) => owners.extend(list.iter().filter_map(|v| v.vmid)),
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => tracing::debug!(storage = id, error = %e, "storage content not readable"),
            }
        }
        Ok(owners)
    }

    /// The disk images on `storage`, read through `node`.
    pub async fn storage_images(
        &self,
        node: &str,
        storage: &str,
        d: Deadline,
    ) -> Result<Vec<StorageImage>, PveError> {
        let path = format!("/nodes/{node}/storage/{storage}/content");
        let list: Vec<Value> = self
            .call(Method::GET, &path, &[("content", "images".into())], d)
            .await?;
        Ok(list
            .iter()
            .map(|v| StorageImage {
                volid: v["volid"].as_str().unwrap_or_default().to_string(),
                vmid: v["vmid"].as_u64().and_then(|n| u32::try_from(n).ok()),
                size: v["size"].as_u64().unwrap_or(0),
            })
            .collect())
    }

    /// `/cluster/nextid?vmid=N`: `vmid` back when no VM has it, a 400
    /// (pve-manager PVE/API2/Cluster.pm nextid) when one does.
    pub async fn next_id(&self, vmid: u32, d: Deadline) -> Result<Value, PveError> {
        let form = [("vmid", vmid.to_string())];
        self.call(Method::GET, "/cluster/nextid", &form, d).await
    }

    pub async fn storages(&self, d: Deadline) -> Result<Vec<StorageResource>, PveError> {
        self.call(
            Method::GET,
            "/cluster/resources",
            &[("type", "storage".to_string())],
            d,
        )
        .await
    }

    /// Nodes the cluster membership does not show online
    /// (`/cluster/resources?type=node`, status `offline` or `unknown`).
    pub async fn offline_nodes(
        &self,
        d: Deadline,
    ) -> Result<std::collections::BTreeSet<String>, PveError> {
        let rows: Vec<Value> = self
            .call(
                Method::GET,
                "/cluster/resources",
                &[("type", "node".to_string())],
                d,
            )
            .await?;
        Ok(rows
            .iter()
            .filter(|r| r["status"] != "online")
            .filter_map(|r| r["node"].as_str().map(String::from))
            .collect())
    }

    /// The committed config (`current=1`: pending changes not applied).
    pub async fn vm_config(
        &self,
        node: &str,
        vmid: u32,
        d: Deadline,
    ) -> Result<VmConfig, PveError> {
        let raw: BTreeMap<String, Value> = self
            .call(
                Method::GET,
                &format!("/nodes/{node}/qemu/{vmid}/config"),
                &[("current", "1".into())],
                d,
            )
            .await?;
        let mut values: BTreeMap<String, String> =
            raw.iter().map(|(k, v)| (k.clone(), text(v))).collect();
        let digest = values.remove("digest").unwrap_or_default();
        Ok(VmConfig { values, digest })
    }

    pub async fn vm_pending(
        &self,
        node: &str,
        vmid: u32,
        d: Deadline,
    ) -> Result<Vec<PendingItem>, PveError> {
        self.call(
            Method::GET,
            &format!("/nodes/{node}/qemu/{vmid}/pending"),
            &[],
            d,
        )
        .await
    }

    /// `POST …/config` and wait for its task; the exit status is checked.
    pub async fn update_config(
        &self,
        node: &str,
        vmid: u32,
        form: &[(&str, String)],
        d: Deadline,
    ) -> Result<(), PveError> {
        self.update_config_expecting(node, vmid, form, None, d)
            .await
            .map(|_| ())
    }

    /// `update_config` of a task expected to last about `expect`
    /// (`wait_task_expecting`): how its task was seen to end, `None` when
    /// Proxmox did the work inside the request.
    pub async fn update_config_expecting(
        &self,
        node: &str,
        vmid: u32,
        form: &[(&str, String)],
        expect: Option<std::time::Duration>,
        d: Deadline,
    ) -> Result<Option<super::tasks::TaskSeen>, PveError> {
        let upid: Option<String> = self
            .call(
                Method::POST,
                &format!("/nodes/{node}/qemu/{vmid}/config"),
                form,
                d,
            )
            .await?;
        match upid {
            Some(u) => self.wait_task_expecting(&u, expect, d).await.map(Some),
            None => Ok(None),
        }
    }

    /// `POST …/config` without waiting: the task's UPID (`None` when
    /// Proxmox finished the work inside the request).
    pub async fn start_config_update(
        &self,
        node: &str,
        vmid: u32,
        form: &[(&str, String)],
        d: Deadline,
    ) -> Result<Option<String>, PveError> {
        self.call(
            Method::POST,
            &format!("/nodes/{node}/qemu/{vmid}/config"),
            form,
            d,
        )
        .await
    }

    /// Creates a VM (no disks) and waits for the task.
    pub async fn create_vm(
        &self,
        node: &str,
        form: &[(&str, String)],
        d: Deadline,
    ) -> Result<(), PveError> {
        let upid: String = self
            .call(Method::POST, &format!("/nodes/{node}/qemu"), form, d)
            .await?;
        self.wait_task(&upid, d).await
    }

    /// Destroys a stopped VM with the disks its configuration references
    /// and its replication jobs (`purge`); waits for the task. Never with
    /// `destroy-unreferenced-disks`: that frees every disk named after the
    /// VMID on the storages of the node (qemu-server QemuServer.pm
    /// destroy_vm → pve-storage vdisk_list), whoever made it: another
    /// cluster's volumes under the same VMID, on storages the token cannot
    /// see or that appeared after the VM was made.
    pub async fn destroy_vm(&self, node: &str, vmid: u32, d: Deadline) -> Result<(), PveError> {
        let q = [("purge", "1".to_string())];
        let upid: String = self
            .call(Method::DELETE, &format!("/nodes/{node}/qemu/{vmid}"), &q, d)
            .await?;
        self.wait_task(&upid, d).await
    }

    pub async fn resize(
        &self,
        node: &str,
        vmid: u32,
        disk: &str,
        bytes: u64,
        d: Deadline,
    ) -> Result<(), PveError> {
        let form = [("disk", disk.to_string()), ("size", bytes.to_string())];
        let upid: Option<String> = self
            .call(
                Method::PUT,
                &format!("/nodes/{node}/qemu/{vmid}/resize"),
                &form,
                d,
            )
            .await?;
        match upid {
            Some(u) => self.wait_task(&u, d).await,
            None => Ok(()),
        }
    }
}
