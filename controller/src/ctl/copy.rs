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

use proxmox_csi_proto::csi::v1 as csi;
use tokio::sync::Mutex;

use super::Controller;
use super::holder::NewVm;
use crate::drive::DriveLine;
use crate::error::CtlError;
use crate::naming::described::{CLAIM_UID, CREATED, MARK, SOURCE, STORAGE};
use crate::progress::{ClaimRead, CopyJob};
use crate::pve::api::VmResource;
use crate::pve::errors::{Origin, classify, task_type};
use crate::pve::tasks::TaskState;
use crate::pve::{Client, Deadline, ErrorKind};

/// What to copy where.
#[derive(Debug, Clone)]
pub struct CopySpec {
    /// The VM's name: the CSI snapshot or volume name, made DNS-safe.
    pub name: String,
    /// `csi-snapshot` or `csi-volume`.
    pub kind: &'static str,
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

/// A CSI name as a Proxmox VM name (a DNS label: `[a-z0-9-]`, ≤ 63).
pub fn vm_name(csi_name: &str) -> String {
    let mut s: String = csi_name
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(63);
    s.trim_matches('-').to_string()
}

/// A new copy VM's description: what it holds, and its mark (`csi-mark`,
/// random, written once at its creation): a snapshot id names its copy VM
/// by VMID and mark, since Proxmox hands a VMID out again once its VM is
/// gone.
fn describe(spec: &CopySpec, created: i64) -> String {
    let mark = format!("{:08x}", rand::random::<u32>());
    let what = if spec.kind == super::snapshot::SNAPSHOT_TAG {
        "snapshot"
    } else {
        "volume"
    };
    format!(
        "Proxmox CSI {what} {name}, a copy of {src}, held as this VM's unused0.\n\
         {owned}\
         {SOURCE}={src}\n\
         {STORAGE}={storage}\n\
         {CREATED}={created}\n\
         {MARK}={mark}\n\
         {claim}",
        name = spec.name,
        src = spec.source_handle,
        storage = spec.storage,
        owned = super::holder::OWNED,
        claim = spec
            .claim_uid
            .as_ref()
            .map(|u| format!("{CLAIM_UID}={u}\n"))
            .unwrap_or_default(),
    )
}

/// Unix seconds now.
fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_secs() as i64)
        .unwrap_or(0)
}

/// A copy VM's mark (`describe`); `None` for one made before marks.
pub fn mark_of(config: &std::collections::BTreeMap<String, String>) -> Option<String> {
    described(config, MARK)
}

/// A `key=value` line of a copy VM's description.
fn described(config: &std::collections::BTreeMap<String, String>, key: &str) -> Option<String> {
    config.get("description")?.lines().find_map(|l| {
        l.trim()
            .strip_prefix(key)?
            .strip_prefix('=')
            .map(str::to_string)
    })
}

