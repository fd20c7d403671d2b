//! CreateVolume: a Proxmox disk owned by the placeholder VMID, on the node
//! with the most free space (or the one the topology asks for).

use std::collections::HashMap;

use proxmox_csi_common::contract::BlankFor;
use proxmox_csi_proto::csi::v1 as csi;

use super::{CHUNK, Controller, DEFAULT_SIZE, check_capabilities};
use crate::error::CtlError;
use crate::params::StorageParams;
use crate::pve::api::StorageResource;
use crate::pve::{Client, Deadline};
use crate::volume::{VolumeId, disk_filename};
use crate::warnings::{self, ClassKind};

pub use proxmox_csi_common::contract::{TOPOLOGY_REGION as REGION, TOPOLOGY_ZONE as ZONE};

/// The size to allocate, in the Go driver's 512 MiB steps.
pub fn size_for(range: Option<&csi::CapacityRange>) -> Result<u64, CtlError> {
    let Some(r) = range else {
        return Ok(DEFAULT_SIZE);
    };
    let (req, lim) = (r.required_bytes, r.limit_bytes);
    if req < 0 || lim < 0 {
        return Err(CtlError::invalid(
            "capacity_range",
            "sizes must not be negative",
        ));
    }
    let (req, lim) = (req as u64, lim as u64);
    if lim > 0 && req > lim {
        // A range that holds no size: the spec's "unsupported capacity_range".
        return Err(CtlError::OutOfRange(format!(
            "capacity_range: required_bytes {req} exceeds limit_bytes {lim}"
        )));
    }
    let size = req.max(1).div_ceil(CHUNK) * CHUNK;
    if lim > 0 && size > lim {
        // Round down to the limit when that still satisfies the request.
        let down = lim / CHUNK * CHUNK;
        if down >= req && down > 0 {
            return Ok(down);
        }
        return Err(CtlError::OutOfRange(format!(
            "capacity_range: {req}..{lim} bytes holds no multiple of 512 MiB, the allocation step"
        )));
    }
    Ok(size)
}

/// Region and zone wanted: preferred topologies first, then requisite.
pub(super) fn wanted(req: Option<&csi::TopologyRequirement>) -> (Option<String>, Vec<String>) {
    let Some(t) = req else {
        return (None, Vec::new());
    };
    let all: Vec<&csi::Topology> = t.preferred.iter().chain(t.requisite.iter()).collect();
    let region = all.iter().find_map(|s| s.segments.get(REGION).cloned());
    let zones = all
        .iter()
        .filter(|s| {
            region
                .as_ref()
                .is_none_or(|r| s.segments.get(REGION) == Some(r))
        })
        .filter_map(|s| s.segments.get(ZONE).cloned())
        .collect();
    (region, zones)
}

/// `replicate=true`: local ZFS, and the nodes of `replicateZones` that have it.
fn replication_nodes<'a>(
    params: &StorageParams,
    rows: Vec<&'a StorageResource>,
) -> Result<Vec<&'a StorageResource>, CtlError> {
    let kind = rows
        .first()
        .map(|r| r.plugintype.as_str())
        .unwrap_or_default();
    if kind != "zfspool" || rows.iter().any(|r| r.shared == 1) {
        return Err(CtlError::invalid(
            "parameters.replicate",
            format!(
                "storage {:?} is a {kind} storage; replication needs a local zfspool storage",
                params.storage
            ),
        ));
    }
    if params.replicate_zones.is_empty() {
        return Err(CtlError::invalid(
            "parameters.replicateZones",
            "is required with replicate=true: the Proxmox nodes to replicate to",
        ));
    }
    let missing: Vec<&String> = params
        .replicate_zones
        .iter()
        .filter(|z| !rows.iter().any(|r| &r.node == *z))
        .collect();
    if !missing.is_empty() {
        return Err(CtlError::invalid(
            "parameters.replicateZones",
            format!(
                "storage {:?} is not available on {missing:?}",
                params.storage
            ),
        ));
    }
    Ok(rows)
}

