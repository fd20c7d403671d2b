//! The simulated cluster: nodes, storages, volumes, VMs, users and ACLs,
//! loaded from a YAML state file and changed by the API.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::knobs::Knobs;
use crate::tasks::Task;
use crate::users::{AclEntry, User};

/// The state file.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct State {
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// What `GET /version` reports.
    #[serde(default = "default_version")]
    pub version: String,
    /// The qemu-server release whose behaviour is modelled where it changed
    /// between releases (the unplug waits and texts, see `hotplug`);
    /// Proxmox 8's last is 8.4.10.
    #[serde(default = "default_qemu_server", rename = "qemu-server")]
    pub qemu_server: String,
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    pub storages: Vec<StorageSpec>,
    #[serde(default)]
    pub vms: Vec<VmSpec>,
    /// Volumes that exist before the simulation starts.
    #[serde(default)]
    pub volumes: Vec<VolumeSpec>,
    #[serde(default)]
    pub users: Vec<User>,
    /// Custom roles: name → privileges. Built in: Administrator, PVEAuditor, NoAccess.
    #[serde(default)]
    pub roles: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub acl: Vec<AclEntry>,
    #[serde(default)]
    pub knobs: Knobs,
    /// datacenter.cfg `next-id: lower=…,upper=…`: the range `/cluster/nextid`
    /// picks from (default 100 up to, not including, 1000000).
    #[serde(default, rename = "next-id")]
    pub next_id: Option<NextId>,
    /// datacenter.cfg `user-tag-access`: which tags users without
    /// Sys.Modify on `/` may set (pve-cluster src/PVE/DataCenterConfig.pm).
    #[serde(default, rename = "user-tag-access")]
    pub user_tag_access: Option<TagAccess>,
    /// datacenter.cfg `registered-tags`: tags only Sys.Modify on `/` may set.
    #[serde(default, rename = "registered-tags")]
    pub registered_tags: Vec<String>,
    /// VMs managed by Proxmox's HA stack (`ha-manager add vm:<id>`).
    #[serde(default, rename = "ha-resources")]
    pub ha_resources: Vec<u32>,
}

/// datacenter.cfg `user-tag-access`, as GET /cluster/options returns it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TagAccess {
    /// `none`, `list`, `existing` or `free` (the default).
    #[serde(rename = "user-allow", default = "free")]
    pub user_allow: String,
    #[serde(rename = "user-allow-list", default)]
    pub user_allow_list: Vec<String>,
}

