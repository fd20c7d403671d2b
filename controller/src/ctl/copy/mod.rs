//! Copies of a volume (snapshots, clones, restores), each kept in a
//! stopped VM of its own: the only per-volume copy Proxmox grants an API
//! token is `import-from` in a VM config (proxmox-api.md §10), and the copy
//! belongs to that VM.
//!
//! The copy VM is named after the CSI object and tagged, so a retry or a
//! restarted controller finds it. Its life, read from its config:
//! 1. no disk: the import task runs (its UPID is remembered) or must start;
//! 2. `scsi0`: imported; grown if a larger size was asked, then released;
//! 3. `unused0`: ready. The volume stays owned by the VM, so destroying the
//!    VM frees it, and it is attached nowhere, so any worker may take it.

use std::collections::HashMap;

use tokio::sync::Mutex;

mod description;
mod destroy;

pub(crate) use description::described;
use description::{describe, now_secs};
pub use description::{drive_size, mark_of, vm_name};

use super::Controller;
use super::holder::NewVm;
use crate::drive::DriveLine;
use crate::error::CtlError;
use crate::naming::described::{CREATED, SOURCE};
use crate::naming::{SNAPSHOT_TAG, VOLUME_TAG};
use crate::progress::{ClaimRead, CopyJob};
use crate::pve::api::VmResource;
use crate::pve::errors::{Origin, classify, task_type};
use crate::pve::tasks::TaskState;
use crate::pve::{Client, Deadline, ErrorKind};

/// What a copy VM holds, written in its kind tag and description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// A VolumeSnapshot's content.
    Snapshot,
    /// A clone's or restore's new volume, until its PersistentVolume takes it.
    Volume,
}

impl CopyKind {
    /// The VM's kind tag.
    pub fn tag(self) -> &'static str {
        match self {
            Self::Snapshot => SNAPSHOT_TAG,
            Self::Volume => VOLUME_TAG,
        }
    }

    /// What the description calls it.
    fn what(self) -> &'static str {
        match self {
            Self::Snapshot => "snapshot",
            Self::Volume => "volume",
        }
    }
}

/// What to copy where.
#[derive(Debug, Clone)]
pub struct CopySpec {
    /// The VM's name: the CSI snapshot or volume name, made DNS-safe.
    pub name: String,
    pub kind: CopyKind,
    pub node: String,
    pub storage: String,
    /// `<storage>:<volume>` to copy.
    pub source: String,
    /// The CSI handle of the source, kept in the VM's description.
    pub source_handle: String,
    /// Grow the copy to at least this many bytes.
    pub min_size: u64,
    /// The UID of the claim a clone or restore is made for, as read before
    /// the copy started: kept in the VM's description (`csi-claim-uid`), the
    /// only claim whose absence lets the controller destroy the copy
    /// (`abandon_copy`).
    pub claim_uid: Option<String>,
}

/// Where a copy stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyState {
    Ready(CopyInfo),
    /// The import runs; the latest progress line of its task.
    Copying {
        vmid: u32,
        node: String,
        created: i64,
        /// The copy VM's mark (`describe`).
        mark: Option<String>,
        progress: String,
    },
}

/// A finished copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyInfo {
    pub vmid: u32,
    /// The copy VM's mark (`describe`), which a snapshot id carries.
    pub mark: Option<String>,
    pub node: String,
    /// `<storage>:<volume>` of the copy.
    pub volid: String,
    pub size: u64,
    pub source_handle: String,
    /// Unix seconds.
    pub created: i64,
}

/// Running imports by (region, VMID), so that the next call reads the task
/// instead of starting another.
#[derive(Debug, Default)]
pub struct Imports(Mutex<HashMap<(String, u32), String>>);

impl Controller {
    /// The copy VM named `name` (tagged `kind`), if any.
    pub async fn copy_vm(
        &self,
        client: &Client,
        name: &str,
        kind: &str,
        d: Deadline,
    ) -> Result<Option<VmResource>, CtlError> {
        Ok(self.vms.own(client, name, kind, d).await?)
    }

    /// Reads a copy VM: ready (with what it holds), or not yet.
    pub async fn read_copy(
        &self,
        client: &Client,
        vm: &VmResource,
        d: Deadline,
    ) -> Result<Option<CopyInfo>, CtlError> {
        let cfg = client.vm_config(&vm.node, vm.vmid, d).await?;
        self.copy_info(client, vm, &cfg.values, d).await
    }

