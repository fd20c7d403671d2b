//! ZFS replication, as the Go driver does it (upstream-driver.md §5.3):
//! Proxmox replicates guests, not volumes, so a replicated volume belongs to
//! a stopped holder VM named after the PV, keeps `scsi0` of it with
//! `replicate=1`, and has one replication job per other `replicateZones`
//! node. Publishing on another node first migrates the holder there (the
//! replica makes that quick); deleting destroys the holder with its jobs.
//!
//! The handle has no zone (`region//storage/vm-<holder>-<pv>`): the node is
//! wherever the holder is.

use std::collections::HashMap;

use proxmox_csi_proto::csi::v1 as csi;

use super::Controller;
use super::create::{REGION, ZONE};
use super::holder::NewVm;
use crate::error::CtlError;
use crate::params::StorageParams;
use crate::pve::api::VmResource;
use crate::pve::replication::{NewReplicationJob, ReplicationJob as Job};
use crate::pve::{Client, Deadline, PveError};
use crate::volume::{VolumeId, disk_filename};

pub use crate::naming::REPLICATED_TAG;

/// Whether `vm`, the owner of `disk`, is a replicated volume's holder: ours
/// (tagged), or the Go driver's (untagged, named after the PV: pkg/csi/utils.go
/// prepareReplication; deleteReplication finds it by VMID and name alike).
pub fn holds_replica(vm: &VmResource, disk: &str) -> bool {
    vm.has_tag(REPLICATED_TAG)
        || crate::volume::pv_of(disk).is_some_and(|pv| vm.name.as_deref() == Some(pv))
}

/// HA service states of a VM on its way to another node (pve-ha-manager
/// src/PVE/HA/Manager.pm).
fn ha_moving(state: &str) -> bool {
    matches!(state, "migrate" | "relocate")
}

fn denied(what: &str, privilege: &str) -> impl Fn(PveError) -> CtlError {
    let (what, privilege) = (what.to_string(), privilege.to_string());
    move |e: PveError| match e.status().map(|s| s.as_u16()) {
        Some(403) => CtlError::refused(&what, format!("grant {privilege} to the CSI role"), e),
        _ => CtlError::from(e),
    }
}

impl Controller {
    /// The holder of a replicated volume, if `id` is one (`holds_replica`).
    pub async fn replica_holder(
        &self,
        client: &Client,
        id: &VolumeId,
        d: Deadline,
    ) -> Result<Option<VmResource>, CtlError> {
        let Some(owner) = id.owner().filter(|o| *o != self.controller_vmid) else {
            return Ok(None);
        };
        if id.zone.is_some() {
            return Ok(None);
        }
        Ok(self
            .vms
            .node_of(client, owner, d)
            .await?
            .filter(|v| holds_replica(v, &id.disk)))
    }

    /// The slot of `holder` that holds the replicated disk: `scsi0` on ours,
    /// `scsi1` on the Go driver's (its attach takes the first free of
    /// scsi1–scsi29, pkg/csi/utils.go attachVolume).
    pub async fn holder_slot(
        &self,
        client: &Client,
        holder: &VmResource,
        id: &VolumeId,
        d: Deadline,
    ) -> Result<String, CtlError> {
        let cfg = client.vm_config(&holder.node, holder.vmid, d).await?;
        crate::drive::slots_with(&cfg.values, &id.volid())
            .into_iter()
            .next()
            .ok_or_else(|| {
                CtlError::FailedPrecondition(format!(
                    "replicated volume {id}: its holder VM {} does not hold the disk in any slot",
                    holder.vmid
                ))
            })
    }

