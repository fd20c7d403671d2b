//! The external-provisioner (kubernetes-csi/external-provisioner
//! pkg/controller/controller.go: prepareProvision builds CreateVolume,
//! Provision writes the PV, Delete sends DeleteVolume).

use std::collections::HashMap;

use crate::{AccessMode, PersistentVolume, VolumeMode, capability, csi, csi_access_mode};

/// The StorageClass, as the provisioner reads it.
#[derive(Debug, Clone, Default)]
pub struct StorageClass {
    pub parameters: HashMap<String, String>,
    pub mount_options: Vec<String>,
}

impl StorageClass {
    pub fn new(parameters: &[(&str, &str)]) -> Self {
        Self {
            parameters: parameters
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            mount_options: Vec::new(),
        }
    }

    pub fn mount_options(mut self, options: &[&str]) -> Self {
        self.mount_options = options.iter().map(|o| o.to_string()).collect();
        self
    }
}

/// The claim being provisioned.
#[derive(Debug, Clone)]
pub struct Claim {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub access_modes: Vec<AccessMode>,
    /// `spec.resources.requests.storage`, in bytes (`Quantity.Value()`).
    pub request_bytes: i64,
    pub volume_mode: VolumeMode,
    /// `spec.dataSource`: a VolumeSnapshot's content handle, or a source PV.
    pub data_source: Option<csi::volume_content_source::Type>,
    /// `spec.volumeAttributesClassName`'s parameters.
    pub mutable_parameters: HashMap<String, String>,
}

impl Claim {
    /// A ReadWriteOnce filesystem claim `name` in `default` with uid `uid`.
    pub fn new(name: &str, uid: &str, request_bytes: i64) -> Self {
        Self {
            name: name.into(),
            namespace: "default".into(),
            uid: uid.into(),
            access_modes: vec![AccessMode::ReadWriteOnce],
            request_bytes,
            volume_mode: VolumeMode::Filesystem,
            data_source: None,
            mutable_parameters: HashMap::new(),
        }
    }

    pub fn block(mut self) -> Self {
        self.volume_mode = VolumeMode::Block;
        self
    }

    pub fn access(mut self, modes: &[AccessMode]) -> Self {
        self.access_modes = modes.to_vec();
        self
    }

    pub fn from_snapshot(mut self, snapshot_handle: &str) -> Self {
        self.data_source = Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot_handle.into(),
            },
        ));
        self
    }

    pub fn from_volume(mut self, source: &PersistentVolume) -> Self {
        self.data_source = Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: source.handle.clone(),
            },
        ));
        self
    }

    /// `pvc-<uid>`: makeVolumeName with the default prefix `pvc` and
    /// `--volume-name-uuid-length=-1` (dashes kept). Also the PV's name.
    pub fn volume_name(&self) -> String {
        format!("pvc-{}", self.uid)
    }
}

/// The StorageClass keys the provisioner consumes and strips
/// (removePrefixedParameters: the fstype and every secret reference).
const STRIPPED: &[&str] = &[
    "csi.storage.k8s.io/fstype",
    "csi.storage.k8s.io/provisioner-secret-name",
    "csi.storage.k8s.io/provisioner-secret-namespace",
    "csi.storage.k8s.io/controller-publish-secret-name",
    "csi.storage.k8s.io/controller-publish-secret-namespace",
    "csi.storage.k8s.io/node-stage-secret-name",
    "csi.storage.k8s.io/node-stage-secret-namespace",
    "csi.storage.k8s.io/node-publish-secret-name",
    "csi.storage.k8s.io/node-publish-secret-namespace",
    "csi.storage.k8s.io/controller-expand-secret-name",
    "csi.storage.k8s.io/controller-expand-secret-namespace",
    "csi.storage.k8s.io/node-expand-secret-name",
    "csi.storage.k8s.io/node-expand-secret-namespace",
    "csi.storage.k8s.io/controller-modify-secret-name",
    "csi.storage.k8s.io/controller-modify-secret-namespace",
    "csi.storage.k8s.io/secret-name",
    "csi.storage.k8s.io/secret-namespace",
];

