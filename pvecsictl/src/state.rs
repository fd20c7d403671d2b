//! What both commands read: every region's VMs with their configs and
//! pending changes, storages and CSI disks from Proxmox, and the driver's
//! PersistentVolumes, classes and the Nodes from Kubernetes. Read once, then
//! judged.

use proxmox_csi_common::contract::{TOPOLOGY_REGION, TOPOLOGY_ZONE};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment, VolumeAttributesClass};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use proxmox_csi_controller::drive::DriveLine;
use proxmox_csi_controller::pve::api::{StorageResource, VmResource};
use proxmox_csi_controller::pve::{Client, Deadline};
use proxmox_csi_controller::volume::ClusterId;
use proxmox_csi_controller::warnings::ClassKind;
use reqwest::Method;
use serde_json::Value;

/// A disk in a storage.
#[derive(Debug, Clone)]
pub struct Disk {
    pub region: String,
    pub node: String,
    pub volid: String,
    pub size: u64,
    /// Unix seconds, when the storage says.
    pub ctime: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Vm {
    pub region: String,
    pub res: VmResource,
    pub config: BTreeMap<String, String>,
    /// Keys with a change not applied yet.
    pub pending: Vec<String>,
    /// The values of those changes.
    pub pending_values: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct KubeNode {
    pub name: String,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub provider_id: Option<String>,
    pub instance_id: Option<String>,
}

/// A StorageClass, VolumeAttributesClass or VolumeSnapshotClass of the driver.
#[derive(Debug, Clone)]
pub struct Class {
    pub kind: ClassKind,
    pub name: String,
    pub parameters: HashMap<String, String>,
}

/// A list that a cluster without the resource (no snapshot CRDs, an older
/// Kubernetes) answers 404 for: nothing of it.
fn absent_is_empty<T>(r: kube::Result<Vec<T>>, what: &str) -> Result<Vec<T>> {
    match r {
        Ok(v) => Ok(v),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("Kubernetes: listing {what}")),
    }
}

#[derive(Debug)]
pub struct State {
    pub controller_vmid: u32,
    pub driver: String,
    pub regions: Vec<String>,
    pub vms: Vec<Vm>,
    pub storages: Vec<(String, StorageResource)>,
    /// Thick LVM storages by region and whether they zero removed volumes
    /// (`saferemove`); `None` where the storage's config could not be read.
    pub thick_lvm: Vec<(String, String, Option<bool>)>,
    pub disks: Vec<Disk>,
    /// Volume handles of the driver's PersistentVolumes.
    pub handles: BTreeSet<String>,
    /// Volume handles of every CSI PersistentVolume, whatever its driver: a
    /// second install of this driver under another name uses the same disks'
    /// names and cluster id.
    pub all_handles: BTreeSet<String>,
    pub nodes: Vec<KubeNode>,
    pub classes: Vec<Class>,
    /// Privileges of the token on `/`, per region.
    pub privileges: BTreeMap<String, BTreeSet<String>>,
    /// The datacenter's tag policy as the token sees it, per region.
    pub tag_policy: BTreeMap<String, TagPolicy>,
    /// Snapshot handles of every VolumeSnapshotContent.
    pub snapshot_handles: BTreeSet<String>,
    /// Every VolumeAttachment.
    pub attachments: Vec<Attachment>,
    /// The Kubernetes cluster's own id (`kube::cluster_id`), when it has one.
    pub cluster_id: Option<ClusterId>,
    /// The Proxmox VE version each region's cluster reports (`GET /version`).
    pub proxmox_versions: BTreeMap<String, String>,
    /// The Kubernetes API server's version (`/version`): major, minor as
    /// served (`34`, or `34+` on some distributions) and gitVersion.
    pub kubernetes_version: Option<(String, String, String)>,
}

/// datacenter.cfg's tag policy (pve-cluster src/PVE/DataCenterConfig.pm
/// `user-tag-access`, `registered-tags`) and the tags the token may set now
/// (`allowed-tags`, pve-guest-common GuestHelpers.pm get_allowed_tags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TagPolicy {
    /// `user-allow` (`none`, `list`, `existing`, `free`); `None` when the
    /// token cannot read the options (Sys.Audit on `/`).
    pub user_allow: Option<String>,
    pub allow_list: Vec<String>,
    pub registered: Vec<String>,
    pub allowed: Vec<String>,
}

