//! What one config write of a VM's batch does: a pure function from the
//! VM's config, its pending changes and the batch's jobs to the keys to set
//! and delete, and the answers that need no write. Every rule of a publish
//! or unpublish that Proxmox's state decides lives here: slot choice, WWN
//! uniqueness, the volume limit, read-only against read-write, the
//! protection flag.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Attached, Op, read_back};
use crate::drive::{self, DriveLine, SLOTS};
use crate::error::CtlError;

/// A VM as the batch's round read it.
#[derive(Debug, Clone, Copy)]
pub struct VmView<'a> {
    pub vmid: u32,
    pub config: &'a BTreeMap<String, String>,
    /// Keys with a change Proxmox holds pending.
    pub pending: &'a BTreeSet<String>,
    /// One of the controller's own VMs (a holder), which it may unprotect.
    pub own: bool,
}

impl VmView<'_> {
    pub fn protected(&self) -> bool {
        crate::vms::is_protected(self.config)
    }
}

/// The slot and identity planned for one attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub slot: String,
    pub wwn: String,
    pub serial: String,
}

/// A job's answer by its index in the batch.
pub type Answer = (usize, Result<Option<Attached>, CtlError>);

/// What a round does.
#[derive(Debug)]
pub enum Plan {
    /// Lift the protection flag of the controller's own VM first: Proxmox
    /// refuses to remove a disk of a protected VM. The next round detaches
    /// (and protects again).
    LiftProtection,
    Write(Changes),
}

/// One config write and what it answers.
#[derive(Debug, Default)]
pub struct Changes {
    /// Disk keys to set, with their drive lines.
    pub sets: Vec<(String, String)>,
    /// Disk keys to delete.
    pub deletes: Vec<String>,
    /// The attaches written, by volid.
    pub attaches: HashMap<String, Planned>,
    /// The detaches written, by volid.
    pub detaches: BTreeSet<String>,
    /// Set `protection: 1` (the controller's own VM left unprotected).
    pub protect: bool,
    /// Answers that need no write.
    pub answers: Vec<Answer>,
    /// Volids to record as attached to the VM (before the write: while it
    /// runs, the volume is not free for anyone else) and as absent.
    pub present: Vec<String>,
    pub absent: Vec<String>,
}

