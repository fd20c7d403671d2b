//! Read-only RPCs: capacity, capability validation, volume listing and
//! condition.

use std::collections::HashMap;

use proxmox_csi_proto::csi::v1 as csi;

use super::create::{REGION, ZONE};
use super::{Controller, check_capabilities};
use crate::drive;
use crate::error::CtlError;
use crate::pve::Deadline;
use crate::volume::VolumeId;

impl Controller {
    pub async fn capacity(
        &self,
        r: &csi::GetCapacityRequest,
        d: Deadline,
    ) -> Result<(u64, u64), CtlError> {
        let segs = r
            .accessible_topology
            .as_ref()
            .map(|t| t.segments.clone())
            .unwrap_or_default();
        let Some(storage) = r.parameters.get("storage").filter(|s| !s.is_empty()) else {
            return self
                .capacity_of_all(segs.get(REGION), segs.get(ZONE), d)
                .await;
        };
        let region = match segs.get(REGION) {
            Some(r) => r.clone(),
            None if self.clients.len() == 1 => {
                self.clients.keys().next().cloned().unwrap_or_default()
            }
            None => {
                return Err(CtlError::invalid(
                    "accessible_topology",
                    format!("{REGION} is required with several clusters"),
                ));
            }
        };
        let client = self.client(&region)?;
        let rows = self.storage_rows(&client, storage, d).await?;
        let row = match segs.get(ZONE) {
            Some(z) => rows.iter().find(|r| &r.node == z),
            None => rows.iter().find(|r| r.shared == 1).or_else(|| rows.first()),
        };
        let Some(row) = row.filter(|r| r.status == "available") else {
            return Ok((0, 0));
        };
        let st = client.storage_status(&row.node, storage, d).await?;
        if st.enabled == 0 || st.active == 0 {
            return Ok((0, 0));
        }
        // The largest volume is the free space in whole 512 MiB steps.
        let max = st.avail / super::CHUNK * super::CHUNK;
        Ok((st.avail, max))
    }

    /// GetCapacity without a storage (no StorageClass names one): the free
    /// space of every storage this driver may use in the region (or zone),
    /// shared storages counted once, from the cluster's resource list; the
    /// largest volume is what the emptiest single storage holds.
    async fn capacity_of_all(
        &self,
        region: Option<&String>,
        zone: Option<&String>,
        d: Deadline,
    ) -> Result<(u64, u64), CtlError> {
        let (mut total, mut largest) = (0u64, 0u64);
        let mut regions: Vec<&String> = self
            .clients
            .keys()
            .filter(|r| region.is_none_or(|want| want == *r))
            .collect();
        regions.sort();
        for region in regions {
            let client = self.client(region)?;
            let cluster = client.cluster();
            let mut seen_shared = std::collections::HashSet::new();
            for row in client.storages(d).await? {
                let usable = row.status == "available"
                    && row.holds_images()
                    && cluster.storage_allowed(&row.storage)
                    && cluster.node_allowed(&row.node)
                    && zone.is_none_or(|z| *z == row.node);
                if !usable || (row.shared == 1 && !seen_shared.insert(row.storage.clone())) {
                    continue;
                }
                let free = row.maxdisk.saturating_sub(row.disk);
                total = total.saturating_add(free);
                largest = largest.max(free / super::CHUNK * super::CHUNK);
            }
        }
        Ok((total, largest))
    }

