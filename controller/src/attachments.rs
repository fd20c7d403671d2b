//! Volume → VM for a whole region, so that "attached elsewhere?" needs no
//! scan per call. Built from every VM's config, kept current by our own
//! attaches and detaches, and read again when it proves stale or when the
//! attacher's reconcile lists every volume (ListVolumes, every minute), so
//! that changes made in the Proxmox UI are seen.
//!
//! Errors go one way only: an entry for a VM that no longer holds the disk
//! is harmless (every refusal is confirmed against that VM's config first);
//! a missing entry is not, so an attach is recorded when it is planned, and
//! the decisions that cannot be undone (deleting a disk, growing it through
//! a holder VM) read the VMs that could hold it (`truth`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tokio::sync::Mutex;

use crate::drive::{self, DriveLine};
use crate::pve::api::{VmConfig, VmResource};
use crate::pve::{Client, Deadline, ErrorKind, PveError};
use crate::vms::VmIndex;

#[derive(Debug, Default)]
pub struct Attachments {
    map: Mutex<HashMap<String, Region>>,
}

#[derive(Debug, Default)]
struct Region {
    found: HashMap<String, u32>,
    /// VMs whose config could not be read (their node down, answering
    /// 595): vmid → (node, why, when last tried). Tried again by a lookup
    /// that misses, at most every `RETRY_UNREADABLE`.
    unreadable: BTreeMap<u32, (String, String, std::time::Instant)>,
    /// VMs read at least once. While one is unreadable its last-known disks
    /// stand: its config cannot change while its node does not answer.
    read_once: BTreeSet<u32>,
    /// To be read again at the next lookup.
    stale: bool,
    /// Bumped at each read of the whole region, so that several callers who
    /// met the same stale entry cause one new read, not one each.
    generation: u64,
}

/// How long one VM's config read may take while the index is built: a VM
/// on a node that is down must not hold up every other.
const READ_ONE: std::time::Duration = std::time::Duration::from_secs(3);

/// How often a lookup that misses tries again the config of a VM whose
/// node Proxmox reports offline: a ListVolumes looks up every volume, and
/// a node that is down must cost it one wait, not one per volume.
const RETRY_UNREADABLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Config reads in flight while the index is built: a region of hundreds
/// of VMs is read in a few round trips, not one VM after another.
const READS_IN_FLIGHT: usize = 16;

/// VM `vm`'s config, within `READ_ONE` of when its read starts. A VM that
/// moved (a migration, HA) answers "Configuration file … does not exist"
/// on the node the VM list still names: it is read where the cluster lists
/// it now, and only a VM the cluster no longer lists counts as gone.
async fn read_one(
    client: &Client,
    index: &VmIndex,
    vm: VmResource,
    d: Deadline,
) -> (VmResource, Result<VmConfig, PveError>) {
    let short = Deadline(d.0.min(std::time::Instant::now() + READ_ONE));
    match client.vm_config(&vm.node, vm.vmid, short).await {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            match index.current(client, vm.vmid, short).await {
                Ok(Some(now)) if now.node != vm.node => {
                    let cfg = client.vm_config(&now.node, vm.vmid, short).await;
                    (now, cfg)
                }
                // Still listed where its config is not: the list may lag a
                // move that just happened; unknown for now, not gone.
                Ok(Some(now)) => {
                    let what = format!(
                        "VM {} is listed on {} but its config is not there ({e})",
                        now.vmid, now.node
                    );
                    (
                        vm,
                        Err(PveError::Unknown {
                            region: client.region().to_string(),
                            what,
                        }),
                    )
                }
                Ok(None) => (vm, Err(e)),
                Err(listing) => (vm, Err(listing)),
            }
        }
        other => (vm, other),
    }
}

/// The VMs whose disks are attachments: not the controller's own copy VMs
/// and replicated volumes' holders (see ctl), and for a local volume
/// (`zone`) only the VMs of its Proxmox node.
async fn candidates(
    client: &Client,
    index: &VmIndex,
    zone: Option<&str>,
    d: Deadline,
) -> Result<Vec<VmResource>, PveError> {
    let copies = |v: &VmResource| crate::naming::COPY_TAGS.iter().any(|t| v.has_tag(t));
    Ok(index
        .all(client, d)
        .await?
        .into_iter()
        .filter(|v| !copies(v) && zone.is_none_or(|z| v.node == z))
        .collect())
}