impl Controller {
    pub async fn create_volume(
        &self,
        r: &csi::CreateVolumeRequest,
        d: Deadline,
    ) -> Result<csi::Volume, CtlError> {
        if r.name.is_empty() {
            return Err(CtlError::invalid("name", "is required"));
        }
        check_capabilities("volume_capabilities", &r.volume_capabilities)
            .map_err(|e| CtlError::invalid("volume_capabilities", e))?;
        let mut params = StorageParams::parse(&r.parameters)?;
        warnings::report(ClassKind::StorageClass, &params.warnings);
        let vac = params.apply_mutable(&r.mutable_parameters)?;
        warnings::report(ClassKind::VolumeAttributesClass, &vac);
        let size = size_for(r.capacity_range.as_ref())?;
        if let Some(source) = r
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            return self.create_copy(r, &params, size, source, d).await;
        }
        // The provisioner's long timeout is for waiting on copies.
        let d = d.capped(self.operation_limit);
        let (region, zones) = wanted(r.accessibility_requirements.as_ref());
        let region = match region {
            Some(r) => r,
            None if self.clients.len() == 1 => {
                self.clients.keys().next().cloned().unwrap_or_default()
            }
            None => {
                return Err(CtlError::invalid(
                    "accessibility_requirements",
                    format!("no {REGION} segment, and the cloud config has several clusters"),
                ));
            }
        };
        let client = self.client(&region)?;
        let cluster = client.cluster();
        if !cluster.storage_allowed(&params.storage) {
            return Err(CtlError::invalid(
                "parameters.storage",
                format!(
                    "{:?} is not in allowed_storages of region {region}: {:?}",
                    params.storage, cluster.allowed_storages
                ),
            ));
        }
        let rows = self.storage_rows(&client, &params.storage, d).await?;
        let available: Vec<_> = rows
            .iter()
            .filter(|r| r.status == "available" && cluster.node_allowed(&r.node))
            .collect();
        if available.is_empty() {
            return Err(CtlError::invalid(
                "parameters.storage",
                format!(
                    "storage {:?} is not available on any node of region {region}",
                    params.storage
                ),
            ));
        }
        let shared = available.iter().any(|r| r.shared == 1);
        let available = if params.replicate {
            replication_nodes(&params, available)?
        } else {
            available
        };
        let file_storage = matches!(
            available[0].plugintype.as_str(),
            "dir" | "nfs" | "cifs" | "cephfs" | "btrfs"
        );
        if zones.is_empty() && !shared {
            // Nodes without a zone label reach shared storage only; a
            // local volume is then placed as the Go driver places it.
            tracing::warn!(
                storage = params.storage,
                "the request names no {ZONE}: a volume on local storage is placed on the Proxmox node with most free space, \
                 and only Kubernetes nodes labelled with that node as their zone can use it"
            );
        }
        // Local storage: the requested zone, else the node with most free space.
        let node = if zones.is_empty() {
            available
                .iter()
                .max_by_key(|r| r.maxdisk.saturating_sub(r.disk))
                .map(|r| r.node.clone())
        } else {
            zones
                .iter()
                .find(|z| available.iter().any(|r| &r.node == *z))
                .cloned()
        }
        .ok_or_else(|| {
            CtlError::ResourceExhausted(format!(
                "storage {:?} is on none of the requested zones {zones:?} of region {region}",
                params.storage
            ))
        })?;