impl TagPolicy {
    /// From GET /cluster/options; `audit`: the token holds Sys.Audit on
    /// `/`, so the answer holds every option set.
    pub fn from_options(v: &Value, audit: bool) -> Self {
        let list = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        let access = v.get("user-tag-access");
        Self {
            user_allow: access
                .and_then(|a| a.get("user-allow"))
                .and_then(Value::as_str)
                .map(String::from)
                // Unset is `free` (DataCenterConfig.pm `default => 'free'`).
                .or_else(|| audit.then(|| "free".to_string())),
            allow_list: list(access.and_then(|a| a.get("user-allow-list"))),
            registered: list(v.get("registered-tags")),
            allowed: list(v.get("allowed-tags")),
        }
    }
}

/// A VolumeAttachment (of any driver): the PV it names, or the handle of an
/// inline (migrated) volume.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub name: String,
    pub pv: Option<String>,
    pub handle: Option<String>,
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl State {
    pub async fn read(
        clients: &[Arc<Client>],
        kube: &kube::Client,
        controller_vmid: u32,
        driver: &str,
    ) -> Result<Self> {
        let d = || Deadline::after(std::time::Duration::from_secs(60));
        let mut s = State {
            controller_vmid,
            driver: driver.to_string(),
            regions: clients.iter().map(|c| c.region().to_string()).collect(),
            vms: Vec::new(),
            storages: Vec::new(),
            thick_lvm: Vec::new(),
            disks: Vec::new(),
            handles: BTreeSet::new(),
            all_handles: BTreeSet::new(),
            nodes: Vec::new(),
            classes: Vec::new(),
            privileges: BTreeMap::new(),
            tag_policy: BTreeMap::new(),
            snapshot_handles: BTreeSet::new(),
            attachments: Vec::new(),
            cluster_id: None,
            proxmox_versions: BTreeMap::new(),
            kubernetes_version: None,
        };
        for c in clients {
            let region = c.region().to_string();
            let version = c
                .version()
                .await
                .with_context(|| format!("region {region}: GET /version"))?;
            s.proxmox_versions.insert(region.clone(), version.version);
            for res in c
                .vms(d())
                .await
                .with_context(|| format!("region {region}: listing VMs"))?
            {
                let config = c.vm_config(&res.node, res.vmid, d()).await?.values;
                let items = c.vm_pending(&res.node, res.vmid, d()).await?;
                let pending_values = items
                    .iter()
                    .filter_map(|p| p.pending.as_ref().map(text))
                    .collect();
                let pending = items
                    .into_iter()
                    .filter(|p| p.pending.is_some() || p.delete.is_some())
                    .map(|p| p.key)
                    .collect();
                s.vms.push(Vm {
                    region: region.clone(),
                    res,
                    config,
                    pending,
                    pending_values,
                });
            }
            let mut shared_seen = BTreeSet::new();
            for row in c.storages(d()).await? {
                s.storages.push((region.clone(), row.clone()));
                if row.plugintype == "lvm"
                    && !s
                        .thick_lvm
                        .iter()
                        .any(|(r, id, _)| *r == region && *id == row.storage)
                {
                    let safe = c
                        .storage_config(&row.storage, d())
                        .await
                        .ok()
                        .map(|cfg| cfg.saferemove == Some(1));
                    s.thick_lvm
                        .push((region.clone(), row.storage.clone(), safe));
                }
                if row.status != "available"
                    || (row.shared == 1 && !shared_seen.insert(row.storage.clone()))
                {
                    continue;
                }
                let content: Vec<Value> = c
                    .call(
                        Method::GET,
                        &format!("/nodes/{}/storage/{}/content", row.node, row.storage),
                        &[("content", "images".into())],
                        d(),
                    )
                    .await?;
                for v in content {
                    s.disks.push(Disk {
                        region: region.clone(),
                        node: row.node.clone(),
                        volid: text(&v["volid"]),
                        size: v["size"].as_u64().unwrap_or(0),
                        ctime: v["ctime"].as_i64(),
                    });
                }
            }
            let perms: BTreeMap<String, BTreeMap<String, Value>> = c
                .call(
                    Method::GET,
                    "/access/permissions",
                    &[("path", "/".into())],
                    d(),
                )
                .await
                .unwrap_or_default();
            s.privileges.insert(
                region.clone(),
                perms
                    .get("/")
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default(),
            );
            // pve-manager PVE/API2/Cluster.pm get_options: the datacenter.cfg
            // options with Sys.Audit on `/`, `allowed-tags` for anyone.
            let options: Value = c
                .call(Method::GET, "/cluster/options", &[], d())
                .await
                .unwrap_or_default();
            let audit = s
                .privileges
                .get(&region)
                .is_some_and(|p| p.contains("Sys.Audit"));
            s.tag_policy
                .insert(region, TagPolicy::from_options(&options, audit));
        }
        s.kubernetes_version = kube
            .apiserver_version()
            .await
            .ok()
            .map(|v| (v.major, v.minor, v.git_version));
        let pvs: Api<PersistentVolume> = Api::all(kube.clone());
        for pv in pvs
            .list(&ListParams::default())
            .await
            .context("Kubernetes: listing PersistentVolumes")?
        {
            if let Some(csi) = pv.spec.and_then(|s| s.csi) {
                if csi.driver == driver {
                    s.handles.insert(csi.volume_handle.clone());
                }
                s.all_handles.insert(csi.volume_handle);
            }
        }
        let nodes: Api<Node> = Api::all(kube.clone());
        for n in nodes
            .list(&ListParams::default())
            .await
            .context("Kubernetes: listing Nodes")?
        {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            let annotations = n.metadata.annotations.clone().unwrap_or_default();
            s.nodes.push(KubeNode {
                name: n.metadata.name.clone().unwrap_or_default(),
                region: labels.get(TOPOLOGY_REGION).cloned(),
                zone: labels.get(TOPOLOGY_ZONE).cloned(),
                provider_id: n.spec.and_then(|sp| sp.provider_id),
                instance_id: annotations.get("proxmox.sinextra.dev/instance-id").cloned(),
            });
        }
        s.classes = read_classes(kube, driver).await?;
        // Every driver's: a second install of this one under another name.
        s.snapshot_handles = read_snapshot_handles(kube).await?;
        s.attachments = read_attachments(kube).await?;
        s.cluster_id = match proxmox_csi_controller::kube::cluster_id(kube).await {
            Ok(id) => id,
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => return Err(e).context("Kubernetes: reading namespace kube-system"),
        };
        Ok(s)
    }

    /// The VM of a Kubernetes node: providerID `proxmox://region/vmid`, the
    /// instance-id annotation, else a VM named like the node.
    pub fn vm_of(&self, n: &KubeNode) -> Option<&Vm> {
        let by_id = n
            .provider_id
            .as_deref()
            .and_then(|p| p.strip_prefix("proxmox://"))
            .and_then(|p| p.rsplit('/').next())
            .or(n.instance_id.as_deref())
            .and_then(|v| v.parse::<u32>().ok());
        match by_id {
            Some(vmid) => self.vms.iter().find(|v| v.res.vmid == vmid),
            None => self
                .vms
                .iter()
                .find(|v| v.res.name.as_deref() == Some(n.name.as_str())),
        }
    }

    /// The VMs whose config refers to a volume under any key (a disk slot,
    /// `unusedN`, `efidisk0`, …, `file=` spelled or not), applied or pending:
    /// deleting it would break the VM or leave the entry dangling.
    pub fn attached_to(&self, volid: &str) -> Vec<u32> {
        let names = |line: &str| DriveLine::parse(line).volume == volid;
        self.vms
            .iter()
            .filter(|v| {
                v.config.values().any(|l| names(l)) || v.pending_values.iter().any(|l| names(l))
            })
            .map(|v| v.res.vmid)
            .collect()
    }
}