impl Changes {
    /// How many disks the write changes.
    pub fn len(&self) -> usize {
        self.sets.len() + self.deletes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this batch's write holds the job for `volid`.
    pub fn holds(&self, volid: &str) -> bool {
        self.attaches.contains_key(volid) || self.detaches.contains(volid)
    }

    /// The form of the config update, guarded by the config's `digest`.
    pub fn form(&self, digest: &str) -> Vec<(&str, String)> {
        let mut form: Vec<(&str, String)> = self
            .sets
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        if !self.deletes.is_empty() {
            form.push(("delete", self.deletes.join(",")));
        }
        if self.protect {
            form.push(("protection", "1".to_string()));
        }
        form.push(("digest", digest.to_string()));
        form
    }
}

/// Plans a round of at most `per_write` changes for `jobs` (by their index).
pub fn plan(vm: &VmView<'_>, jobs: &[&Op], per_write: usize) -> Plan {
    let vmid = vm.vmid;
    let cfg = vm.config;
    let protected = vm.protected();
    let detaching = jobs.iter().any(|op| {
        matches!(op, Op::Detach { .. }) && !drive::slots_with(cfg, op.volid()).is_empty()
    });
    if protected && vm.own && detaching {
        return Plan::LiftProtection;
    }
    let mut taken: BTreeSet<String> = cfg
        .keys()
        .cloned()
        .chain(vm.pending.iter().cloned())
        .collect();
    let wwns: BTreeSet<String> = cfg
        .values()
        .filter_map(|v| {
            DriveLine::parse(v)
                .opts
                .get("wwn")
                .map(|w| w.to_lowercase())
        })
        .collect();
    let mut c = Changes {
        protect: vm.own && !protected,
        ..Changes::default()
    };
    for (i, op) in jobs.iter().enumerate() {
        let slots = drive::slots_with(cfg, op.volid());
        match op {
            Op::Attach {
                volid,
                handle,
                opts,
                limit,
            } => {
                if let Some(slot) = slots.first() {
                    // Published again: the same answer, unless the access differs
                    // (the spec's ALREADY_EXISTS for an incompatible capability).
                    let read_only =
                        |o: &BTreeMap<String, String>| o.get("ro").is_some_and(|v| v == "1");
                    let now = cfg
                        .get(slot)
                        .map(|l| read_only(&DriveLine::parse(l).opts))
                        .unwrap_or(false);
                    if now != read_only(opts) {
                        let (has, asked) = if now {
                            ("read-only", "read-write")
                        } else {
                            ("read-write", "read-only")
                        };
                        c.answers.push((i, Err(CtlError::AlreadyExists(format!(
                            "volume {handle} is published to VM {vmid} {has} ({slot}); it cannot also be published {asked}: unpublish it first"
                        )))));
                        continue;
                    }
                    c.present.push(volid.clone());
                    c.answers.push((i, Ok(Some(read_back(cfg, slot)))));
                    continue;
                }
                // Keyed by volume: a publish retried while the first is
                // queued shares its plan.
                if c.attaches.contains_key(volid) || c.len() >= per_write {
                    continue;
                }
                // Proxmox would take the disk, but neither a detach nor the
                // revert of a failed hot-plug (a delete, qemu-server
                // update_vm_api `revert`) could take it off again while the
                // operator's flag is set.
                if protected && !vm.own {
                    c.answers.push((i, Err(CtlError::FailedPrecondition(format!(
                        "VM {vmid} has Proxmox's protection flag set (protection: 1), under which Proxmox \
                         refuses to remove its disks: {volid} is not attached, as it could not be detached \
                         again. Clear the flag (qm set {vmid} --protection 0, or Options → Protection) and \
                         the attach is retried"
                    )))));
                    continue;
                }
                let ours = volumes_of_the_driver(vm) + c.attaches.len();
                if let Some(max) = limit
                    && ours >= *max as usize
                {
                    c.answers.push((i, Err(CtlError::ResourceExhausted(format!(
                        "VM {vmid} holds {ours} volumes of this driver, the most its node takes (max_volumes_per_node {max}: \
                         the Node label {}, default {}); detach one first",
                        proxmox_csi_common::MAX_VOLUMES_LABEL,
                        proxmox_csi_common::DEFAULT_MAX_VOLUMES
                    )))));
                    continue;
                }
                let Some(slot) = SLOTS
                    .map(|n| format!("scsi{n}"))
                    .find(|s| !taken.contains(s))
                else {
                    c.answers.push((i, Err(CtlError::ResourceExhausted(format!(
                        "VM {vmid} has no free SCSI slot (scsi1–scsi30 are taken); detach a volume first"
                    )))));
                    continue;
                };
                taken.insert(slot.clone());
                // Two disks of one VM never share a WWN: the guest would
                // take them for two paths to one disk.
                let wwn = (0..)
                    .map(|salt| drive::wwn_for(handle, salt))
                    .find(|w| !wwns.contains(w))
                    .unwrap_or_default();
                let serial = drive::serial_for(handle);
                let mut line = DriveLine {
                    volume: volid.clone(),
                    opts: opts.clone(),
                };
                line.opts.insert("wwn".into(), wwn.clone());
                line.opts.insert("serial".into(), serial.clone());
                c.sets.push((slot.clone(), line.render()));
                c.present.push(volid.clone());
                c.attaches
                    .insert(volid.clone(), Planned { slot, wwn, serial });
            }
            Op::Detach { volid } => {
                if protected && !slots.is_empty() {
                    c.answers.push((i, Err(CtlError::FailedPrecondition(format!(
                        "VM {vmid} has Proxmox's protection flag set (protection: 1), under which Proxmox \
                         refuses to remove its disks; {volid} stays attached as {}. Clear the flag \
                         (qm set {vmid} --protection 0, or Options → Protection) and the detach is retried",
                        slots.join(", ")
                    )))));
                } else if slots.is_empty() {
                    c.absent.push(volid.clone());
                    c.answers.push((i, Ok(None)));
                } else if c.detaches.contains(volid) || c.len() < per_write {
                    c.detaches.insert(volid.clone());
                    for s in slots {
                        if !c.deletes.contains(&s) {
                            c.deletes.push(s);
                        }
                    }
                }
            }
        }
    }
    Plan::Write(c)
}

/// Volumes of this driver on the VM: disks another VMID owns (the
/// placeholder or a copy VM).
fn volumes_of_the_driver(vm: &VmView<'_>) -> usize {
    vm.config
        .iter()
        .filter(|(k, v)| {
            drive::is_disk_key(k) && {
                let volume = DriveLine::parse(v).volume;
                let volname = volume.split_once(':').map_or(volume.as_str(), |(_, n)| n);
                crate::volume::owner_of(volname).is_some_and(|o| o != vm.vmid)
            }
        })
        .count()
}

#[cfg(test)]
mod tests;
