//! The controller's operations, one module per concern; `csi/controller.rs`
//! only adapts them to the gRPC service.

mod capability;
mod capacity;
mod clone;
mod copy;
mod create;
mod delete;
mod expand;
mod get;
mod holder;
mod list;
mod modify;
mod node_ids;
mod publish;
mod replicate;
mod snapshot;
mod validate;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::attach::Attacher;
use crate::attachments::Attachments;
use crate::error::CtlError;
use crate::pve::api::StorageResource;
use crate::pve::{Client, Deadline};
use crate::vms::VmIndex;
use crate::volume::VolumeId;

pub use capability::check_capabilities;
pub use clone::VOLUME_TAG;
pub use copy::{drive_size, vm_name};
pub use holder::{DRIVER_TAGS, NewVm, OWNED as OWNED_VM_NOTE, TAG as CSI_TAG};
pub use replicate::REPLICATED_TAG;
pub use snapshot::{SNAPSHOT_TAG, SnapshotId, snapshot_class_warnings};

/// Shared state of the controller.
#[derive(Debug)]
pub struct Controller {
    pub clients: HashMap<String, Arc<Client>>,
    pub controller_vmid: u32,
    /// Where the controller's own VMs take their VMIDs.
    pub vmid_range: crate::config::VmidRange,
    /// VMIDs handed to a create lately, kept from the next one while
    /// Proxmox may not list them yet, and taken again by the next create of
    /// a VM whose create lost its answer.
    recent_vmids: holder::RecentVmids,
    /// Serialises finding or making each node's holder VM.
    holder_locks: holder::HolderLocks,
    pub vms: Arc<VmIndex>,
    pub attacher: Arc<Attacher>,
    /// Which volume is attached to which VM, as the controller last saw it.
    pub attachments: Arc<Attachments>,
    imports: copy::Imports,
    /// The copies CreateVolume is waiting for: events on their claims.
    pub progress: crate::progress::Progress,
    /// Per region: the storage rows, and until when they are trusted.
    storages: Mutex<HashMap<String, (std::time::Instant, Vec<StorageResource>)>>,
    /// Deadline of a call when the caller set none.
    pub default_timeout: Duration,
    /// How long one operation retries Proxmox (`OPERATION_LIMIT`).
    pub operation_limit: Duration,
    /// The Kubernetes API, when reachable: node → VM by providerID,
    /// `lifecycle: keep`, VolumeAttributesClasses.
    pub kube: Option<crate::kube::Kube>,
    pub driver_name: String,
    /// The CSI node id each VM was last published to, as the caller gave it
    /// (NodeGetInfo's id): ListVolumes and ControllerGetVolume report it,
    /// so the external-attacher's reconcile finds its VolumeAttachments.
    node_ids: node_ids::Published,
    /// The Proxmox node each volume was last attached on or detached from,
    /// by `region/volid`: a krbd image stays mapped there (see `delete`).
    last_held: std::sync::Mutex<HashMap<String, String>>,
    /// `UNSAFEMOUNT=true`: attach without a `backup` option, so Proxmox's
    /// default (backup=1) applies, as the Go driver does with that variable
    /// (pkg/csi/controller.go ControllerPublishVolume).
    pub unsafe_mount: bool,
    /// Written into the names of the disks CreateVolume makes, so that a
    /// disk's cluster is known from Proxmox alone (`volume::ClusterId`).
    pub cluster_id: Option<crate::volume::ClusterId>,
}

/// How long one operation retries Proxmox before it answers: the sidecars'
/// timeout (the chart's `timeout`). The provisioner's is longer, for
/// CreateVolume to wait for a copy (`progress`); every call (the
/// provisioner's DeleteVolume and GetCapacity too) and every step of a
/// copy stays within this, so that an unreachable Proxmox is reported as
/// soon as before.
pub const OPERATION_LIMIT: Duration = Duration::from_secs(180);

/// 512 MiB: the Go driver's size step.
pub const CHUNK: u64 = 512 << 20;
pub const DEFAULT_SIZE: u64 = 10 << 30;
const STORAGE_CACHE: Duration = Duration::from_secs(30);
/// A view with a node offline or a storage not available is read again
/// soon: the node's return must not wait for the whole cache period.
const DEGRADED_STORAGE_CACHE: Duration = Duration::from_secs(2);

