//! CreateSnapshot, DeleteSnapshot, ListSnapshots, GetSnapshot.
//!
//! A snapshot is a full copy of the volume in a copy VM of its own (see
//! `copy`), made with the API token alone. CreateSnapshot never waits for
//! the copy: it answers `ready_to_use=false` with the task's progress and
//! the snapshotter asks again. The copy of an attached volume is taken
//! while the pod may write to it; it is as consistent as the filesystem
//! after a crash only if the application is quiesced.
//!
//! Snapshot IDs: `region/zone/storage/snapshot-vm-<vmid>` for ours, and the
//! Go driver's (a volume, `region/zone/storage/vm-9999-snapshot-…`) are
//! still understood, for restores and deletes.

use std::collections::HashMap;

use proxmox_csi_proto::csi::v1 as csi;

use super::Controller;
use super::copy::{CopyInfo, CopyKind, CopySpec, CopyState, described, mark_of, vm_name};
use crate::error::CtlError;
use crate::naming::described::{CREATED, SOURCE, STORAGE};
use crate::pve::api::VmResource;
use crate::pve::{Client, Deadline};
use crate::volume::VolumeId;
use crate::warnings::{self, ClassKind, ParamWarning, Reason};

pub use crate::naming::SNAPSHOT_TAG;
pub use proxmox_csi_common::handles::SnapshotId;

pub(super) fn timestamp(secs: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp {
        seconds: secs,
        nanos: 0,
    })
}