impl Region {
    /// Reads the disks of `vms` into the index, `READS_IN_FLIGHT` at a time.
    async fn read_all(
        &mut self,
        client: &Client,
        index: &VmIndex,
        vms: &[VmResource],
        d: Deadline,
    ) -> Result<(), PveError> {
        use futures::stream::{self, StreamExt};
        let reads = vms.iter().cloned().map(|vm| read_one(client, index, vm, d));
        let read: Vec<_> = stream::iter(reads)
            .buffer_unordered(READS_IN_FLIGHT)
            .collect()
            .await;
        for (vm, cfg) in read {
            self.take(&vm, cfg)?;
        }
        Ok(())
    }

    /// Like `read_all`, without asking a node Proxmox reports offline
    /// (every call there answers 595 after a wait): its VMs are unreadable.
    async fn read_all_up(
        &mut self,
        client: &Client,
        index: &VmIndex,
        vms: Vec<VmResource>,
        d: Deadline,
    ) -> Result<(), PveError> {
        let offline = client.offline_nodes(d).await?;
        let (down, up): (Vec<_>, Vec<_>) = vms.into_iter().partition(|v| offline.contains(&v.node));
        for vm in down {
            self.unreadable.insert(
                vm.vmid,
                (
                    vm.node.clone(),
                    format!("its node {} is offline", vm.node),
                    std::time::Instant::now(),
                ),
            );
        }
        self.read_all(client, index, &up, d).await
    }

