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

/// The source of the events the controller posts (`kubectl describe`'s "From").
pub const COMPONENT: &str = "proxmox-csi-controller";

pub const INSTANCE_ID: &str = "proxmox.sinextra.dev/instance-id";
pub const LIFECYCLE: &str = "csi.proxmox.sinextra.dev/lifecycle";

#[derive(Clone)]
pub struct Kube {
    client: kube::Client,
    /// The VolumeAttributesClass version the API server serves, found once.
    vac_version: std::sync::Arc<tokio::sync::OnceCell<&'static str>>,
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
    CtlError::Unavailable(format!("Kubernetes API: {what}: {e}"))
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
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            vac_version: Default::default(),
        }
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
    pub async fn node(&self, name: &str) -> Result<Option<NodeFacts>, CtlError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let Some(node) = nodes
            .get_opt(name)
            .await
            .map_err(|e| unavailable(&format!("reading Node {name}"), e))?
        else {
            return Ok(None);
        };
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
            .and_then(|s| s.node_info)
            .map(|i| i.system_uuid.trim().to_ascii_lowercase())
            .filter(|u| !u.is_empty());
        let vm = from_provider
            .or(from_annotation)
            .map(NodeVm::Id)
            .or(system_uuid.map(NodeVm::SystemUuid));
        Ok(Some(NodeFacts { vm, max_volumes }))
    }

    /// The node ids this driver registered in CSINode objects: what the
    /// external-attacher publishes to and compares ListVolumes with
    /// (pkg/controller/util.go GetNodeIDFromCSINode).
    pub async fn csi_node_ids(&self, driver: &str) -> Result<Vec<String>, CtlError> {
        let nodes: Api<CSINode> = Api::all(self.client.clone());
        let list = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing CSINodes", e))?;
        Ok(list
            .items
            .into_iter()
            .flat_map(|n| n.spec.drivers)
            .filter(|d| d.name == driver)
            .map(|d| d.node_id)
            .collect())
    }

    /// The PersistentVolume whose CSI volume handle is `handle`.
    pub async fn pv_for_handle(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<Option<PvFacts>, CtlError> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let list = pvs
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing PersistentVolumes", e))?;
        Ok(list.items.into_iter().find_map(|pv| {
            let spec = pv.spec.as_ref()?;
            let csi = spec.csi.as_ref()?;
            (csi.driver == driver && csi.volume_handle == handle).then(|| PvFacts {
                name: pv.metadata.name.clone().unwrap_or_default(),
                keep: pv
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(LIFECYCLE))
                    .map(String::as_str)
                    == Some("keep"),
                attributes_class: spec.volume_attributes_class_name.clone(),
            })
        }))
    }

    /// The names and phases (`Bound`, `Released`, …; "" before a first
    /// status) of `driver`'s PersistentVolumes with volume handle `handle`.
    pub async fn pvs_with_handle(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<Vec<(String, String)>, CtlError> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let list = pvs
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing PersistentVolumes", e))?;
        Ok(list
            .items
            .into_iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == driver && c.volume_handle == handle)
            })
            .map(|pv| {
                (
                    pv.metadata.name.unwrap_or_default(),
                    pv.status.and_then(|s| s.phase).unwrap_or_default(),
                )
            })
            .collect())
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