pub(super) fn snapshot_of(region: &str, info: &CopyInfo) -> csi::Snapshot {
    let storage = info.volid.split(':').next().unwrap_or_default().to_string();
    csi::Snapshot {
        size_bytes: info.size as i64,
        snapshot_id: SnapshotId::Copy {
            region: region.into(),
            zone: info.node.clone(),
            storage,
            vmid: info.vmid,
            mark: info.mark.clone(),
        }
        .to_string(),
        source_volume_id: info.source_handle.clone(),
        creation_time: timestamp(info.created),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// VolumeSnapshotClass parameters.
#[derive(Debug, Default)]
struct SnapshotClass {
    /// Where the copy is kept (default: the volume's storage).
    storage: Option<String>,
    /// `attached: refuse`: no snapshot of a volume attached to a VM, whose
    /// copy would be read from a live disk.
    refuse_attached: bool,
    warnings: Vec<ParamWarning>,
}

/// What a VolumeSnapshotClass's parameters would warn of (`pvecsictl doctor`).
pub fn snapshot_class_warnings(
    params: &HashMap<String, String>,
) -> Result<Vec<ParamWarning>, CtlError> {
    Ok(snapshot_class(params)?.warnings)
}

fn snapshot_class(params: &HashMap<String, String>) -> Result<SnapshotClass, CtlError> {
    let mut class = SnapshotClass::default();
    for (k, v) in params {
        match k.as_str() {
            "storage" if !v.is_empty() => class.storage = Some(v.clone()),
            "storage" => return Err(CtlError::invalid("parameters.storage", "must not be empty")),
            "attached" => {
                class.refuse_attached = match v.as_str() {
                    "allow" | "" => false,
                    "refuse" => true,
                    other => {
                        return Err(CtlError::invalid(
                            "parameters.attached",
                            format!("{other:?} is not allowed; allowed: allow, refuse"),
                        ));
                    }
                }
            }
            // The Go driver's class key; the copy stays on the volume's node.
            "zone" => class
                .warnings
                .push(ParamWarning::new(k, Reason::NotActedOn)),
            // The external-snapshotter's own keys (csi.storage.k8s.io/snapshotter-secret-*).
            k if k.starts_with("csi.storage.k8s.io/") => {}
            other => class
                .warnings
                .push(ParamWarning::new(other, Reason::UnknownKey)),
        }
    }
    class.warnings.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(class)
}

impl Controller {
    pub async fn create_snapshot(
        &self,
        r: &csi::CreateSnapshotRequest,
        d: Deadline,
    ) -> Result<csi::Snapshot, CtlError> {
        if r.name.is_empty() {
            return Err(CtlError::invalid("name", "is required"));
        }
        if r.source_volume_id.is_empty() {
            return Err(CtlError::invalid("source_volume_id", "is required"));
        }
        let src =
            VolumeId::parse(&r.source_volume_id).map_err(|source| CtlError::InvalidHandle {
                field: "source_volume_id".into(),
                source,
            })?;
        let class = snapshot_class(&r.parameters)?;
        warnings::report(ClassKind::VolumeSnapshotClass, &class.warnings);
        let storage = class.storage.clone().unwrap_or_else(|| src.storage.clone());
        let client = self.client(&src.region)?;
        if !client.cluster().storage_allowed(&storage) {
            return Err(CtlError::invalid(
                "parameters.storage",
                format!(
                    "{storage:?} is not in allowed_storages of region {}",
                    src.region
                ),
            ));
        }
        self.refuse_chain_source(&client, "volume", &src.storage, &src.disk, d)
            .await?;
        let (node, info) = self.existing(&client, &src, d).await?;
        let node = self
            .owner_node(&client, &src.disk, d)
            .await?
            .unwrap_or(node);
        // A copy of an attached volume is `qemu-img convert` of a disk the
        // guest is writing: not even crash-consistent (docs/snapshots.md).
        if self
            .copy_vm(&client, &vm_name(&r.name), SNAPSHOT_TAG, d)
            .await?
            .is_none()
            && let Some(vmid) = self
                .attachments
                .confirmed(&client, &self.vms, &src.volid(), src.zone.as_deref(), d)
                .await?
        {
            if class.refuse_attached {
                return Err(CtlError::FailedPrecondition(format!(
                    "volume {} is attached to VM {vmid}, and the VolumeSnapshotClass refuses snapshots of attached volumes \
                     (attached: refuse): a copy of a disk in use is not crash-consistent; stop the pod or scale it down first",
                    r.source_volume_id
                )));
            }
            tracing::warn!(
                volume_id = r.source_volume_id,
                vmid,
                "snapshot of an attached volume: the copy is read from a live disk and is not crash-consistent"
            );
        }
        let spec = CopySpec {
            name: vm_name(&r.name),
            kind: CopyKind::Snapshot,
            node,
            storage,
            source: src.volid(),
            source_handle: r.source_volume_id.clone(),
            min_size: 0,
            claim_uid: None,
        };
        match self.advance_copy(&client, &spec, d).await? {
            CopyState::Ready(info) => Ok(snapshot_of(&src.region, &info)),
            CopyState::Copying {
                vmid,
                node,
                created,
                mark,
                progress,
            } => {
                tracing::info!(name = r.name, vmid, progress, "snapshot copy running");
                Ok(csi::Snapshot {
                    size_bytes: info.size as i64,
                    snapshot_id: SnapshotId::Copy {
                        region: src.region.clone(),
                        zone: node,
                        storage: spec.storage,
                        vmid,
                        mark,
                    }
                    .to_string(),
                    source_volume_id: r.source_volume_id.clone(),
                    creation_time: timestamp(created),
                    ready_to_use: false,
                    group_snapshot_id: String::new(),
                })
            }
        }
    }

    pub async fn delete_snapshot(&self, snapshot_id: &str, d: Deadline) -> Result<(), CtlError> {
        if snapshot_id.is_empty() {
            return Err(CtlError::invalid("snapshot_id", "is required"));
        }
        // An id this driver could never have issued names nothing to delete.
        let Ok(id) = SnapshotId::parse(snapshot_id) else {
            return Ok(());
        };
        let Some(client) = self.clients.get(id.region()).cloned() else {
            return Ok(());
        };
        match id {
            SnapshotId::Volume(v) => {
                let Some(node) = self.node_for(&client, &v, d).await? else {
                    return Ok(());
                };
                if client
                    .volume_info(&node, &v.storage, &v.disk, d)
                    .await?
                    .is_some()
                {
                    client.delete_volume(&node, &v.storage, &v.disk, d).await?;
                }
                Ok(())
            }
            SnapshotId::Copy { vmid, ref mark, .. } => {
                let Some(vm) = self.vms.node_of(&client, vmid, d).await? else {
                    return Ok(());
                };
                // The VMID now holds another VM (not a snapshot of this
                // driver, or another one): this snapshot is gone.
                if !(vm.has_tag(crate::vms::OWN_TAG) && vm.has_tag(SNAPSHOT_TAG)) {
                    tracing::info!(%snapshot_id, vmid, "VM is not this driver's snapshot: the snapshot is gone, the VM is left alone");
                    return Ok(());
                }
                if !self.marked(&client, &vm, mark.as_deref(), d).await? {
                    tracing::info!(%snapshot_id, vmid, "VM now holds another snapshot: this one is gone");
                    return Ok(());
                }
                self.destroy_copy(&client, &vm, d).await
            }
        }
    }

    /// Whether copy VM `vm` is the one a snapshot id with `mark` names: the
    /// mark in its description, written once at its creation; an id without
    /// one (an earlier version's) names only a VM without one.
    pub(super) async fn marked(
        &self,
        client: &crate::pve::Client,
        vm: &crate::pve::api::VmResource,
        mark: Option<&str>,
        d: Deadline,
    ) -> Result<bool, CtlError> {
        let cfg = client.vm_config(&vm.node, vm.vmid, d).await?;
        // Its tags as they are now, not as a cached list had them.
        let snapshot = cfg
            .values
            .get("tags")
            .is_some_and(|t| t.split([';', ',', ' ']).any(|x| x == SNAPSHOT_TAG));
        Ok(crate::vms::is_own(&cfg.values)
            && snapshot
            && super::copy::mark_of(&cfg.values).as_deref() == mark)
    }

    /// The snapshot behind `id`, ready or not; `None` if it is gone.
    pub async fn snapshot(
        &self,
        id: &SnapshotId,
        d: Deadline,
    ) -> Result<Option<csi::Snapshot>, CtlError> {
        let client = self.client(id.region())?;
        match id {
            SnapshotId::Volume(v) => {
                let Some(node) = self.node_for(&client, v, d).await? else {
                    return Ok(None);
                };
                Ok(client
                    .volume_info(&node, &v.storage, &v.disk, d)
                    .await?
                    .map(|i| csi::Snapshot {
                        size_bytes: i.size as i64,
                        snapshot_id: id.to_string(),
                        ready_to_use: true,
                        ..Default::default()
                    }))
            }
            SnapshotId::Copy {
                region, vmid, mark, ..
            } => {
                let Some(vm) = self
                    .vms
                    .node_of(&client, *vmid, d)
                    .await?
                    .filter(|v| v.has_tag(crate::vms::OWN_TAG) && v.has_tag(SNAPSHOT_TAG))
                else {
                    return Ok(None);
                };
                if !self.marked(&client, &vm, mark.as_deref(), d).await? {
                    return Ok(None);
                }
                Ok(Some(self.copy_snapshot(&client, &vm, region, d).await?))
            }
        }
    }

    pub async fn list_snapshots(
        &self,
        r: &csi::ListSnapshotsRequest,
        d: Deadline,
    ) -> Result<csi::ListSnapshotsResponse, CtlError> {
        if r.max_entries < 0 {
            return Err(CtlError::invalid("max_entries", "must not be negative"));
        }
        let mut all: Vec<csi::Snapshot> = Vec::new();
        if !r.snapshot_id.is_empty() {
            // An ID we cannot parse names no snapshot: an empty answer.
            if let Ok(id) = SnapshotId::parse(&r.snapshot_id)
                && self.clients.contains_key(id.region())
                && let Some(s) = self.snapshot(&id, d).await?
            {
                all.push(s);
            }
        } else {
            let mut regions: Vec<&String> = self.clients.keys().collect();
            regions.sort();
            for region in regions {
                let client = self.client(region)?;
                for vm in self
                    .vms
                    .all(&client, d)
                    .await?
                    .iter()
                    .filter(|v| v.has_tag(crate::vms::OWN_TAG) && v.has_tag(SNAPSHOT_TAG))
                {
                    all.push(self.copy_snapshot(&client, vm, region, d).await?);
                }
            }
        }
        all.retain(|s| r.source_volume_id.is_empty() || s.source_volume_id == r.source_volume_id);
        all.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        let start: usize = match r.starting_token.as_str() {
            "" => 0,
            t => t.parse().ok().filter(|n| *n <= all.len()).ok_or_else(|| {
                CtlError::Aborted(format!(
                    "starting_token {t:?} was not given out by this controller"
                ))
            })?,
        };
        let take = if r.max_entries == 0 {
            usize::MAX
        } else {
            r.max_entries as usize
        };
        let page: Vec<csi::Snapshot> = all.iter().skip(start).take(take).cloned().collect();
        let next = start + page.len();
        Ok(csi::ListSnapshotsResponse {
            entries: page
                .into_iter()
                .map(|s| csi::list_snapshots_response::Entry { snapshot: Some(s) })
                .collect(),
            next_token: if next < all.len() {
                next.to_string()
            } else {
                String::new()
            },
        })
    }

    /// A copy VM as a CSI snapshot: ready, or still copying (then its id,
    /// source and creation time come from the VM's description).
    pub async fn copy_snapshot(
        &self,
        client: &Client,
        vm: &VmResource,
        region: &str,
        d: Deadline,
    ) -> Result<csi::Snapshot, CtlError> {
        let cfg = client.vm_config(&vm.node, vm.vmid, d).await?;
        if let Some(info) = self.copy_info(client, vm, &cfg.values, d).await? {
            return Ok(snapshot_of(region, &info));
        }
        let source = described(&cfg.values, SOURCE).unwrap_or_default();
        let storage = described(&cfg.values, STORAGE)
            .or_else(|| VolumeId::parse(&source).ok().map(|v| v.storage))
            .unwrap_or_default();
        let created = described(&cfg.values, CREATED)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok(csi::Snapshot {
            size_bytes: 0,
            snapshot_id: SnapshotId::Copy {
                region: region.to_string(),
                zone: vm.node.clone(),
                storage,
                vmid: vm.vmid,
                mark: mark_of(&cfg.values),
            }
            .to_string(),
            source_volume_id: source,
            creation_time: timestamp(created),
            ready_to_use: false,
            group_snapshot_id: String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_parameters() {
        let p = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        };
        assert_eq!(snapshot_class(&p(&[])).unwrap().storage, None);
        assert_eq!(
            snapshot_class(&p(&[("storage", "zfs")]))
                .unwrap()
                .storage
                .as_deref(),
            Some("zfs")
        );
        assert!(snapshot_class(&p(&[("csi.storage.k8s.io/snapshotter-secret-name", "x")])).is_ok());
        // The Go driver's `zone` and unknown keys are accepted (a class is immutable).
        assert!(snapshot_class(&p(&[("zone", "pve1"), ("pool", "x")])).is_ok());
        assert!(
            snapshot_class(&p(&[("attached", "refuse")]))
                .unwrap()
                .refuse_attached
        );
        let e = snapshot_class(&p(&[("attached", "never")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "parameters.attached: \"never\" is not allowed; allowed: allow, refuse"
        );
    }
}