impl Controller {
    /// Records that `volid` was held on `node` (attached or detached there).
    pub fn held_on(&self, region: &str, volid: &str, node: &str) {
        if let Ok(mut m) = self.last_held.lock() {
            m.insert(format!("{region}/{volid}"), node.to_string());
        }
    }

    /// The node `volid` was last attached on or detached from, if known.
    pub fn last_held(&self, region: &str, volid: &str) -> Option<String> {
        self.last_held
            .lock()
            .ok()
            .and_then(|m| m.get(&format!("{region}/{volid}")).cloned())
    }

    pub fn new(clients: Vec<Arc<Client>>, controller_vmid: u32, default_timeout: Duration) -> Self {
        let vms = Arc::new(VmIndex::default());
        let attachments = Arc::new(Attachments::default());
        Self {
            clients: clients
                .into_iter()
                .map(|c| (c.region().to_string(), c))
                .collect(),
            controller_vmid,
            vmid_range: crate::config::VmidRange::above(controller_vmid),
            recent_vmids: holder::RecentVmids::default(),
            holder_locks: holder::HolderLocks::default(),
            vms: vms.clone(),
            attacher: Arc::new(Attacher::new(vms, attachments.clone())),
            attachments,
            imports: copy::Imports::default(),
            progress: Default::default(),
            storages: Mutex::new(HashMap::new()),
            default_timeout,
            operation_limit: OPERATION_LIMIT,
            kube: None,
            driver_name: proxmox_csi_common::contract::DRIVER_NAME.into(),
            node_ids: node_ids::Published::default(),
            last_held: Default::default(),
            unsafe_mount: false,
            cluster_id: None,
        }
    }

