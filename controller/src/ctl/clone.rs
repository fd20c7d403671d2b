//! CreateVolume from a content source: a clone of a volume or a restore of
//! a snapshot, copied into a copy VM named after the new volume (see
//! `copy`). Proxmox names the copy (`vm-<copy VMID>-disk-0`), so the new
//! volume's handle carries that name; DeleteVolume destroys the copy VM.
//!
//! CreateVolume waits for the copy within its deadline, showing its progress
//! on the claim (`progress`). A copy that outlasts the call answers
//! `Aborted` with the task's progress, and the provisioner calls again with
//! the same name.

use std::collections::HashMap;

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::volume_content_source::Type as Source;

use super::Controller;
use super::copy::{CopyKind, CopySpec, CopyState, vm_name};
use super::create::{REGION, wanted};
use super::snapshot::SnapshotId;
use crate::error::CtlError;
use crate::params::StorageParams;
use crate::progress::{ClaimRead, ClaimRef, CopyJob, claim_uid_of};
use crate::pve::Deadline;
use crate::volume::VolumeId;

pub use crate::naming::VOLUME_TAG;

/// The source of a copy, resolved.
struct Resolved {
    region: String,
    /// `<storage>:<volume>`.
    volid: String,
    /// The node the source is reached through.
    node: String,
    /// Whether the source's storage is shared (any node can read it).
    shared: bool,
    /// The source's owner VM exists: the copy must run on its node.
    pinned: bool,
    size: u64,
}

impl Controller {
    async fn resolve_source(&self, source: &Source, d: Deadline) -> Result<Resolved, CtlError> {
        let field = "volume_content_source";
        let volume = |id: VolumeId, raw: String| async move {
            let client = self.client_of("volume", &raw, &id.region)?;
            self.refuse_chain_source(&client, "the source volume", &id.storage, &id.disk, d)
                .await?;
            let (node, info) = self.existing(&client, &id, d).await?;
            let owner = self.owner_node(&client, &id.disk, d).await?;
            Ok::<_, CtlError>(Resolved {
                shared: id.zone.is_none(),
                volid: id.volid(),
                region: id.region,
                pinned: owner.is_some(),
                node: owner.unwrap_or(node),
                size: info.size,
            })
        };
        match source {
            Source::Volume(v) => {
                let id = super::volume_ref(&format!("{field}.volume.volume_id"), &v.volume_id)?;
                volume(id, v.volume_id.clone()).await
            }
            Source::Snapshot(s) => {
                match super::snapshot_ref(&format!("{field}.snapshot.snapshot_id"), &s.snapshot_id)?
                {
                    SnapshotId::Volume(id) => volume(id, s.snapshot_id.clone()).await,
                    SnapshotId::Copy {
                        region, vmid, mark, ..
                    } => {
                        let client = self.client_of("snapshot", &s.snapshot_id, &region)?;
                        let gone = || {
                            CtlError::NotFound(format!("snapshot {} does not exist", s.snapshot_id))
                        };
                        // The copy runs on the copy VM's node: where it is now.
                        let vm = self
                            .vms
                            .current(&client, vmid, d)
                            .await?
                            .filter(|v| {
                                v.has_tag(crate::vms::OWN_TAG) && v.has_tag(super::SNAPSHOT_TAG)
                            })
                            .ok_or_else(gone)?;
                        if !self.marked(&client, &vm, mark.as_deref(), d).await? {
                            return Err(gone());
                        }
                        let info = self.read_copy(&client, &vm, d).await?.ok_or_else(|| {
                            CtlError::Unavailable(format!(
                                "snapshot {} is not ready yet (its copy is running)",
                                s.snapshot_id
                            ))
                        })?;
                        let storage = info.volid.split(':').next().unwrap_or_default();
                        let shared = self
                            .storage_rows(&client, storage, d)
                            .await?
                            .iter()
                            .any(|r| r.shared == 1);
                        Ok(Resolved {
                            region,
                            volid: info.volid,
                            node: info.node,
                            shared,
                            pinned: true,
                            size: info.size,
                        })
                    }
                }
            }
        }
    }