        if params.replicate {
            return self
                .create_replicated(&client, r, &params, &node, size, d)
                .await;
        }
        let format = params.format.clone().unwrap_or_else(|| "raw".into());
        // qcow2 on thick LVM: PVE 9's volume chains, where the name carries
        // the format (pve-storage LVMPlugin.pm verify_volname_format), as
        // the Go driver names them since its volume-chain support.
        let qcow2_on_lvm = available[0].plugintype == "lvm" && format == "qcow2";
        if qcow2_on_lvm {
            self.require_volume_chains(&client, &params.storage, d)
                .await?;
        }
        let extension = (file_storage || qcow2_on_lvm).then_some(format.as_str());
        let in_dir = |f: String| {
            if file_storage {
                format!("{}/{f}", self.controller_vmid)
            } else {
                f
            }
        };
        // A volume for a filesystem only may be formatted over whatever
        // bytes its storage left in it, on its first stage (hostd's claims).
        let blank_for = if r.volume_capabilities.iter().all(|c| {
            matches!(
                c.access_type,
                Some(csi::volume_capability::AccessType::Mount(_))
            )
        }) {
            BlankFor::Filesystem
        } else {
            BlankFor::Block
        };
        let filename = disk_filename(
            self.controller_vmid,
            &r.name,
            self.cluster_id.as_ref().map(|c| (blank_for, c)),
            extension,
        );
        let volname = in_dir(filename.clone());
        // Idempotent by name: the same disk is the same answer. A disk named
        // without the cluster id is one an earlier version began for this
        // request before it was upgraded.
        let mut existing = client
            .volume_info(&node, &params.storage, &volname, d)
            .await?
            .map(|v| (volname.clone(), v));
        if existing.is_none() && self.cluster_id.is_some() {
            let legacy = in_dir(disk_filename(
                self.controller_vmid,
                &r.name,
                None,
                extension,
            ));
            existing = client
                .volume_info(&node, &params.storage, &legacy, d)
                .await?
                .map(|v| (legacy, v));
        }
        let (disk, capacity) = match existing {
            Some((found, existing)) => {
                // An LV's upper bound stands for the size this request allocates.
                let existing_size = if existing.approximate {
                    size.min(existing.size)
                } else {
                    existing.size
                };
                let (req, lim) = r
                    .capacity_range
                    .as_ref()
                    .map(|c| (c.required_bytes.max(0) as u64, c.limit_bytes.max(0) as u64))
                    .unwrap_or((DEFAULT_SIZE, 0));
                if existing_size < req || (lim > 0 && existing_size > lim) {
                    return Err(CtlError::AlreadyExists(format!(
                        "volume {} already exists with {} bytes, outside the requested range {req}..{}",
                        r.name,
                        existing_size,
                        if lim > 0 {
                            lim.to_string()
                        } else {
                            "∞".into()
                        }
                    )));
                }
                (found, existing_size)
            }
            None => {
                let volid = client
                    .allocate(
                        &node,
                        &params.storage,
                        &filename,
                        extension.unwrap_or("raw"),
                        self.controller_vmid,
                        size,
                        d,
                    )
                    .await?;
                (
                    volid
                        .split_once(':')
                        .map(|(_, n)| n.to_string())
                        .unwrap_or(volname),
                    size,
                )
            }
        };
        let id = VolumeId {
            region: region.clone(),
            zone: (!shared).then(|| node.clone()),
            storage: params.storage.clone(),
            disk,
        };
        let topology = self.topology_of(&client, &id, shared, d).await?;
        Ok(csi::Volume {
            capacity_bytes: capacity as i64,
            volume_id: id.to_string(),
            volume_context: params.context().into_iter().collect::<HashMap<_, _>>(),
            content_source: None,
            accessible_topology: topology,
        })
    }

    /// qcow2 on thick LVM needs the storage's `snapshot-as-volume-chain`
    /// (pve-storage LVMPlugin.pm alloc_lvm_image refuses it otherwise):
    /// refused here with the parameter and the option named.
    async fn require_volume_chains(
        &self,
        client: &Client,
        storage: &str,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let cfg = client.storage_config(storage, d).await?;
        if cfg.snapshot_as_volume_chain != Some(1) {
            return Err(CtlError::invalid(
                "parameters.storageFormat",
                format!(
                    "\"qcow2\" on thick LVM storage {storage:?} needs its snapshot-as-volume-chain option \
                     (Proxmox VE 9); without it only raw is allowed there"
                ),
            ));
        }
        Ok(())
    }

    /// Local storage: the node. Shared: the storage's `nodes`, or the region.
    pub(super) async fn topology_of(
        &self,
        client: &Client,
        id: &VolumeId,
        shared: bool,
        d: Deadline,
    ) -> Result<Vec<csi::Topology>, CtlError> {
        let seg = |zone: Option<&str>| {
            let mut m = HashMap::from([(REGION.to_string(), id.region.clone())]);
            if let Some(z) = zone {
                m.insert(ZONE.to_string(), z.to_string());
            }
            csi::Topology { segments: m }
        };
        if !shared {
            return Ok(vec![seg(id.zone.as_deref())]);
        }
        let cfg = client.storage_config(&id.storage, d).await?;
        Ok(match cfg.nodes.filter(|n| !n.is_empty()) {
            Some(nodes) => nodes.split(',').map(|n| seg(Some(n.trim()))).collect(),
            None => vec![seg(None)],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(req: i64, lim: i64) -> Option<csi::CapacityRange> {
        Some(csi::CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        })
    }

    #[test]
    fn sizes_follow_the_go_driver() {
        assert_eq!(size_for(None).unwrap(), 10 << 30);
        assert_eq!(size_for(range(1, 0).as_ref()).unwrap(), 512 << 20);
        assert_eq!(
            size_for(range((1 << 30) + 1, 0).as_ref()).unwrap(),
            1536 << 20
        );
        assert_eq!(size_for(range(1 << 30, 1 << 30).as_ref()).unwrap(), 1 << 30);
        assert!(
            size_for(range(600 << 20, 1000 << 20).as_ref())
                .unwrap_err()
                .to_string()
                .contains("512 MiB")
        );
        assert!(matches!(
            size_for(range(2, 1).as_ref()),
            Err(CtlError::OutOfRange(_))
        ));
    }
}