    pub async fn validate(
        &self,
        r: &csi::ValidateVolumeCapabilitiesRequest,
        d: Deadline,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, CtlError> {
        if r.volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        if r.volume_capabilities.is_empty() {
            return Err(CtlError::invalid("volume_capabilities", "is required"));
        }
        let id = super::volume_ref("volume_id", &r.volume_id)?;
        let client = self.client_of("volume", &r.volume_id, &id.region)?;
        let exists = match self.node_for(&client, &id, d).await? {
            Some(node) => client
                .volume_info(&node, &id.storage, &id.disk, d)
                .await?
                .is_some(),
            None => false,
        };
        if !exists {
            return Err(CtlError::NotFound(format!(
                "volume {} does not exist",
                r.volume_id
            )));
        }
        Ok(
            match check_capabilities("volume_capabilities", &r.volume_capabilities) {
                Ok(()) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                        volume_context: r.volume_context.clone(),
                        volume_capabilities: r.volume_capabilities.clone(),
                        parameters: r.parameters.clone(),
                        mutable_parameters: r.mutable_parameters.clone(),
                    }),
                    message: String::new(),
                },
                Err(why) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: why,
                },
            },
        )
    }

    /// Volumes owned by the placeholder VMID, with the VMs they are attached to.
    pub async fn list(
        &self,
        r: &csi::ListVolumesRequest,
        d: Deadline,
    ) -> Result<csi::ListVolumesResponse, CtlError> {
        // A full listing (its first page) reads every VM's config again: the
        // attacher's reconcile then compares against what Proxmox says now,
        // and a disk attached or detached outside the driver is seen.
        if r.starting_token.is_empty() {
            for region in self.clients.keys() {
                self.attachments.reread(region).await;
            }
        }
        let mut entries = Vec::new();
        let registered = self.registered_node_ids().await;
        let mut regions: Vec<&String> = self.clients.keys().collect();
        regions.sort();
        for region in regions {
            let client = self.client(region)?;
            let vms = self.vms.all(&client, d).await?;
            let clones: std::collections::BTreeSet<u32> = vms
                .iter()
                .filter(|v| v.has_tag(super::clone::VOLUME_TAG))
                .map(|v| v.vmid)
                .collect();
            let mut seen = std::collections::BTreeSet::new();
            let rows = client.storages(d).await?;
            // A node that is down still has `available` storage rows for
            // minutes (RRD data, see `storage_rows`): its storages are not
            // asked, as every call there answers 595 until it is back. A
            // shared storage is read through a node that is up. Storages
            // without disk images hold no volume.
            let offline = client.offline_nodes(d).await?;
            for row in rows.iter().filter(|r| {
                r.status == "available" && r.holds_images() && !offline.contains(&r.node)
            }) {
                if row.shared == 1 && !seen.insert(row.storage.clone()) {
                    continue;
                }
                let content = client.storage_images(&row.node, &row.storage, d).await?;
                for image in content {
                    let volid = image.volid;
                    let Some((storage, disk)) = volid.split_once(':') else {
                        continue;
                    };
                    // Ours: owned by the placeholder VMID, by a clone's copy
                    // VM, or by a replicated volume's holder (ours, or the Go
                    // driver's: untagged, named after the PV).
                    let owner = crate::volume::owner_of(disk);
                    let holder = owner.is_some_and(|o| {
                        vms.iter()
                            .any(|v| v.vmid == o && super::replicate::holds_replica(v, disk))
                    });
                    if owner != Some(self.controller_vmid)
                        && !owner.is_some_and(|o| clones.contains(&o))
                        && !holder
                    {
                        continue;
                    }
                    let id = VolumeId {
                        region: region.clone(),
                        // A replicated volume's handle has no zone: it follows its holder.
                        zone: (row.shared != 1 && !holder).then(|| row.node.clone()),
                        storage: storage.into(),
                        disk: disk.into(),
                    };
                    let published = match self
                        .attachments
                        .vm_of(
                            &client,
                            &self.vms,
                            &volid,
                            (row.shared != 1).then_some(row.node.as_str()),
                            d,
                        )
                        .await
                    {
                        // Unknown while a node is down: listed, not as published.
                        Err(crate::pve::PveError::Unknown { .. }) => Vec::new(),
                        Err(e) => return Err(e.into()),
                        Ok(found) => match found {
                            Some(vmid) => vms
                                .iter()
                                .find(|vm| vm.vmid == vmid)
                                .map(|vm| vec![self.published_node_id(region, vm, &registered)])
                                .unwrap_or_default(),
                            None => Vec::new(),
                        },
                    };
                    entries.push(csi::list_volumes_response::Entry {
                        volume: Some(csi::Volume {
                            capacity_bytes: image.size as i64,
                            volume_id: id.to_string(),
                            ..Default::default()
                        }),
                        status: Some(csi::list_volumes_response::VolumeStatus {
                            published_node_ids: published,
                            volume_condition: None,
                        }),
                    });
                }
            }
        }
        entries.sort_by(|a, b| {
            let key = |e: &csi::list_volumes_response::Entry| {
                e.volume
                    .as_ref()
                    .map(|v| v.volume_id.clone())
                    .unwrap_or_default()
            };
            key(a).cmp(&key(b))
        });
        let start: usize = if r.starting_token.is_empty() {
            0
        } else {
            r.starting_token
                .parse()
                .ok()
                .filter(|s| *s <= entries.len())
                .ok_or_else(|| {
                    CtlError::Aborted(format!(
                        "starting_token {:?} is not a token this controller gave out",
                        r.starting_token
                    ))
                })?
        };
        if r.max_entries < 0 {
            return Err(CtlError::invalid("max_entries", "must not be negative"));
        }
        let take = if r.max_entries == 0 {
            usize::MAX
        } else {
            r.max_entries as usize
        };
        let page: Vec<_> = entries.iter().skip(start).take(take).cloned().collect();
        let next = start + page.len();
        Ok(csi::ListVolumesResponse {
            entries: page,
            next_token: if next < entries.len() {
                next.to_string()
            } else {
                String::new()
            },
        })
    }

    pub async fn get_volume(
        &self,
        volume_id: &str,
        d: Deadline,
    ) -> Result<csi::ControllerGetVolumeResponse, CtlError> {
        if volume_id.is_empty() {
            return Err(CtlError::invalid("volume_id", "is required"));
        }
        let id = super::volume_ref("volume_id", volume_id)?;
        let client = self.client_of("volume", volume_id, &id.region)?;
        let node = self.node_for(&client, &id, d).await?;
        let info = match &node {
            Some(n) => client.volume_info(n, &id.storage, &id.disk, d).await?,
            None => None,
        };
        let Some(info) = info else {
            return Err(CtlError::NotFound(format!(
                "volume {volume_id} does not exist"
            )));
        };
        let mut problems = Vec::new();
        let mut published = Vec::new();
        if let Some(vmid) = self
            .attachments
            .vm_of(&client, &self.vms, &id.volid(), id.zone.as_deref(), d)
            .await?
            && let Some(vm) = self.vms.node_of(&client, vmid, d).await?
        {
            let cfg = client.vm_config(&vm.node, vmid, d).await?;
            if let Some(lock) = cfg.values.get("lock") {
                problems.push(format!("VM {vmid} is locked ({lock})"));
            }
            let pending = client.vm_pending(&vm.node, vmid, d).await?;
            let slots = drive::slots_with(&cfg.values, &id.volid());
            // The index may be a minute behind: published only if the VM says so.
            if !slots.is_empty() {
                published.push(self.published_node_id(
                    &id.region,
                    &vm,
                    &self.registered_node_ids().await,
                ));
            }
            if pending
                .iter()
                .any(|p| slots.contains(&p.key) && (p.pending.is_some() || p.delete.is_some()))
            {
                problems.push(format!("VM {vmid} has a change of this disk pending"));
            }
        }
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: info.size as i64,
                volume_id: volume_id.to_string(),
                volume_context: HashMap::new(),
                content_source: None,
                accessible_topology: Vec::new(),
            }),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: published,
                volume_condition: Some(csi::VolumeCondition {
                    abnormal: !problems.is_empty(),
                    message: if problems.is_empty() {
                        "volume is healthy".into()
                    } else {
                        problems.join("; ")
                    },
                }),
            }),
        })
    }
}