/// `size=` of a drive line, in bytes.
pub fn drive_size(line: &DriveLine) -> Option<u64> {
    let v = line.opts.get("size")?;
    let (num, unit) = v.split_at(
        v.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(v.len()),
    );
    let n: f64 = num.parse().ok()?;
    let mul = match unit {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return None,
    };
    Some((n * mul as f64) as u64)
}

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
            return Ok(super::snapshot::snapshot_of(region, &info));
        }
        let source = described(&cfg.values, SOURCE).unwrap_or_default();
        let storage = described(&cfg.values, STORAGE)
            .or_else(|| {
                crate::volume::VolumeId::parse(&source)
                    .ok()
                    .map(|v| v.storage)
            })
            .unwrap_or_default();
        let created = described(&cfg.values, CREATED)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok(csi::Snapshot {
            size_bytes: 0,
            snapshot_id: super::SnapshotId::Copy {
                region: region.to_string(),
                zone: vm.node.clone(),
                storage,
                vmid: vm.vmid,
                mark: mark_of(&cfg.values),
            }
            .to_string(),
            source_volume_id: source,
            creation_time: super::snapshot::timestamp(created),
            ready_to_use: false,
            group_snapshot_id: String::new(),
        })
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
    async fn copy_info(
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
        let vm = match self.copy_vm(client, &spec.name, spec.kind, d).await? {
            Some(vm) => vm,
            None => {
                let created = now_secs();
                let new = NewVm {
                    name: &spec.name,
                    kind: spec.kind,
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
            let upid = client.start_config_update(&vm.node, vm.vmid, &form, d).await.map_err(|e| match e.status().map(|s| s.as_u16()) {
                Some(403) => CtlError::FailedPrecondition(format!(
                    "copying {}: {}; grant VM.Clone (and Datastore.AllocateSpace on {}) to the CSI role",
                    spec.source,
                    e.message(),
                    spec.storage
                )),
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
                            .abandon_copy(client, &spec.name, spec.kind, job, read, step)
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

    /// Gives up the copy VM `name` (tagged `kind`) of a claim that is gone
    /// (`read`: what the claim read as): destroys it, only if its
    /// description records the UID of the claim it was made for and `read`
    /// says that claim is gone, and no PersistentVolume took the volume. The
    /// answer is always an error: FailedPrecondition once nothing is left to
    /// do, so the provisioner stops; Unavailable while the VM could not be
    /// destroyed (its import still holds its lock), so it calls again.
    pub async fn abandon_copy(
        &self,
        client: &Client,
        name: &str,
        kind: &str,
        job: &CopyJob<'_>,
        read: &ClaimRead,
        d: Deadline,
    ) -> CtlError {
        let claim = job
            .claim
            .as_ref()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .unwrap_or_default();
        let gone = |what: String| {
            CtlError::FailedPrecondition(format!(
                "volume {}: its claim {claim} is not in the Kubernetes API the controller reads \
                 (deleted, or replaced by a claim of the same name): {what}",
                job.volume
            ))
        };
        let again = |e: CtlError| {
            CtlError::Unavailable(format!(
                "volume {}: its claim {claim} is gone, and its copy VM is not destroyed yet: {e}; the next call tries again",
                job.volume
            ))
        };
        if let Some(kube) = self.kube.as_ref() {
            match kube.pv_exists(job.volume).await {
                Ok(true) => {
                    return gone(format!(
                        "the copy is kept, as PersistentVolume {} holds it",
                        job.volume
                    ));
                }
                Ok(false) => {}
                Err(e) => return again(e),
            }
        }
        // Read now, not from the index: a VMID Proxmox handed out again
        // since the index was filled is someone else's VM.
        self.vms.invalidate(client.region()).await;
        let vm = match self.copy_vm(client, name, kind, d).await {
            Ok(Some(vm)) => vm,
            Ok(None) => return gone("nothing was copied".into()),
            Err(e) => return again(e),
        };
        let cfg = match client.vm_config(&vm.node, vm.vmid, d).await {
            Ok(cfg) => cfg,
            Err(e) => return again(e.into()),
        };
        let made_for = described(&cfg.values, CLAIM_UID);
        let Some(made_for) = made_for.filter(|u| read.gone(Some(u))) else {
            return gone(format!(
                "its copy VM {} does not record the claim it was made for as gone, and is kept \
                 (pvecsictl doctor lists such copies)",
                vm.vmid
            ));
        };
        if let Err(e) = self.destroy_copy(client, &vm, d).await {
            return again(e);
        }
        self.progress.abandoned(job).await;
        tracing::info!(
            volume = job.volume,
            vmid = vm.vmid,
            claim_uid = made_for,
            "the claim is gone: its copy VM is destroyed"
        );
        gone(format!("its copy VM {} is destroyed", vm.vmid))
    }

    /// Destroys a copy VM and the volume it owns: the only place its
    /// protection is lifted for good.
    pub async fn destroy_copy(
        &self,
        client: &Client,
        vm: &VmResource,
        d: Deadline,
    ) -> Result<(), CtlError> {
        let cfg = client.vm_config(&vm.node, vm.vmid, d).await?;
        // Read now, not from a cached list: a VM made under the VMID since
        // the driver's was destroyed is someone else's, or another of the
        // driver's (another name). (A Go driver's replication holder carries
        // no tag: its caller proved it by shape.)
        let renamed = vm
            .name
            .as_deref()
            .is_some_and(|n| cfg.values.get("name").map(String::as_str) != Some(n));
        if renamed || (!crate::vms::is_own(&cfg.values) && vm.has_tag(crate::vms::OWN_TAG)) {
            tracing::info!(
                vmid = vm.vmid,
                "the VMID holds another VM now (not this driver's, or of another name): nothing to destroy"
            );
            return Ok(());
        }
        self.retire_vmid(vm.vmid);
        let lifted = self.unprotect(client, &vm.node, vm.vmid, &cfg, d).await?;
        let destroyed = client.destroy_vm(&vm.node, vm.vmid, d).await;
        if destroyed.is_err() {
            // The destroy may have gone through after all: the VMID must be
            // looked up afresh.
            self.vms.invalidate(client.region()).await;
        }
        if destroyed.is_err() && lifted {
            // Still there (a backup's lock, a refusal): protected again,
            // unless the answer was lost and the VM may be gone.
            if client.vm_config(&vm.node, vm.vmid, d).await.is_ok() {
                self.protect_again(client, &vm.node, vm.vmid, d).await;
            }
        }
        destroyed.map_err(|e| match e.status().map(|s| s.as_u16()) {
            Some(403) => CtlError::FailedPrecondition(format!(
                "destroying VM {} ({}): {}; grant VM.Allocate to the CSI role",
                vm.vmid,
                vm.name.as_deref().unwrap_or_default(),
                e.message()
            )),
            _ => CtlError::from(e),
        })?;
        self.imports
            .0
            .lock()
            .await
            .remove(&(client.region().to_string(), vm.vmid));
        self.vms.invalidate(client.region()).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_dns_labels() {
        assert_eq!(vm_name("snapshot-5bc58ec7-AB"), "snapshot-5bc58ec7-ab");
        assert_eq!(vm_name("a_b.c"), "a-b-c");
        assert_eq!(vm_name(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn sizes_and_descriptions_read_back() {
        assert_eq!(
            drive_size(&DriveLine::parse("l:vm-1-disk-0,size=1536M")),
            Some(1536 << 20)
        );
        assert_eq!(
            drive_size(&DriveLine::parse("l:vm-1-disk-0,size=2G")),
            Some(2 << 30)
        );
        assert_eq!(drive_size(&DriveLine::parse("l:vm-1-disk-0")), None);
        let spec = CopySpec {
            name: "snap-1".into(),
            kind: crate::ctl::SNAPSHOT_TAG,
            node: "pve1".into(),
            storage: "local-lvm".into(),
            source: "local-lvm:vm-9999-pvc-a".into(),
            source_handle: "r/pve1/local-lvm/vm-9999-pvc-a".into(),
            min_size: 0,
            claim_uid: Some("5bc58ec7-1f2a-4c3b-9d8e-0123456789ab".into()),
        };
        let cfg = std::collections::BTreeMap::from([(
            "description".to_string(),
            describe(&spec, 1_764_440_000),
        )]);
        assert_eq!(
            described(&cfg, SOURCE).as_deref(),
            Some("r/pve1/local-lvm/vm-9999-pvc-a")
        );
        assert_eq!(described(&cfg, CREATED).as_deref(), Some("1764440000"));
        assert_eq!(
            described(&cfg, CLAIM_UID).as_deref(),
            Some("5bc58ec7-1f2a-4c3b-9d8e-0123456789ab")
        );
    }
}