/// The fsType: `csi.storage.k8s.io/fstype`, or the legacy `fstype` key in
/// any case (which stays in the parameters), else `--default-fstype` ("").
pub fn fs_type(sc: &StorageClass) -> String {
    sc.parameters
        .iter()
        .find(|(k, _)| k.as_str() == "csi.storage.k8s.io/fstype" || k.to_lowercase() == "fstype")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// CreateVolumeRequest as prepareProvision builds it, with
/// `--extra-create-metadata` (the Go driver's chart turns it on) and the
/// topology requirement the provisioner derived (`requirement`, from
/// GenerateAccessibilityRequirements: requisite and preferred terms).
pub fn create_volume(
    sc: &StorageClass,
    claim: &Claim,
    requirement: Option<csi::TopologyRequirement>,
) -> csi::CreateVolumeRequest {
    let mut parameters: HashMap<String, String> = sc
        .parameters
        .iter()
        .filter(|(k, _)| !STRIPPED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    parameters.insert("csi.storage.k8s.io/pvc/name".into(), claim.name.clone());
    parameters.insert(
        "csi.storage.k8s.io/pvc/namespace".into(),
        claim.namespace.clone(),
    );
    parameters.insert("csi.storage.k8s.io/pv/name".into(), claim.volume_name());
    let fs = if claim.volume_mode == VolumeMode::Block {
        String::new()
    } else {
        fs_type(sc)
    };
    // One capability per access mode of the claim, each mapped on its own
    // (getVolumeCapabilities).
    let volume_capabilities = claim
        .access_modes
        .iter()
        .map(|m| {
            capability(
                csi_access_mode(&[*m], crate::SNMW),
                claim.volume_mode,
                &fs,
                &sc.mount_options,
            )
        })
        .collect();
    csi::CreateVolumeRequest {
        name: claim.volume_name(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: claim.request_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities,
        parameters,
        secrets: HashMap::new(),
        volume_content_source: claim
            .data_source
            .clone()
            .map(|t| csi::VolumeContentSource { r#type: Some(t) }),
        accessibility_requirements: requirement,
        mutable_parameters: claim.mutable_parameters.clone(),
    }
}

/// A topology requirement for delayed binding (the pod's node selected),
/// non-strict: requisite = `terms` (every node's), preferred = the same
/// with the selected node's term first (GenerateAccessibilityRequirements).
pub fn requirement(terms: &[&[(&str, &str)]], selected: usize) -> csi::TopologyRequirement {
    let topo = |t: &[(&str, &str)]| csi::Topology {
        segments: t
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let requisite: Vec<csi::Topology> = terms.iter().map(|t| topo(t)).collect();
    let mut preferred = requisite.clone();
    preferred.rotate_left(selected.min(requisite.len().saturating_sub(1)));
    csi::TopologyRequirement {
        requisite,
        preferred,
    }
}

/// `storage.kubernetes.io/csiProvisionerIdentity`: made once per
/// provisioner start, `<unix millis>-<0..9999>-<driver>`
/// (cmd/csi-provisioner/csi-provisioner.go).
pub const IDENTITY_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";
pub fn identity() -> String {
    format!("1764504000123-4821-{}", crate::DRIVER)
}

/// The PersistentVolume Provision writes from a CreateVolume answer:
/// volumeAttributes = the identity key, then the answer's volume_context
/// copied over it; fsType for filesystem claims; the class's mountOptions.
pub fn persistent_volume(
    sc: &StorageClass,
    claim: &Claim,
    volume: &csi::Volume,
) -> PersistentVolume {
    let mut attributes = HashMap::from([(IDENTITY_KEY.to_string(), identity())]);
    attributes.extend(volume.volume_context.clone());
    PersistentVolume {
        name: claim.volume_name(),
        driver: crate::DRIVER.into(),
        handle: volume.volume_id.clone(),
        fs_type: if claim.volume_mode == VolumeMode::Block {
            String::new()
        } else {
            fs_type(sc)
        },
        attributes,
        read_only: false,
        access_modes: claim.access_modes.clone(),
        mount_options: sc.mount_options.clone(),
        volume_mode: claim.volume_mode,
        capacity_bytes: if volume.capacity_bytes == 0 {
            claim.request_bytes
        } else {
            volume.capacity_bytes
        },
    }
}

/// GetCapacityRequest of the provisioner's capacity controller
/// (pkg/capacity/capacity.go syncCapacity): the StorageClass's parameters
/// unfiltered, no capabilities, the topology segment of one CSIStorageCapacity
/// object (`None` for a driver without topology).
pub fn get_capacity(
    sc: &StorageClass,
    segment: Option<&[(&str, &str)]>,
) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters: sc.parameters.clone(),
        accessible_topology: segment.map(|s| csi::Topology {
            segments: s
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }),
    }
}

/// DeleteVolumeRequest (Delete): the PV's handle; no secrets configured.
pub fn delete_volume(pv: &PersistentVolume) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: pv.handle.clone(),
        secrets: HashMap::new(),
    }
}