    /// CreateVolume with `replicate=true` on `node` (one of `replicateZones`).
    pub async fn create_replicated(
        &self,
        client: &Client,
        r: &csi::CreateVolumeRequest,
        params: &StorageParams,
        node: &str,
        size: u64,
        d: Deadline,
    ) -> Result<csi::Volume, CtlError> {
        let name = super::copy::vm_name(&r.name);
        let holder = match self.copy_vm(client, &name, REPLICATED_TAG, d).await? {
            Some(vm) => vm,
            None => {
                let new = NewVm {
                    name: &name,
                    kind: REPLICATED_TAG,
                    description: format!(
                        "Proxmox CSI volume {}, replicated to {}: this VM holds it as scsi0 and moves to the node that uses it.\n{}",
                        r.name,
                        params.replicate_zones.join(", "),
                        super::holder::OWNED
                    ),
                };
                self.new_vm(client, node, &new, d).await?
            }
        };
        // Under the holder's VMID, which says whose it is: no cluster id.
        let filename = disk_filename(holder.vmid, &r.name, None, None);
        let volid = format!("{}:{filename}", params.storage);
        let capacity = match client
            .volume_info(&holder.node, &params.storage, &filename, d)
            .await?
        {
            Some(existing) if existing.size < size => {
                return Err(CtlError::AlreadyExists(format!(
                    "volume {} already exists with {} bytes, less than the {size} asked",
                    r.name, existing.size
                )));
            }
            Some(existing) => existing.size,
            None => {
                client
                    .allocate(
                        &holder.node,
                        &params.storage,
                        &filename,
                        "raw",
                        holder.vmid,
                        size,
                        d,
                    )
                    .await?;
                size
            }
        };
        let cfg = client.vm_config(&holder.node, holder.vmid, d).await?;
        if cfg
            .values
            .get("scsi0")
            .is_none_or(|v| !v.starts_with(&format!("{volid},")))
        {
            let form = [
                ("scsi0", format!("{volid},backup=1,replicate=1")),
                ("digest", cfg.digest),
            ];
            client
                .update_config(&holder.node, holder.vmid, &form, d)
                .await?;
        }
        self.ensure_jobs(client, &holder, params, d).await?;
        let id = VolumeId {
            region: client.region().to_string(),
            zone: None,
            storage: params.storage.clone(),
            disk: filename,
        };
        let topology = params
            .replicate_zones
            .iter()
            .map(|z| csi::Topology {
                segments: HashMap::from([
                    (REGION.to_string(), id.region.clone()),
                    (ZONE.to_string(), z.clone()),
                ]),
            })
            .collect();
        Ok(csi::Volume {
            capacity_bytes: capacity as i64,
            volume_id: id.to_string(),
            volume_context: params.context().into_iter().collect(),
            content_source: None,
            accessible_topology: topology,
        })
    }

    /// One job per `replicateZones` node other than the holder's, numbered
    /// by its place in the list.
    async fn ensure_jobs(
        &self,
        client: &Client,
        holder: &VmResource,
        params: &StorageParams,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let jobs: Vec<Job> = client.replication_jobs(d).await?;
        for (i, zone) in params.replicate_zones.iter().enumerate() {
            if *zone == holder.node
                || jobs
                    .iter()
                    .any(|j| j.guest == holder.vmid && j.target == *zone)
            {
                continue;
            }
            let id = format!("{}-{i}", holder.vmid);
            if jobs.iter().any(|j| j.id == id) {
                continue;
            }
            let schedule = params.replicate_schedule.as_deref().unwrap_or("*/15");
            let job = NewReplicationJob {
                id: &id,
                target: zone,
                schedule,
                comment: "CSI Replication for Persistent Volume",
            };
            client
                .create_replication_job(&job, d)
                .await
                .map_err(denied(
                    &format!("replication job {id} to {zone}"),
                    "VM.Replicate",
                ))?;
            tracing::info!(job = id, target = zone, "replication job created");
        }
        Ok(())
    }