/// The driver's classes, whose parameters `doctor` judges.
async fn read_classes(kube: &kube::Client, driver: &str) -> Result<Vec<Class>> {
    let lp = ListParams::default();
    let mut out = Vec::new();
    let scs: Api<StorageClass> = Api::all(kube.clone());
    let scs = absent_is_empty(scs.list(&lp).await.map(|l| l.items), "StorageClasses")?;
    for sc in scs.into_iter().filter(|sc| sc.provisioner == driver) {
        out.push(Class {
            kind: ClassKind::StorageClass,
            name: sc.metadata.name.unwrap_or_default(),
            parameters: sc.parameters.unwrap_or_default().into_iter().collect(),
        });
    }
    let vacs: Api<VolumeAttributesClass> = Api::all(kube.clone());
    let vacs = absent_is_empty(
        vacs.list(&lp).await.map(|l| l.items),
        "VolumeAttributesClasses",
    )?;
    for vac in vacs.into_iter().filter(|v| v.driver_name == driver) {
        out.push(Class {
            kind: ClassKind::VolumeAttributesClass,
            name: vac.metadata.name.unwrap_or_default(),
            parameters: vac.parameters.unwrap_or_default().into_iter().collect(),
        });
    }
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass");
    let vscs: Api<DynamicObject> = Api::all_with(kube.clone(), &ApiResource::from_gvk(&gvk));
    let vscs = absent_is_empty(
        vscs.list(&lp).await.map(|l| l.items),
        "VolumeSnapshotClasses",
    )?;
    for vsc in vscs
        .into_iter()
        .filter(|v| v.data["driver"].as_str() == Some(driver))
    {
        let parameters = vsc.data["parameters"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_str().map_or_else(|| v.to_string(), String::from),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Class {
            kind: ClassKind::VolumeSnapshotClass,
            name: vsc.metadata.name.unwrap_or_default(),
            parameters,
        });
    }
    Ok(out)
}