    /// VM `vm`'s config read into the index. A node that does not answer
    /// leaves the VM unreadable instead of failing the whole index; a VM
    /// deleted since the VM list was read holds nothing.
    fn take(&mut self, vm: &VmResource, cfg: Result<VmConfig, PveError>) -> Result<(), PveError> {
        match cfg {
            Ok(cfg) => {
                self.unreadable.remove(&vm.vmid);
                self.read_once.insert(vm.vmid);
                self.found.retain(|_, v| *v != vm.vmid);
                for (k, v) in &cfg.values {
                    if !drive::is_disk_key(k) {
                        continue;
                    }
                    let volume = DriveLine::parse(v).volume;
                    // A VM holding a disk it owns is its holder, not an
                    // attachment: a replicated volume's holder (ours, or the
                    // Go driver's untagged one), a VM's own disks. The Go
                    // driver's rule too (pkg/csi/utils.go
                    // getVMByAttachedVolume: "Skip the storage owner VM").
                    let volname = volume.split_once(':').map_or(volume.as_str(), |(_, n)| n);
                    if crate::volume::owner_of(volname) == Some(vm.vmid) {
                        continue;
                    }
                    self.found.insert(volume, vm.vmid);
                }
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.unreadable.remove(&vm.vmid);
                self.found.retain(|_, v| *v != vm.vmid);
                Ok(())
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(vmid = vm.vmid, node = vm.node, error = %e, "VM config unreadable; its disks are the last ones read until its node answers");
                self.unreadable.insert(
                    vm.vmid,
                    (vm.node.clone(), e.to_string(), std::time::Instant::now()),
                );
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The region read again; VMs unreadable now keep what they were last
    /// read to hold.
    async fn reread(
        &mut self,
        client: &Client,
        index: &VmIndex,
        d: Deadline,
    ) -> Result<(), PveError> {
        let vms = candidates(client, index, None, d).await?;
        let mut fresh = Region {
            generation: self.generation + 1,
            ..Region::default()
        };
        fresh.read_all_up(client, index, vms, d).await?;
        for vmid in fresh.unreadable.keys() {
            if self.read_once.contains(vmid) {
                fresh.read_once.insert(*vmid);
                fresh.found.extend(
                    self.found
                        .iter()
                        .filter(|(_, v)| **v == *vmid)
                        .map(|(k, v)| (k.clone(), *v)),
                );
            }
        }
        *self = fresh;
        Ok(())
    }

    /// VMs that could hold a volume of `zone` and were never read.
    fn unknown(&self, zone: Option<&str>) -> Vec<String> {
        self.unreadable
            .iter()
            .filter(|(vmid, (node, _, _))| {
                !self.read_once.contains(vmid) && zone.is_none_or(|z| z == node)
            })
            .map(|(vmid, (node, why, _))| format!("VM {vmid} on {node} ({why})"))
            .collect()
    }
}

impl Attachments {
    /// The VM `volid` is attached to, and the index generation that said
    /// so. `zone` is the node of a local volume (`None`: shared storage):
    /// while some VM that could hold it was never read, a volume not found
    /// is "unknown" (transient), never a guess.
    async fn lookup(
        &self,
        client: &Client,
        index: &VmIndex,
        volid: &str,
        zone: Option<&str>,
        d: Deadline,
    ) -> Result<(Option<u32>, u64), PveError> {
        // Held across the reads: a lookup never sees half an index. A
        // whole region is read at most once a minute (ListVolumes) or when
        // an entry proved stale, READS_IN_FLIGHT at a time.
        let mut map = self.map.lock().await;
        let region = map
            .entry(client.region().to_string())
            .or_insert_with(|| Region {
                stale: true,
                ..Region::default()
            });
        if region.stale {
            region.reread(client, index, d).await?;
        }
        if let Some(vmid) = region.found.get(volid) {
            return Ok((Some(*vmid), region.generation));
        }
        let mut retry = Vec::new();
        // A VM on a node Proxmox still reports offline is tried again only
        // now and then; one whose node is back, at once.
        let offline = if region.unreadable.is_empty() {
            Default::default()
        } else {
            client.offline_nodes(d).await?
        };
        let due: Vec<u32> = region
            .unreadable
            .iter()
            .filter(|(_, (node, _, tried))| {
                !offline.contains(node) || tried.elapsed() >= RETRY_UNREADABLE
            })
            .map(|(vmid, _)| *vmid)
            .collect();
        for vmid in due {
            if let Some(vm) = index.node_of(client, vmid, d).await? {
                retry.push(vm);
            }
        }
        region.read_all(client, index, &retry, d).await?;
        if let Some(vmid) = region.found.get(volid) {
            return Ok((Some(*vmid), region.generation));
        }
        let unknown = region.unknown(zone);
        if unknown.is_empty() {
            Ok((None, region.generation))
        } else {
            Err(PveError::Unknown {
                region: client.region().to_string(),
                what: format!(
                    "whether {volid} is attached is unknown: the config of {} could not be read",
                    unknown.join(", ")
                ),
            })
        }
    }

    /// The VM `volid` is attached to, by the index (see `lookup`).
    pub async fn vm_of(
        &self,
        client: &Client,
        index: &VmIndex,
        volid: &str,
        zone: Option<&str>,
        d: Deadline,
    ) -> Result<Option<u32>, PveError> {
        Ok(self.lookup(client, index, volid, zone, d).await?.0)
    }

    /// Like `vm_of`, but a hit is confirmed by that VM's config, read where
    /// the VM is now, before anyone is refused because of it: an entry
    /// Proxmox no longer shows (a disk detached in the UI) makes the region
    /// be read again, and the answer is what Proxmox says now.
    pub async fn confirmed(
        &self,
        client: &Client,
        index: &VmIndex,
        volid: &str,
        zone: Option<&str>,
        d: Deadline,
    ) -> Result<Option<u32>, PveError> {
        let (Some(vmid), generation) = self.lookup(client, index, volid, zone, d).await? else {
            return Ok(None);
        };
        if holds(client, index, vmid, volid, d).await? {
            return Ok(Some(vmid));
        }
        tracing::info!(
            volid,
            vmid,
            "the attachment index was stale (changed outside the driver); reading every VM again"
        );
        if let Some(r) = self.map.lock().await.get_mut(client.region())
            && r.generation == generation
        {
            r.stale = true;
        }
        self.vm_of(client, index, volid, zone, d).await
    }

    /// Where `volid` is attached, from the configs of every VM that could
    /// hold it, read now (not the index): for what cannot be undone,
    /// deleting a disk or growing it through a holder VM. The index is
    /// corrected with what was read.
    pub async fn truth(
        &self,
        client: &Client,
        index: &VmIndex,
        volid: &str,
        zone: Option<&str>,
        d: Deadline,
    ) -> Result<Option<u32>, PveError> {
        let vms = candidates(client, index, zone, d).await?;
        let mut now = Region::default();
        // Every VM asked, its node offline or not: this read is the truth
        // of what cannot be undone (a VM on a node that is down costs one
        // READ_ONE wait).
        now.read_all(client, index, &vms, d).await?;
        let mut map = self.map.lock().await;
        let known = map.get(client.region());
        // A VM that does not answer now holds what it held when last read
        // (its config cannot change while its node is down); one never read
        // leaves the answer unknown.
        let held = now.found.get(volid).copied().or_else(|| {
            known.and_then(|r| {
                r.found
                    .get(volid)
                    .copied()
                    .filter(|vmid| now.unreadable.contains_key(vmid) && r.read_once.contains(vmid))
            })
        });
        let never_read: Vec<String> = now
            .unreadable
            .iter()
            .filter(|(vmid, _)| !known.is_some_and(|r| r.read_once.contains(vmid)))
            .map(|(vmid, (node, why, _))| format!("VM {vmid} on {node} ({why})"))
            .collect();
        if held.is_none() && !never_read.is_empty() {
            return Err(PveError::Unknown {
                region: client.region().to_string(),
                what: format!(
                    "whether {volid} is attached is unknown: the config of {} could not be read",
                    never_read.join(", ")
                ),
            });
        }
        if let Some(r) = map.get_mut(client.region()) {
            match held {
                Some(vmid) => r.found.insert(volid.to_string(), vmid),
                None => r.found.remove(volid),
            };
        }
        Ok(held)
    }

    /// For what cannot be undone: a hit confirmed (`confirmed`), a miss
    /// checked against the configs of the VMs that could hold the volume
    /// (`truth`), so a disk attached in the Proxmox UI since the last
    /// reconcile is not deleted or grown behind its VM's back.
    pub async fn certain(
        &self,
        client: &Client,
        index: &VmIndex,
        volid: &str,
        zone: Option<&str>,
        d: Deadline,
    ) -> Result<Option<u32>, PveError> {
        match self.confirmed(client, index, volid, zone, d).await? {
            Some(vmid) => Ok(Some(vmid)),
            None => self.truth(client, index, volid, zone, d).await,
        }
    }

    /// Reads every VM's config again at the next lookup. The attacher's
    /// reconcile (ListVolumes, every minute) asks for it, so changes made
    /// outside the driver are seen within a minute.
    pub async fn reread(&self, region: &str) {
        if let Some(r) = self.map.lock().await.get_mut(region) {
            r.stale = true;
        }
    }

    /// `volid` is (or is about to be) on VM `vmid`.
    pub async fn record(&self, region: &str, volid: &str, vmid: u32) {
        if let Some(m) = self.map.lock().await.get_mut(region)
            && let Some(old) = m.found.insert(volid.to_string(), vmid)
            && old != vmid
        {
            tracing::warn!(
                volid,
                vmid,
                was = old,
                "attachment index: the volume was recorded on another VM"
            );
        }
    }

    /// `volid` is not on VM `vmid`: its entry goes if it named that VM
    /// (an entry naming another VM is that VM's to confirm).
    pub async fn record_absent(&self, region: &str, volid: &str, vmid: u32) {
        if let Some(m) = self.map.lock().await.get_mut(region)
            && m.found.get(volid) == Some(&vmid)
        {
            m.found.remove(volid);
        }
    }
}

/// Whether VM `vmid`'s config has `volid` in a disk slot, read where the VM
/// is now (a VM that moved is followed; one that is gone holds nothing).
async fn holds(
    client: &Client,
    index: &VmIndex,
    vmid: u32,
    volid: &str,
    d: Deadline,
) -> Result<bool, PveError> {
    for fresh in [false, true] {
        let vm = if fresh {
            index.current(client, vmid, d).await?
        } else {
            index.node_of(client, vmid, d).await?
        };
        let Some(vm) = vm else { return Ok(false) };
        match client.vm_config(&vm.node, vmid, d).await {
            Ok(cfg) => return Ok(!drive::slots_with(&cfg.values, volid).is_empty()),
            Err(e) if e.kind() == ErrorKind::NotFound && !fresh => continue,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}