fn free() -> String {
    "free".into()
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NextId {
    pub lower: u32,
    pub upper: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    #[serde(default = "yes")]
    pub online: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StorageType {
    Lvmthin,
    Lvm,
    Zfspool,
    Dir,
    Nfs,
    Rbd,
}

impl StorageType {
    pub fn name(self) -> &'static str {
        match self {
            Self::Lvmthin => "lvmthin",
            Self::Lvm => "lvm",
            Self::Zfspool => "zfspool",
            Self::Dir => "dir",
            Self::Nfs => "nfs",
            Self::Rbd => "rbd",
        }
    }

    /// Types Proxmox always treats as shared.
    pub fn always_shared(self) -> bool {
        matches!(self, Self::Nfs | Self::Rbd)
    }

    pub fn file_based(self) -> bool {
        matches!(self, Self::Dir | Self::Nfs)
    }

    /// Allocation granularity in bytes: lvm2 rounds up to the extent size
    /// (4 MiB by default); zvols to 1 MiB (ZFSPoolPlugin.pm zfs_create_zvol);
    /// rbd to whole MiB (RBDPlugin.pm alloc_image: `int(($size + 1023) / 1024)`
    /// MiB of a KiB size); files are exact.
    pub fn round(self, bytes: u64) -> u64 {
        let unit = match self {
            Self::Lvmthin | Self::Lvm => 4 << 20,
            Self::Zfspool | Self::Rbd => 1 << 20,
            Self::Dir | Self::Nfs => 1,
        };
        bytes.div_ceil(unit) * unit
    }

    /// The size a grow to `bytes` (already 1 KiB padded) leaves, per plugin
    /// (volume_resize): lvm and lvmthin `lvextend` (extents), zfspool
    /// `volsize` aligned to 1 MiB, rbd `rbd resize --size <MiB>` on a
    /// stopped VM but QEMU's exact `block_resize` on a running one (the
    /// plugin returns early without krbd), files exact either way.
    pub fn resize_rounding(self, bytes: u64, running: bool) -> u64 {
        match self {
            Self::Rbd if running => bytes,
            _ => self.round(bytes),
        }
    }

    /// Whether VM snapshots cover volumes of this type (raw on dir/nfs do not).
    pub fn snapshots(self, format: &str) -> bool {
        match self {
            Self::Lvmthin | Self::Zfspool | Self::Rbd => true,
            Self::Dir | Self::Nfs => format == "qcow2",
            Self::Lvm => false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSpec {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: StorageType,
    #[serde(default = "default_content")]
    pub content: Vec<String>,
    #[serde(default)]
    pub shared: bool,
    /// Nodes the storage is enabled on; absent means all.
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    #[serde(default)]
    pub disable: bool,
    /// Capacity in bytes (per node for local storage).
    #[serde(default = "default_total")]
    pub total: u64,
    /// Default image format for file storages.
    #[serde(default)]
    pub format: Option<String>,
    /// LVM (thick) with `snapshot-as-volume-chain` (PVE 9): qcow2 volumes
    /// on LVs, qcow2 the default format.
    #[serde(default, rename = "snapshot-as-volume-chain")]
    pub snapshot_as_volume_chain: bool,
    /// The storage's server does not answer (an NFS server down): see
    /// `StorageSpec::online`.
    #[serde(default)]
    pub offline: bool,
    /// LVM (thick): zero a volume's extents when it is removed (pve-storage
    /// src/PVE/Storage/LVMPlugin.pm `saferemove`, default off).
    #[serde(default)]
    pub saferemove: bool,
    /// RBD through the kernel client (`krbd 1`): an activated image is
    /// mapped on the node that activated it until deactivated there (see
    /// `Cluster::rbd_mapped`).
    #[serde(default)]
    pub krbd: bool,
}

impl StorageSpec {
    /// Whether a removed volume's bytes stay for the next volume: thick LVM
    /// without `saferemove` (see `qmp::release_backing`).
    pub fn keeps_extents(&self) -> bool {
        self.kind == StorageType::Lvm && !self.saferemove
    }

    pub fn is_shared(&self) -> bool {
        self.shared || self.kind.always_shared()
    }

    /// Whether the storage can be activated. Only storages with a
    /// connection check can be "offline": NFS (pve-storage
    /// src/PVE/Storage/NFSPlugin.pm check_connection, `showmount` or
    /// `rpcinfo` against the server); the others' check always passes
    /// (Plugin.pm check_connection).
    pub fn online(&self) -> bool {
        !(self.offline && self.kind == StorageType::Nfs)
    }

    pub fn enabled_on(&self, node: &str) -> bool {
        !self.disable
            && self
                .nodes
                .as_ref()
                .is_none_or(|n| n.iter().any(|x| x == node))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    pub vmid: u32,
    pub node: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "yes")]
    pub running: bool,
    #[serde(default)]
    pub lock: Option<String>,
    /// Config keys (drives, scsihw, hotplug, smbios1, …), as Proxmox stores them.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Bind this VM to a QEMU QMP socket: disk changes then happen for real.
    #[serde(default)]
    pub qmp: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    pub volid: String,
    /// Node holding it, for local storage.
    #[serde(default)]
    pub node: Option<String>,
    pub size: u64,
    #[serde(default)]
    pub format: Option<String>,
    /// Unix seconds it was made (the content listing's `ctime`); default: now.
    #[serde(default)]
    pub ctime: Option<u64>,
}

fn default_cluster() -> String {
    "pvesim".into()
}

fn default_version() -> String {
    "9.0.3".into()
}

fn default_qemu_server() -> String {
    "9.2.6".into()
}

fn yes() -> bool {
    true
}

fn default_content() -> Vec<String> {
    vec!["images".into(), "rootdir".into()]
}

fn default_total() -> u64 {
    1 << 40
}

impl State {
    pub fn from_yaml(text: &str) -> Result<Self, serde_norway::Error> {
        serde_norway::from_str(text)
    }
}

/// A volume on a storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub size: u64,
    pub format: String,
    pub owner: u32,
    pub ctime: u64,
}

/// Where a volume lives: `(storage, node)`, with an empty node for shared storage.
pub type Place = (String, String);

#[derive(Debug, Clone, Default)]
pub struct Vm {
    pub vmid: u32,
    pub node: String,
    pub running: bool,
    pub config: BTreeMap<String, String>,
    pub pending: BTreeMap<String, String>,
    /// Keys to delete at the next apply; `true` when forced.
    pub pending_delete: BTreeMap<String, bool>,
    pub qmp: Option<String>,
    pub snapshots: BTreeMap<String, Snapshot>,
}

/// A VM snapshot: the drives it covers, as they were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub snaptime: u64,
    pub description: String,
    pub parent: Option<String>,
    pub disks: BTreeMap<String, String>,
}

impl Vm {
    pub fn lock(&self) -> Option<&str> {
        self.config.get("lock").map(String::as_str)
    }

    /// The config file as Proxmox writes it; its SHA-1 is the `digest`.
    pub fn raw(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.config {
            s.push_str(&format!("{k}: {v}\n"));
        }
        if !self.pending.is_empty() || !self.pending_delete.is_empty() {
            s.push_str("\n[PENDING]\n");
            if !self.pending_delete.is_empty() {
                let del: Vec<String> = self
                    .pending_delete
                    .iter()
                    .map(|(k, f)| if *f { format!("!{k}") } else { k.clone() })
                    .collect();
                s.push_str(&format!("delete: {}\n", del.join(",")));
            }
            for (k, v) in &self.pending {
                s.push_str(&format!("{k}: {v}\n"));
            }
        }
        s
    }

    pub fn digest(&self) -> String {
        use sha1::{Digest, Sha1};
        Sha1::digest(self.raw().as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn hotplug_disk(&self) -> bool {
        match self.config.get("hotplug").map(String::as_str) {
            None | Some("1") => true,
            Some("0") => false,
            Some(list) => list.split(',').any(|f| f == "disk"),
        }
    }

    pub fn name(&self) -> String {
        self.config
            .get("name")
            .cloned()
            .unwrap_or_else(|| format!("VM {}", self.vmid))
    }
}

/// The live cluster.
#[derive(Debug, Default)]
pub struct Cluster {
    pub name: String,
    pub version: String,
    pub qemu_server: String,
    pub nodes: BTreeMap<String, NodeSpec>,
    pub storages: BTreeMap<String, StorageSpec>,
    pub volumes: BTreeMap<Place, BTreeMap<String, Volume>>,
    pub vms: BTreeMap<u32, Vm>,
    pub users: Vec<User>,
    pub roles: BTreeMap<String, Vec<String>>,
    pub acl: Vec<AclEntry>,
    pub tasks: BTreeMap<String, Task>,
    pub knobs: Knobs,
    /// Calls served, by `METHOD template`.
    pub counters: BTreeMap<String, u64>,
    /// Faults taken since the start (or the last reset).
    pub faults: crate::knobs::Faults,
    pub replication: BTreeMap<String, ReplicationJob>,
    /// When each VM created through the API was created (its RRD lag).
    pub created: BTreeMap<u32, std::time::Instant>,
    pub next_id: Option<NextId>,
    /// The nodes a qcow2 volume of a thick LVM volume chain is active on,
    /// by volid: where it was allocated and where a VM took it (pve-storage
    /// LVMPlugin.pm alloc_image `lvcreate -aly`, activate_volume; nothing
    /// here deactivates). Elsewhere Proxmox cannot read its size (see
    /// `Cluster::lv_inactive`). A volume not in the map is active everywhere.
    pub lv_active: BTreeMap<String, std::collections::BTreeSet<String>>,
    pub user_tag_access: Option<TagAccess>,
    pub registered_tags: Vec<String>,
    /// The nodes each krbd image is mapped on, by volid. qemu-server maps
    /// (activates) an image where a VM takes it, creates it or resizes it,
    /// and unmaps only when a VM stops (vm_stop_cleanup) or the image is
    /// freed, on the freeing node alone: a hot-unplug leaves it mapped
    /// (pve-storage RBDPlugin.pm activate_volume/map_volume,
    /// deactivate_volume, free_image; qemu-server QemuServer.pm
    /// vmconfig_update_disk, vm_deviceunplug, vm_stop_cleanup).
    pub rbd_mapped: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// HA-managed VMs and their service state as `/cluster/resources`
    /// shows it (`hastate`: `started`, `stopped`, `migrate`, …; pve-ha-manager
    /// src/PVE/HA/Manager.pm).
    pub ha: BTreeMap<u32, String>,
}

/// A storage replication job (`/cluster/replication`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicationJob {
    pub guest: u32,
    pub jobnum: u32,
    pub target: String,
    pub source: Option<String>,
    pub schedule: Option<String>,
    pub rate: Option<f64>,
    pub comment: Option<String>,
    pub disable: bool,
    pub remove_job: Option<String>,
}

/// The owner VMID in a volume name: `vm-<vmid>-…`, `base-<vmid>-…`, or the
/// directory of a file-storage volume (`<vmid>/…`).
pub fn owner_of(volname: &str) -> Option<u32> {
    if let Some((dir, _)) = volname.split_once('/')
        && let Ok(v) = dir.parse()
    {
        return Some(v);
    }
    let rest = volname
        .strip_prefix("vm-")
        .or_else(|| volname.strip_prefix("base-"))?;
    rest.split('-').next()?.parse().ok()
}

impl Cluster {
    /// Whether the modelled qemu-server is `at` (major, minor, patch) or later.
    pub fn qemu_server_at_least(&self, at: (u32, u32, u32)) -> bool {
        let mut parts = self
            .qemu_server
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let have = (
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
        );
        have >= at
    }

    pub fn from_state(s: State) -> anyhow::Result<Self> {
        let mut c = Cluster {
            name: s.cluster,
            version: s.version,
            qemu_server: s.qemu_server,
            users: s.users,
            roles: s.roles,
            acl: s.acl,
            knobs: s.knobs,
            next_id: s.next_id,
            lv_active: BTreeMap::new(),
            user_tag_access: s.user_tag_access,
            registered_tags: s.registered_tags,
            ha: s
                .ha_resources
                .iter()
                .map(|id| (*id, String::new()))
                .collect(),
            ..Default::default()
        };
        for n in s.nodes {
            c.nodes.insert(n.name.clone(), n);
        }
        for st in s.storages {
            c.storages.insert(st.id.clone(), st);
        }
        for v in s.vms {
            if !c.nodes.contains_key(&v.node) {
                anyhow::bail!("VM {}: node {} is not in nodes", v.vmid, v.node);
            }
            let mut config = v.config;
            if let Some(name) = v.name {
                config.insert("name".into(), name);
            }
            if let Some(lock) = v.lock {
                config.insert("lock".into(), lock);
            }
            c.vms.insert(
                v.vmid,
                Vm {
                    vmid: v.vmid,
                    node: v.node,
                    running: v.running,
                    config,
                    qmp: v.qmp,
                    ..Default::default()
                },
            );
        }
        for (vmid, state) in c.ha.iter_mut() {
            let running = c.vms.get(vmid).is_some_and(|v| v.running);
            *state = if running { "started" } else { "stopped" }.into();
        }
        for vol in s.volumes {
            let (storage, volname) = vol
                .volid
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("volume {}: not <storage>:<name>", vol.volid))?;
            let place = c.place(storage, vol.node.as_deref().unwrap_or_default())?;
            let owner = owner_of(volname).unwrap_or(0);
            let format = vol.format.unwrap_or_else(|| format_of(volname));
            c.volumes.entry(place).or_default().insert(
                volname.to_string(),
                Volume {
                    size: vol.size,
                    format,
                    owner,
                    ctime: vol.ctime.unwrap_or_else(crate::clock::now),
                },
            );
        }
        Ok(c)
    }

    /// The place of a volume of `storage` seen from `node`.
    pub fn place(&self, storage: &str, node: &str) -> anyhow::Result<Place> {
        let st = self
            .storages
            .get(storage)
            .ok_or_else(|| anyhow::anyhow!("storage '{storage}' does not exist"))?;
        Ok((
            storage.to_string(),
            if st.is_shared() {
                String::new()
            } else {
                node.to_string()
            },
        ))
    }

    pub fn used(&self, place: &Place) -> u64 {
        self.volumes
            .get(place)
            .map(|m| m.values().map(|v| v.size).sum())
            .unwrap_or(0)
    }

    pub fn volume(&self, place: &Place, volname: &str) -> Option<&Volume> {
        self.volumes.get(place)?.get(volname)
    }

    /// Whether `storage:volname` is a qcow2 volume of a thick LVM volume
    /// chain that is not active on `node`: there its size is read from the
    /// qcow2 header of an LV that has no device node, which fails
    /// (LVMPlugin.pm volume_size_info → Plugin.pm file_size_info).
    pub fn lv_inactive(&self, storage: &str, volname: &str, node: &str) -> bool {
        self.storages
            .get(storage)
            .is_some_and(|s| s.kind == StorageType::Lvm)
            && volname.ends_with(".qcow2")
            && self
                .lv_active
                .get(&format!("{storage}:{volname}"))
                .is_some_and(|nodes| !nodes.contains(node))
    }

    /// Activates `storage:volname` on `node`: a qcow2 LV of a volume chain
    /// becomes active there, a krbd image mapped (a no-op for others).
    pub fn lv_activate(&mut self, storage: &str, volname: &str, node: &str) {
        let volid = format!("{storage}:{volname}");
        if let Some(nodes) = self.lv_active.get_mut(&volid) {
            nodes.insert(node.to_string());
        }
        if self.storages.get(storage).is_some_and(|s| s.krbd) {
            self.rbd_mapped
                .entry(volid)
                .or_default()
                .insert(node.to_string());
        }
    }

    /// A VM stopping on `node` unmaps the krbd images of its config
    /// (qemu-server QemuServer.pm vm_stop_cleanup → deactivate_volumes).
    pub fn vm_stopped(&mut self, vmid: u32) {
        let Some(vm) = self.vms.get(&vmid) else {
            return;
        };
        let node = vm.node.clone();
        let volids: Vec<String> = vm
            .config
            .values()
            .filter_map(|v| crate::drive::Drive::parse(v).ok())
            .filter_map(|d| d.volid().map(|(s, n)| format!("{s}:{n}")))
            .collect();
        for volid in volids {
            if let Some(nodes) = self.rbd_mapped.get_mut(&volid) {
                nodes.remove(&node);
            }
        }
    }

    pub fn count(&mut self, key: String) {
        *self.counters.entry(key).or_insert(0) += 1;
    }
}

pub fn format_of(volname: &str) -> String {
    if volname.ends_with(".qcow2") {
        "qcow2".into()
    } else if volname.ends_with(".vmdk") {
        "vmdk".into()
    } else {
        "raw".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_come_from_the_volume_name() {
        assert_eq!(owner_of("vm-9999-pvc-1"), Some(9999));
        assert_eq!(owner_of("9999/vm-9999-pvc-1.raw"), Some(9999));
        assert_eq!(owner_of("base-100-disk-0"), Some(100));
        assert_eq!(owner_of("pvc-1"), None);
    }

    #[test]
    fn sizes_round_like_the_storage_plugins() {
        assert_eq!(StorageType::Lvmthin.round(1), 4 << 20);
        assert_eq!(StorageType::Zfspool.round((1 << 20) + 1), 2 << 20);
        assert_eq!(StorageType::Dir.round(12345), 12345);
        assert_eq!(StorageType::Rbd.round((1 << 20) + 1), 2 << 20);
        assert_eq!(
            StorageType::Rbd.resize_rounding((1 << 30) + 1024, true),
            (1 << 30) + 1024
        );
        assert_eq!(
            StorageType::Rbd.resize_rounding((1 << 30) + 1024, false),
            (1 << 30) + (1 << 20)
        );
        assert_eq!(
            StorageType::Lvm.resize_rounding((1 << 30) + 1024, true),
            (1 << 30) + (4 << 20)
        );
    }
}