/// The handles of every VolumeSnapshotContent: the one it was made
/// with (`status.snapshotHandle`) and a pre-provisioned one
/// (`spec.source.snapshotHandle`).
async fn read_snapshot_handles(kube: &kube::Client) -> Result<BTreeSet<String>> {
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent");
    let api: Api<DynamicObject> = Api::all_with(kube.clone(), &ApiResource::from_gvk(&gvk));
    let contents = absent_is_empty(
        api.list(&ListParams::default()).await.map(|l| l.items),
        "VolumeSnapshotContents",
    )?;
    Ok(contents
        .iter()
        .flat_map(|c| {
            [
                c.data["status"]["snapshotHandle"].as_str(),
                c.data["spec"]["source"]["snapshotHandle"].as_str(),
            ]
        })
        .flatten()
        .map(String::from)
        .collect())
}

async fn read_attachments(kube: &kube::Client) -> Result<Vec<Attachment>> {
    let api: Api<VolumeAttachment> = Api::all(kube.clone());
    let all = absent_is_empty(
        api.list(&ListParams::default()).await.map(|l| l.items),
        "VolumeAttachments",
    )?;
    Ok(all
        .into_iter()
        .map(|va| Attachment {
            name: va.metadata.name.unwrap_or_default(),
            pv: va.spec.source.persistent_volume_name,
            handle: va
                .spec
                .source
                .inline_volume_spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle),
        })
        .collect())
}
