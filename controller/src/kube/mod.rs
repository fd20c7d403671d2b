//! What the controller reads from Kubernetes: a Node's VM (providerID, the
//! instance-id annotation), a PersistentVolume's `lifecycle: keep`
//! annotation and VolumeAttributesClass. It writes only events, on a claim
//! whose copy it is waiting for (`progress`).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Event, EventSource, Namespace, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};

use crate::error::CtlError;

mod watch;
pub use watch::Watched;

/// The source of the events the controller posts (`kubectl describe`'s "From").
pub const COMPONENT: &str = "proxmox-csi-controller";

pub const INSTANCE_ID: &str = "proxmox.sinextra.dev/instance-id";
pub const LIFECYCLE: &str = "csi.proxmox.sinextra.dev/lifecycle";

#[derive(Clone)]
pub struct Kube {
    client: kube::Client,
    /// The VolumeAttributesClass version the API server serves, found once.
    vac_version: std::sync::Arc<tokio::sync::OnceCell<&'static str>>,
    /// Watch caches of PersistentVolumes, Nodes and CSINodes.
    watched: Option<Watched>,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kube")
    }
}

/// A PersistentVolume of this driver, as far as the controller cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvFacts {
    pub name: String,
    pub keep: bool,
    pub attributes_class: Option<String>,
}

fn unavailable(what: &str, e: kube::Error) -> CtlError {
    CtlError::Kubernetes {
        what: what.to_string(),
        source: e,
    }
}

/// How a Kubernetes node names its VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeVm {
    Id(u32),
    /// `status.nodeInfo.systemUUID`, lower-case.
    SystemUuid(String),
}

/// A Node as the controller needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub vm: Option<NodeVm>,
    /// The max-volume-attachments label, when set to a valid count.
    pub max_volumes: Option<i64>,
}

/// The VM id in `proxmox://<region>/<vmid>` (or a bare VM id).
pub fn vmid_from_provider_id(v: &str) -> Option<u32> {
    let rest = v
        .strip_prefix("proxmox://")
        .map(|r| r.rsplit('/').next().unwrap_or_default())
        .unwrap_or(v);
    rest.parse().ok().filter(|id| *id >= 100)
}

/// The default cluster id (`ClusterId::from_namespace_uid`) of the cluster
/// `client` talks to; `Ok(None)` when `kube-system` has no UID.
pub async fn cluster_id(
    client: &kube::Client,
) -> Result<Option<crate::volume::ClusterId>, kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = namespaces.get("kube-system").await?;
    Ok(ns
        .metadata
        .uid
        .as_deref()
        .and_then(crate::volume::ClusterId::from_namespace_uid))
}

impl Kube {
    /// A client that watches PersistentVolumes, Nodes and CSINodes (needs a
    /// Tokio runtime).
    pub fn new(client: kube::Client) -> Self {
        let watched = Some(Watched::start(&client));
        Self {
            client,
            vac_version: Default::default(),
            watched,
        }
    }

    /// A client that reads every object from the API when it needs it, as
    /// the controller did before its watch caches (for comparison).
    pub fn unwatched(client: kube::Client) -> Self {
        Self {
            client,
            vac_version: Default::default(),
            watched: None,
        }
    }

    /// The watch caches, when this client keeps them.
    pub fn watched(&self) -> Option<&Watched> {
        self.watched.as_ref()
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The UID of the claim `namespace/name`; `None` when there is no such claim.
    pub async fn claim_uid(&self, namespace: &str, name: &str) -> Result<Option<String>, CtlError> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let pvc = claims.get_opt(name).await.map_err(|e| {
            unavailable(
                &format!("reading PersistentVolumeClaim {namespace}/{name}"),
                e,
            )
        })?;
        Ok(pvc.map(|p| p.metadata.uid.unwrap_or_default()))
    }