    /// A controller with one Proxmox client per cluster of `config` (each
    /// call given `api_timeout`), taking VMIDs as `config` says.
    pub fn from_config(
        config: &crate::config::CloudConfig,
        api_timeout: Duration,
        metrics: crate::pve::metrics::ApiMetrics,
        default_timeout: Duration,
    ) -> Result<Self, crate::pve::PveError> {
        let clients = config
            .clusters
            .iter()
            .cloned()
            .map(|c| Client::new(c, api_timeout, metrics.clone()).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let mut controller = Controller::new(clients, config.controller_vmid, default_timeout);
        controller.vmid_range = config.vmid_range;
        Ok(controller)
    }

    /// The regions this controller serves.
    pub fn regions(&self) -> Vec<&str> {
        let mut r: Vec<&str> = self.clients.keys().map(String::as_str).collect();
        r.sort();
        r
    }

    pub fn with_kube(mut self, kube: crate::kube::Kube, driver_name: &str) -> Self {
        self.kube = Some(kube);
        self.driver_name = driver_name.to_string();
        self
    }

    pub fn client(&self, region: &str) -> Result<Arc<Client>, CtlError> {
        self.clients.get(region).cloned().ok_or_else(|| {
            let mut known: Vec<&String> = self.clients.keys().collect();
            known.sort();
            CtlError::invalid(
                "region",
                format!("{region:?} is not a cluster of the cloud config; configured: {known:?}"),
            )
        })
    }

    /// The client of the region a volume or snapshot id names. An id is
    /// only ever issued for a configured region, so an unknown one names
    /// nothing: NOT_FOUND, as for any other object that does not exist.
    pub fn client_of(&self, what: &str, raw: &str, region: &str) -> Result<Arc<Client>, CtlError> {
        self.clients
            .get(region)
            .cloned()
            .ok_or_else(|| CtlError::NotFound(format!("{what} {raw} does not exist: region {region:?} is not a cluster of the cloud config")))
    }

    /// Rows of `/cluster/resources?type=storage` for `storage`, cached
    /// briefly. A storage row's `available` comes from RRD data pmxcfs keeps
    /// for 5 minutes after its node stopped sending it (pve-manager
    /// PVE/API2Tools.pm extract_storage_stats; pve-cluster pmxcfs status.c
    /// rrd_entry_is_old), while a node's own row follows the cluster
    /// membership at once (extract_node_stats): the storages of a node that
    /// is not online are taken as `unknown`, so that nothing is sent there.
    /// Whether `storage` is thick LVM (`lvm`), from the cached rows.
    pub async fn is_thick_lvm(
        &self,
        client: &Client,
        storage: &str,
        d: Deadline,
    ) -> Result<bool, CtlError> {
        Ok(self
            .storage_rows(client, storage, d)
            .await?
            .first()
            .is_some_and(|r| r.plugintype == "lvm"))
    }

    /// A qcow2 volume of a thick LVM volume chain is refused as the source
    /// of a snapshot or clone: Proxmox reads its size, before any copy,
    /// only on the node where its LV is active (qemu-server API2/Qemu.pm
    /// `$import_from_volid`; pve-storage LVMPlugin.pm volume_size_info),
    /// and the Go driver refuses qcow2 copies altogether
    /// (proxmox-csi-plugin pkg/csi/utils.go copyVolume).
    pub async fn refuse_chain_source(
        &self,
        client: &Client,
        what: &str,
        storage: &str,
        disk: &str,
        d: Deadline,
    ) -> Result<(), CtlError> {
        if disk.ends_with(".qcow2") && self.is_thick_lvm(client, storage, d).await? {
            return Err(CtlError::FailedPrecondition(format!(
                "{what} {storage}:{disk} is a qcow2 volume on thick LVM (a volume chain): Proxmox reads \
                 its size only on the node where it is active, so it is not copied into snapshots or \
                 clones; volumes of a class without storageFormat: qcow2 (raw) are"
            )));
        }
        Ok(())
    }

    pub async fn storage_rows(
        &self,
        client: &Client,
        storage: &str,
        d: Deadline,
    ) -> Result<Vec<StorageResource>, CtlError> {
        let mut cache = self.storages.lock().await;
        let fresh = cache
            .get(client.region())
            .is_some_and(|(until, _)| std::time::Instant::now() < *until);
        if !fresh {
            let mut rows = client.storages(d).await?;
            let offline = client.offline_nodes(d).await?;
            for r in rows.iter_mut().filter(|r| offline.contains(&r.node)) {
                r.status = "unknown".into();
            }
            let trust = if rows.iter().all(|r| r.status == "available") {
                STORAGE_CACHE
            } else {
                DEGRADED_STORAGE_CACHE
            };
            cache.insert(
                client.region().to_string(),
                (std::time::Instant::now() + trust, rows),
            );
        }
        Ok(cache
            .get(client.region())
            .map(|(_, rows)| {
                rows.iter()
                    .filter(|r| r.storage == storage)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }
}

/// A volume id from a request. An empty one is a malformed request; one
/// this driver could never have issued names no volume (NOT_FOUND, the
/// spec's answer for a volume that does not exist).
pub fn volume_ref(field: &str, raw: &str) -> Result<VolumeId, CtlError> {
    if raw.is_empty() {
        return Err(CtlError::invalid(field, "is required"));
    }
    VolumeId::parse(raw).map_err(|source| CtlError::UnknownHandle {
        what: "volume",
        raw: raw.to_string(),
        source,
    })
}

/// A snapshot id from a request, as `volume_ref`.
pub fn snapshot_ref(field: &str, raw: &str) -> Result<SnapshotId, CtlError> {
    if raw.is_empty() {
        return Err(CtlError::invalid(field, "is required"));
    }
    SnapshotId::parse(raw).map_err(|source| CtlError::UnknownHandle {
        what: "snapshot",
        raw: raw.to_string(),
        source,
    })
}

/// The deadline of a call: the caller's `grpc-timeout`, else the default.
pub fn deadline<T>(req: &tonic::Request<T>, default: Duration) -> Deadline {
    let t = req
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .unwrap_or(default);
    Deadline::after(t)
}

fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(
            parse_grpc_timeout("14999m"),
            Some(Duration::from_millis(14999))
        );
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("x"), None);
    }
}