    /// Removes the replication jobs of `holder` with their replicas, and
    /// waits until they are gone. Destroying the holder with `purge=1` only
    /// deletes the job entries (pve-guest-common ReplicationConfig.pm
    /// remove_vmid_jobs): the replicas on the targets would stay behind.
    /// Removing a job only marks it (`remove_job: full`); the scheduler's
    /// next run (at most a minute) deletes the replicas, then the job
    /// (pve-manager API2/ReplicationConfig.pm delete; pve-guest-common
    /// Replication.pm replicate). If that takes longer than the call may
    /// wait, the answer is Unavailable and the next call waits on.
    pub async fn remove_replication(
        &self,
        client: &Client,
        holder: &VmResource,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let mut attempt = 0;
        loop {
            let jobs: Vec<Job> = client.replication_jobs(d).await?;
            let mine: Vec<&Job> = jobs.iter().filter(|j| j.guest == holder.vmid).collect();
            if mine.is_empty() {
                return Ok(());
            }
            for j in mine.iter().filter(|j| j.remove_job.is_none()) {
                client
                    .delete_replication_job(&j.id, d)
                    .await
                    .map_err(denied(
                        &format!("removing replication job {}", j.id),
                        "VM.Replicate",
                    ))?;
                tracing::info!(
                    job = j.id,
                    target = j.target,
                    "replication job removal requested (with its replicas)"
                );
            }
            let wait =
                crate::pve::client::backoff(attempt).max(std::time::Duration::from_millis(500));
            if d.remaining() <= wait {
                let ids: Vec<&str> = mine.iter().map(|j| j.id.as_str()).collect();
                return Err(CtlError::Unavailable(format!(
                    "replication jobs {ids:?} of holder VM {} are being removed with their replicas (Proxmox's scheduler runs each minute); retry",
                    holder.vmid
                )));
            }
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// Waits until HA-managed `holder` is listed on `node` and no longer
    /// moving; Unavailable at the deadline (the next call waits on), and
    /// FailedPrecondition if the HA manager gave up (`error`).
    async fn until_moved(
        &self,
        client: &Client,
        holder: &VmResource,
        node: &str,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let mut wait = std::time::Duration::from_millis(200);
        let mut seen_moving = holder.hastate.as_deref().is_some_and(ha_moving);
        loop {
            let now = self.vms.current(client, holder.vmid, d).await?;
            let state = now
                .as_ref()
                .and_then(|v| v.hastate.clone())
                .unwrap_or_default();
            seen_moving |= ha_moving(&state);
            if state == "error" {
                return Err(CtlError::FailedPrecondition(format!(
                    "holder VM {} is HA-managed and Proxmox's HA manager failed to move it to {node} (hastate error); \
                     see ha-manager status, fix the service and clear its error state",
                    holder.vmid
                )));
            }
            if now.as_ref().is_some_and(|v| v.node == node) && !ha_moving(&state) {
                return Ok(());
            }
            if d.remaining() <= wait {
                // Never seen moving: the HA manager ignored the request (a
                // target outside the resource's group or rules), and asking
                // again would not change that.
                if !seen_moving {
                    return Err(CtlError::FailedPrecondition(format!(
                        "holder VM {} is HA-managed and Proxmox's HA manager did not move it to {node} (hastate {state}); \
                         allow {node} in its HA group or rules (ha-manager status), or remove the holder from HA",
                        holder.vmid
                    )));
                }
                return Err(CtlError::Unavailable(format!(
                    "holder VM {} is HA-managed: Proxmox's HA manager is moving it to {node} (hastate {state}); the next call waits on",
                    holder.vmid
                )));
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_secs(2));
        }
    }

    /// Before a publish on `node`: moves the holder of a replicated volume
    /// there (offline; the replica is already on `node`).
    pub async fn follow_replica(
        &self,
        client: &Client,
        id: &VolumeId,
        node: &str,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let Some(holder) = self.replica_holder(client, id, d).await? else {
            return Ok(());
        };
        if holder.node == node {
            return Ok(());
        }
        // An HA-managed holder already on its way: its move is waited for,
        // not asked for again.
        if !holder.hastate.as_deref().is_some_and(ha_moving) {
            let upid = client
                .migrate_offline(&holder.node, holder.vmid, node, d)
                .await
                .map_err(denied(
                    &format!("moving replicated volume {id} to {node}"),
                    "VM.Migrate",
                ))?;
            client.wait_task(&upid, d).await?;
        }
        // For an HA-managed VM Proxmox only queues the request (a
        // `hamigrate` task that ends before the move; qemu-server
        // API2/Qemu.pm migrate_vm, pve-ha-manager API2/HA/Resources.pm
        // migrate): the holder has moved when the cluster lists it there.
        if holder.hastate.is_some() {
            self.until_moved(client, &holder, node, d).await?;
        }
        self.vms.invalidate(client.region()).await;
        tracing::info!(volume_id = %id, holder = holder.vmid, from = holder.node, to = node, "replicated volume moved");
        Ok(())
    }
}