    /// Whether a PersistentVolume named `name` exists.
    pub async fn pv_exists(&self, name: &str) -> Result<bool, CtlError> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        Ok(pvs
            .get_opt(name)
            .await
            .map_err(|e| unavailable(&format!("reading PersistentVolume {name}"), e))?
            .is_some())
    }

    /// Posts a Normal event on the claim `namespace/name` (of UID `uid`, which `kubectl
    /// describe` selects events by), shaped as client-go's recorder makes
    /// one (tools/record/event.go makeEvent: named `<object>.<hex nanos>`,
    /// in the object's namespace, count 1).
    pub async fn claim_event(
        &self,
        (namespace, name): (&str, &str),
        uid: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), CtlError> {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let nanos = now.0.as_nanosecond();
        let event = Event {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}.{nanos:x}")),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                uid: Some(uid.to_string()).filter(|u| !u.is_empty()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Normal".into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: None,
            }),
            reporting_component: Some(COMPONENT.into()),
            ..Default::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        events
            .create(&Default::default(), &event)
            .await
            .map_err(|e| unavailable(&format!("posting a {reason} event"), e))?;
        Ok(())
    }

    /// What a Kubernetes node says about its VM: `spec.providerID`, then the
    /// instance-id annotation, then its SMBIOS system UUID (matched against
    /// the VMs' `smbios1: uuid=…`). `Ok(None)`: the node is gone or says nothing.
    pub async fn node_vm(&self, name: &str) -> Result<Option<NodeVm>, CtlError> {
        Ok(self.node(name).await?.and_then(|n| n.vm))
    }

    /// What the controller reads from one Node, in one GET: its VM (see
    /// `node_vm`) and its max-volume-attachments label. `Ok(None)`: gone.
    /// From the Node cache; a node it has not seen (one that just joined)
    /// is read from the API.
    pub async fn node(&self, name: &str) -> Result<Option<NodeFacts>, CtlError> {
        if let Some(node) = self.watched.as_ref().and_then(|w| w.node(name)) {
            return Ok(Some(node_facts(&node)));
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get_opt(name)
            .await
            .map_err(|e| unavailable(&format!("reading Node {name}"), e))?;
        Ok(node.as_ref().map(node_facts))
    }

    /// The node ids this driver registered in CSINode objects: what the
    /// external-attacher publishes to and compares ListVolumes with
    /// (pkg/controller/util.go GetNodeIDFromCSINode).
    /// From the CSINode cache: kubelet registers a node once, and the
    /// attacher's next reconcile sees a late one.
    pub async fn csi_node_ids(&self, driver: &str) -> Result<Vec<String>, CtlError> {
        let ids = |nodes: &mut dyn Iterator<Item = &CSINode>| -> Vec<String> {
            nodes
                .flat_map(|n| &n.spec.drivers)
                .filter(|d| d.name == driver)
                .map(|d| d.node_id.clone())
                .collect()
        };
        if let Some(cached) = self.watched.as_ref().and_then(Watched::csinodes) {
            return Ok(ids(&mut cached.iter().map(|n| &**n)));
        }
        let nodes: Api<CSINode> = Api::all(self.client.clone());
        let list = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing CSINodes", e))?;
        Ok(ids(&mut list.items.iter()))
    }

    /// `driver`'s PersistentVolumes with volume handle `handle`, and whether
    /// they were read from the API just now: from the cache when it holds
    /// one (a volume's PersistentVolume outlives its attachments and its
    /// delete), else listed (no cache yet, or a volume so new that the
    /// watch has not brought it, or none at all).
    async fn pvs_of_handle(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<(Vec<PersistentVolume>, bool), CtlError> {
        let ours = |pv: &PersistentVolume| {
            pv.spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .is_some_and(|c| c.driver == driver && c.volume_handle == handle)
        };
        if let Some(cached) = self.watched.as_ref().and_then(Watched::pvs) {
            let found: Vec<PersistentVolume> = cached
                .iter()
                .filter(|pv| ours(pv))
                .map(|pv| (**pv).clone())
                .collect();
            if !found.is_empty() {
                return Ok((found, false));
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let list = pvs
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing PersistentVolumes", e))?;
        Ok((list.items.into_iter().filter(|pv| ours(pv)).collect(), true))
    }

    /// The PersistentVolume whose CSI volume handle is `handle`, as the
    /// cache has it: a publish applies the class it names, and a class set
    /// a moment ago applies at the next attach.
    pub async fn pv_for_handle(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<Option<PvFacts>, CtlError> {
        let (found, _) = self.pvs_of_handle(driver, handle).await?;
        Ok(found.first().map(pv_facts))
    }

    /// The same, read from the API now: a delete keeps the disk of a volume
    /// annotated `lifecycle: keep`, however recently.
    pub async fn pv_for_handle_now(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<Option<PvFacts>, CtlError> {
        let (found, fresh) = self.pvs_of_handle(driver, handle).await?;
        let Some(pv) = found.into_iter().next() else {
            return Ok(None);
        };
        if fresh {
            return Ok(Some(pv_facts(&pv)));
        }
        let Some(name) = pv.metadata.name else {
            return Ok(None);
        };
        Ok(self.pv_now(&name).await?.as_ref().map(pv_facts))
    }

    /// PersistentVolume `name`, read from the API now.
    async fn pv_now(&self, name: &str) -> Result<Option<PersistentVolume>, CtlError> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        pvs.get_opt(name)
            .await
            .map_err(|e| unavailable(&format!("reading PersistentVolume {name}"), e))
    }

    /// The names and phases (`Bound`, `Released`, …; "" before a first
    /// status) of `driver`'s PersistentVolumes with volume handle `handle`,
    /// each phase read now: a copy VM is destroyed only for a volume that
    /// is Released.
    pub async fn pvs_with_handle(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<Vec<(String, String)>, CtlError> {
        let mut out = Vec::new();
        let (found, fresh) = self.pvs_of_handle(driver, handle).await?;
        for pv in found {
            let now = match pv.metadata.name.as_deref() {
                Some(name) if !fresh => self.pv_now(name).await?,
                _ => Some(pv),
            };
            if let Some(pv) = now {
                out.push((
                    pv.metadata.name.unwrap_or_default(),
                    pv.status.and_then(|s| s.phase).unwrap_or_default(),
                ));
            }
        }
        Ok(out)
    }

    /// The version of `storage.k8s.io` that serves VolumeAttributesClasses:
    /// `v1` from Kubernetes 1.34, `v1beta1` on 1.31–1.33 (where the feature
    /// gate and the API must be switched on), asked of the server's
    /// discovery (`/apis/storage.k8s.io/<version>`), once.
    async fn vac_version(&self) -> Result<&'static str, CtlError> {
        self.vac_version
            .get_or_try_init(|| async {
                for version in ["v1", "v1beta1"] {
                    let served = match self
                        .client
                        .list_api_group_resources(&format!("storage.k8s.io/{version}"))
                        .await
                    {
                        Ok(list) => list
                            .resources
                            .iter()
                            .any(|r| r.name == "volumeattributesclasses"),
                        Err(kube::Error::Api(e)) if e.code == 404 => false,
                        Err(e) => return Err(unavailable("discovering storage.k8s.io", e)),
                    };
                    if served {
                        return Ok(version);
                    }
                }
                Err(CtlError::FailedPrecondition(
                    "the PV names a VolumeAttributesClass, but the API server serves none \
                     (storage.k8s.io v1 or v1beta1): enable the VolumeAttributesClass feature \
                     gate and API, or remove volumeAttributesClassName"
                        .into(),
                ))
            })
            .await
            .copied()
    }

    /// A VolumeAttributesClass's parameters, in the version the server serves.
    pub async fn attributes_class(&self, name: &str) -> Result<HashMap<String, String>, CtlError> {
        let version = self.vac_version().await?;
        let resource = ApiResource {
            group: "storage.k8s.io".into(),
            version: version.into(),
            api_version: format!("storage.k8s.io/{version}"),
            kind: "VolumeAttributesClass".into(),
            plural: "volumeattributesclasses".into(),
        };
        let vacs: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        let vac = vacs
            .get(name)
            .await
            .map_err(|e| unavailable(&format!("reading VolumeAttributesClass {name}"), e))?;
        // `parameters` is a map of strings in both versions.
        Ok(vac.data["parameters"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default())
    }
}

/// What the controller reads from a Node: its VM (providerID, then the
/// instance-id annotation, then its SMBIOS system UUID) and its volume limit.
fn node_facts(node: &Node) -> NodeFacts {
    let max_volumes = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(proxmox_csi_common::MAX_VOLUMES_LABEL))
        .and_then(|v| proxmox_csi_common::max_volumes_label(v));
    let from_provider = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(vmid_from_provider_id);
    let from_annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INSTANCE_ID))
        .and_then(|v| vmid_from_provider_id(v));
    let system_uuid = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.system_uuid.trim().to_ascii_lowercase())
        .filter(|u| !u.is_empty());
    let vm = from_provider
        .or(from_annotation)
        .map(NodeVm::Id)
        .or(system_uuid.map(NodeVm::SystemUuid));
    NodeFacts { vm, max_volumes }
}

/// What the controller reads from a PersistentVolume of its own.
fn pv_facts(pv: &PersistentVolume) -> PvFacts {
    PvFacts {
        name: pv.metadata.name.clone().unwrap_or_default(),
        keep: pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LIFECYCLE))
            .map(String::as_str)
            == Some("keep"),
        attributes_class: pv
            .spec
            .as_ref()
            .and_then(|s| s.volume_attributes_class_name.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::vmid_from_provider_id;

    #[test]
    fn provider_ids() {
        assert_eq!(vmid_from_provider_id("proxmox://region-1/112"), Some(112));
        assert_eq!(vmid_from_provider_id("112"), Some(112));
        assert_eq!(vmid_from_provider_id("proxmox://6e1b-uuid"), None);
        assert_eq!(vmid_from_provider_id("aws:///eu/i-1"), None);
    }
}