    /// CreateVolume with `volume_content_source` set.
    pub async fn create_copy(
        &self,
        r: &csi::CreateVolumeRequest,
        params: &StorageParams,
        size: u64,
        source: &Source,
        d: Deadline,
    ) -> Result<csi::Volume, CtlError> {
        // The whole call's deadline is for waiting on the copy (`finish_copy`).
        let wait = d;
        let d = d.capped(self.operation_limit);
        let job = CopyJob {
            volume: &r.name,
            claim: ClaimRef::from_parameters(&r.parameters),
            what: match source {
                Source::Volume(v) => format!("cloning volume {}", v.volume_id),
                Source::Snapshot(s) => format!("restoring snapshot {}", s.snapshot_id),
            },
        };
        // The provisioner calls again for a claim deleted while its copy
        // ran (it remembers the claim): the copy is given up, whatever
        // became of its source. A new copy starts only for a claim that is
        // there, whose UID its VM then records.
        let read = self.progress.read_claim(self.kube.as_ref(), &job).await;
        if read.gone(claim_uid_of(&r.name)) {
            let (what, raw, region) = match source {
                Source::Volume(v) => (
                    "volume",
                    &v.volume_id,
                    super::volume_ref("volume_content_source.volume.volume_id", &v.volume_id)?
                        .region,
                ),
                Source::Snapshot(s) => (
                    "snapshot",
                    &s.snapshot_id,
                    super::snapshot_ref(
                        "volume_content_source.snapshot.snapshot_id",
                        &s.snapshot_id,
                    )?
                    .region()
                    .to_string(),
                ),
            };
            let client = self.client_of(what, raw, &region)?;
            return Err(self
                .abandon_copy(&client, &vm_name(&r.name), VOLUME_TAG, &job, &read, d)
                .await);
        }
        let claim_uid = match read {
            ClaimRead::Found(uid) => Some(uid),
            _ => None,
        };
        let src = self.resolve_source(source, d).await?;
        let (region, zones) = wanted(r.accessibility_requirements.as_ref());
        if region.as_ref().is_some_and(|reg| reg != &src.region) {
            return Err(CtlError::invalid(
                "accessibility_requirements",
                format!(
                    "the source is in region {}, the volume is wanted in {REGION} {region:?}",
                    src.region
                ),
            ));
        }
        let min = r.capacity_range.as_ref().map_or(src.size, |_| size);
        if r.capacity_range
            .as_ref()
            .is_some_and(|c| c.limit_bytes > 0 && (c.limit_bytes as u64) < src.size)
        {
            return Err(CtlError::OutOfRange(format!(
                "capacity_range.limit_bytes is below the source's {} bytes",
                src.size
            )));
        }
        let client = self.client(&src.region)?;
        let rows = self.storage_rows(&client, &params.storage, d).await?;
        let usable: Vec<_> = rows
            .iter()
            .filter(|row| row.status == "available" && client.cluster().node_allowed(&row.node))
            .collect();
        let target_shared = usable.iter().any(|row| row.shared == 1);
        // The copy runs on a node that reads the source and writes the target.
        let candidates: Vec<String> = if src.shared && !src.pinned {
            usable.iter().map(|row| row.node.clone()).collect()
        } else {
            usable
                .iter()
                .filter(|row| row.node == src.node)
                .map(|row| row.node.clone())
                .collect()
        };
        let node = if zones.is_empty() || target_shared {
            candidates.first().cloned()
        } else {
            zones.iter().find(|z| candidates.contains(z)).cloned()
        }
        .ok_or_else(|| {
            CtlError::ResourceExhausted(format!(
                "storage {:?} cannot take a copy of {} (on {}) in the requested zones {zones:?}: \
                 a copy stays on the source's node unless one of the storages is shared",
                params.storage, src.volid, src.node
            ))
        })?;
        let handle = match source {
            Source::Volume(v) => v.volume_id.clone(),
            Source::Snapshot(s) => s.snapshot_id.clone(),
        };
        let spec = CopySpec {
            name: vm_name(&r.name),
            kind: CopyKind::Volume,
            node: node.clone(),
            storage: params.storage.clone(),
            source: src.volid.clone(),
            source_handle: handle,
            min_size: min,
            claim_uid,
        };
        let info = match self.finish_copy(&client, &spec, &job, wait).await? {
            CopyState::Ready(info) => info,
            CopyState::Copying { vmid, progress, .. } => {
                return Err(CtlError::Aborted(format!(
                    "volume {}: copying {} into VM {vmid} on {node}: {progress}; call again with the same name",
                    r.name, src.volid
                )));
            }
        };
        let disk = info
            .volid
            .split_once(':')
            .map(|(_, n)| n.to_string())
            .unwrap_or_default();
        let id = VolumeId {
            region: src.region.clone(),
            zone: (!target_shared).then(|| node.clone()),
            storage: params.storage.clone(),
            disk,
        };
        let d = wait.capped(self.operation_limit);
        let topology = self.topology_of(&client, &id, target_shared, d).await?;
        Ok(csi::Volume {
            capacity_bytes: info.size as i64,
            volume_id: id.to_string(),
            volume_context: params.context().into_iter().collect::<HashMap<_, _>>(),
            content_source: r.volume_content_source.clone(),
            accessible_topology: topology,
        })
    }
}
