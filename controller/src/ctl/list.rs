//! ListVolumes: the driver's volumes on every cluster, with the nodes each
//! is published to.

use proxmox_csi_proto::csi::v1 as csi;

use super::Controller;
use crate::error::CtlError;
use crate::pve::Deadline;
use crate::volume::VolumeId;

impl Controller {
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
}