    /// What a copy VM's config says it holds, once ready.
    pub(super) async fn copy_info(
        &self,
        client: &Client,
        vm: &VmResource,
        cfg: &std::collections::BTreeMap<String, String>,
        d: Deadline,
    ) -> Result<Option<CopyInfo>, CtlError> {
        let Some(unused) = cfg.get("unused0") else {
            return Ok(None);
        };
        let volid = DriveLine::parse(unused).volume;
        let (storage, volname) = volid.split_once(':').unwrap_or_default();
        let size = client
            .volume_info(&vm.node, storage, volname, d)
            .await?
            .map(|i| i.size)
            .unwrap_or(0);
        Ok(Some(CopyInfo {
            vmid: vm.vmid,
            mark: mark_of(cfg),
            node: vm.node.clone(),
            volid,
            size,
            source_handle: described(cfg, SOURCE).unwrap_or_default(),
            created: described(cfg, CREATED)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
        }))
    }

    /// Moves the copy one step on: creates its VM, starts or watches the
    /// import, grows and releases the disk. Never waits for the import.
    pub async fn advance_copy(
        &self,
        client: &Client,
        spec: &CopySpec,
        d: Deadline,
    ) -> Result<CopyState, CtlError> {
        let vm = match self.copy_vm(client, &spec.name, spec.kind.tag(), d).await? {
            Some(vm) => vm,
            None => {
                let created = now_secs();
                let new = NewVm {
                    name: &spec.name,
                    kind: spec.kind.tag(),
                    description: describe(spec, created),
                };
                let vm = self.new_vm(client, &spec.node, &new, d).await?;
                tracing::info!(
                    name = spec.name,
                    vmid = vm.vmid,
                    source = spec.source,
                    "copy VM created"
                );
                vm
            }
        };
        let key = (client.region().to_string(), vm.vmid);
        loop {
            let cfg = client.vm_config(&vm.node, vm.vmid, d).await?;
            if let Some(src) = described(&cfg.values, SOURCE)
                && src != spec.source_handle
            {
                return Err(CtlError::AlreadyExists(format!(
                    "{} already exists as a copy of {src} (VM {}), not of {}",
                    spec.name, vm.vmid, spec.source_handle
                )));
            }
            let copying = |progress: String| CopyState::Copying {
                vmid: vm.vmid,
                node: vm.node.clone(),
                created: described(&cfg.values, CREATED)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0),
                mark: mark_of(&cfg.values),
                progress,
            };
            if let Some(info) = self.copy_info(client, &vm, &cfg.values, d).await? {
                // A copy VM of an earlier version holds its data unprotected.
                if !crate::vms::is_protected(&cfg.values) {
                    let form = [
                        ("protection", "1".to_string()),
                        ("digest", cfg.digest.clone()),
                    ];
                    client.update_config(&vm.node, vm.vmid, &form, d).await?;
                }
                return Ok(CopyState::Ready(info));
            }
            if let Some(scsi0) = cfg.values.get("scsi0") {
                let line = DriveLine::parse(scsi0);
                if drive_size(&line).is_some_and(|s| s < spec.min_size) {
                    client
                        .resize(&vm.node, vm.vmid, "scsi0", spec.min_size, d)
                        .await?;
                    continue;
                }
                // Without `force` the VM keeps its disk as unused0.
                self.remove_own_drives(client, &vm.node, vm.vmid, cfg, &["scsi0"], d)
                    .await?;
                continue;
            }
            let running = self.imports.0.lock().await.get(&key).cloned();
            if let Some(upid) = running {
                match client.task_state(&upid, d).await? {
                    TaskState::Running(progress) => {
                        return Ok(copying(
                            progress.unwrap_or_else(|| format!("task {upid} started")),
                        ));
                    }
                    TaskState::Done => {
                        self.imports.0.lock().await.remove(&key);
                        continue;
                    }
                    TaskState::Failed(exit) => {
                        let kind = classify(None, &exit, Origin::Task(task_type(&upid)));
                        // A refusal answers the same for a minute (the
                        // sidecar's retries meanwhile), then the import is
                        // tried again: the privilege may have been granted.
                        let age = crate::pve::tasks::upid_started(&upid).map(|t| now_secs() - t);
                        if kind == ErrorKind::PermissionDenied && age.is_some_and(|a| a < 60) {
                            return Err(CtlError::FailedPrecondition(format!(
                                "copying {} into VM {}: Proxmox refused it ({exit}); grant the privilege it names to the CSI role (docs/proxmox-role.md)",
                                spec.source, vm.vmid
                            )));
                        }
                        self.imports.0.lock().await.remove(&key);
                        // A lock held by another task: this copy VM's (an
                        // import from before a restart) or the source's owner
                        // VM's (qemu-server locks it for the whole import).
                        // Still copying, as far as the caller is concerned.
                        if kind == ErrorKind::Busy {
                            return Ok(copying(format!(
                                "the last import waited for a lock in vain ({exit}); the next call starts it again"
                            )));
                        }
                        return Err(CtlError::Unavailable(format!(
                            "copying {} into VM {} failed: {exit}; the next call starts it again",
                            spec.source, vm.vmid
                        )));
                    }
                }
            }
            // Thick LVM with volume chains makes a new disk qcow2, an LV
            // whose size Proxmox reads only where it is active; a raw one
            // it reads anywhere (pve-storage LVMPlugin.pm get_formats,
            // volume_size_info): a copy there is raw.
            let format = if self.is_thick_lvm(client, &spec.storage, d).await? {
                ",format=raw"
            } else {
                ""
            };
            let form = [
                (
                    "scsi0",
                    format!(
                        "{}:0,import-from={},backup=0{format}",
                        spec.storage, spec.source
                    ),
                ),
                ("digest", cfg.digest.clone()),
            ];
            let upid = client
                .start_config_update(&vm.node, vm.vmid, &form, d)
                .await
                .map_err(|e| match e.status().map(|s| s.as_u16()) {
                    Some(403) => CtlError::refused(
                        format!("copying {}", spec.source),
                        format!(
                            "grant VM.Clone (and Datastore.AllocateSpace on {}) to the CSI role",
                            spec.storage
                        ),
                        e,
                    ),
                    _ => CtlError::from(e),
                })?;
            let Some(upid) = upid else { continue };
            tracing::info!(name = spec.name, vmid = vm.vmid, upid, "import started");
            self.imports
                .0
                .lock()
                .await
                .insert(key.clone(), upid.clone());
            return Ok(copying(format!("task {upid} started")));
        }
    }

    /// Like `advance_copy`, then waits for the import while the deadline
    /// leaves room, reporting its progress to the claim (`progress`). A
    /// copy whose claim is gone is destroyed once its import ends
    /// (`abandon_copy`): nothing would ever take it.
    pub async fn finish_copy(
        &self,
        client: &Client,
        spec: &CopySpec,
        job: &CopyJob<'_>,
        d: Deadline,
    ) -> Result<CopyState, CtlError> {
        // Room to answer after a step or a pause, with the progress seen last.
        let margin = std::time::Duration::from_millis(300);
        let mut pause = std::time::Duration::from_millis(500);
        // What the claim read as once it was gone (`abandon_copy`).
        let mut abandoned: Option<ClaimRead> = None;
        loop {
            let step =
                Deadline(d.0.checked_sub(margin).unwrap_or(d.0)).capped(self.operation_limit);
            let state = self.advance_copy(client, spec, step).await?;
            let kube = self.kube.as_ref();
            let expected = spec.claim_uid.as_deref();
            match &state {
                CopyState::Ready(info) => {
                    if let Some(read) = &abandoned {
                        return Err(self
                            .abandon_copy(client, &spec.name, spec.kind.tag(), job, read, step)
                            .await);
                    }
                    self.progress.copied(kube, job, info.size).await;
                    return Ok(state);
                }
                CopyState::Copying { progress, .. } if abandoned.is_none() => {
                    let read = self.progress.copying(kube, job, progress, expected).await;
                    if read.gone(expected) {
                        tracing::warn!(
                            volume = job.volume,
                            "the claim is gone: its copy is destroyed once its import ends"
                        );
                        self.progress.abandoned(job).await;
                        abandoned = Some(read);
                    }
                }
                CopyState::Copying { .. } => {}
            }
            let wait = pause.min(d.remaining().saturating_sub(margin * 2));
            if wait.is_zero() {
                if abandoned.is_some() {
                    // In progress for the provisioner, which calls again
                    // with the claim it remembers.
                    return Err(CtlError::Aborted(format!(
                        "volume {}: its claim is gone; the copy is destroyed once its import ends; call again",
                        job.volume
                    )));
                }
                return Ok(state);
            }
            tokio::time::sleep(wait).await;
            // A long copy is read every 2 s: three API calls a look.
            pause = (pause * 2).min(std::time::Duration::from_secs(2));
        }
    }
}
