//! The controller's own VMs, all stopped and tagged `proxmox-csi`:
//! - a holder per Proxmox node, which a detached disk visits when Proxmox
//!   can only act on it through a VM (resizing it offline);
//! - a copy VM per snapshot or cloned volume (see `copy`).
//!
//! Creating one needs `NEW_VM_PRIVILEGES` beyond the minimal role; the
//! error says so.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Controller;
use crate::error::{CtlError, NoVmOfItsOwn};
use crate::pve::api::{VmConfig, VmResource};
use crate::pve::{Client, Deadline, ErrorKind, PveError};
use crate::vms::is_protected;

pub use crate::naming::{DRIVER_TAGS, HOLDER_TAG, OWN_TAG as TAG};

pub fn holder_name(node: &str) -> String {
    format!("proxmox-csi-holder-{node}")
}

pub use crate::naming::OWNED;

/// A new VM's identity and notes.
#[derive(Debug)]
pub struct NewVm<'a> {
    pub name: &'a str,
    /// Its kind, tagged beside `proxmox-csi`: `csi-holder`, `csi-snapshot`, `csi-volume`.
    pub kind: &'a str,
    pub description: String,
}

/// Proxmox refused a tag (its tag policy), as opposed to another privilege.
fn is_tag_refusal(e: &PveError) -> bool {
    e.kind() == ErrorKind::PermissionDenied && crate::pve::errors::is_tag_refusal(&e.message())
}

impl Controller {
    /// The holder VM on `node`, created (stopped, no disks) if missing.
    pub async fn holder(&self, client: &Client, node: &str, d: Deadline) -> Result<u32, CtlError> {
        let name = holder_name(node);
        let _one_at_a_time = self
            .holder_locks
            .lock(format!("{}/{name}", client.region()))
            .await;
        if let Some(vm) = self.vms.own(client, &name, HOLDER_TAG, d).await? {
            // The one on this node: a holder moved away (a bulk migration,
            // HA) keeps its name, and must not make every later expansion
            // here create another.
            let here = if vm.node == node {
                Some(vm)
            } else {
                self.vms.all(client, d).await?.into_iter().find(|v| {
                    v.node == node
                        && v.name.as_deref() == Some(name.as_str())
                        && v.has_tag(TAG)
                        && v.has_tag(HOLDER_TAG)
                })
            };
            if let Some(vm) = here {
                self.attacher.own_vm(client.region(), vm.vmid);
                return Ok(vm.vmid);
            }
        }
        let vm = NewVm {
            name: &name,
            kind: HOLDER_TAG,
            description: format!(
                "Proxmox CSI holder VM of node {node}: volumes visit it while Proxmox changes them offline (a resize).\n{OWNED}"
            ),
        };
        let vmid = self.new_vm(client, node, &vm, d).await?.vmid;
        self.attacher.own_vm(client.region(), vmid);
        tracing::info!(node, vmid, "holder VM created");
        Ok(vmid)
    }

    /// Creates a stopped VM without disks on `node` under the next free
    /// VMID (another VMID is tried when a concurrent create took it).
    pub async fn new_vm(
        &self,
        client: &Client,
        node: &str,
        vm: &NewVm<'_>,
        d: Deadline,
    ) -> Result<VmResource, CtlError> {
        let denied = |e: PveError| match e.kind() {
            ErrorKind::PermissionDenied if !is_tag_refusal(&e) => {
                CtlError::NoVmOfItsOwn(Box::new(NoVmOfItsOwn {
                    node: node.to_string(),
                    name: vm.name.to_string(),
                    privileges: NEW_VM_PRIVILEGES.join(", "),
                    source: e,
                }))
            }
            _ => CtlError::from(e),
        };
        // Two fixed tags, the same on every VM of a kind: a cluster whose tag
        // policy (datacenter.cfg user-tag-access, registered-tags) admits
        // them once admits every later VM (pve-guest-common GuestHelpers.pm
        // assert_tag_permissions checks only tags that change).
        let tags = format!("{TAG};{}", vm.kind);
        // A VMID that owns disks (another cluster's controllerVmID, a Go
        // driver's 9999, a deleted VM's leftovers) is never taken: they
        // would be listed under this VM, and a destroy from the UI with
        // "destroy unreferenced disks" would free them.
        let owners = client.disk_owners(node, d).await.map_err(denied)?;
        self.none_being_created(client, d).await?;
        // A create whose answer was lost may still land: pveproxy answers
        // 596 once its wait for pvedaemon runs out (pve-http-server
        // src/PVE/APIServer/AnyEvent.pm proxy_request, `timeout => 30`) while
        // the call still waits for one of pvedaemon's workers (pve-manager
        // PVE/Service/pvedaemon.pm `max_workers`), which carries it out
        // later. The next create takes the same VMID, so that only one of
        // them makes the VM (qemu-server create_vm refuses a VMID in use).
        let mut doubted = self.recent_vmids.lost_create(client.region(), vm.name);
        let mut last = String::new();
        for _ in 0..5 {
            let vmid = match doubted {
                Some(vmid) => vmid,
                None => self.next_vmid(client, &owners, d).await?,
            };
            let form = vec![
                ("vmid", vmid.to_string()),
                ("name", vm.name.to_string()),
                ("memory", "128".to_string()),
                ("cores", "1".to_string()),
                ("scsihw", "virtio-scsi-single".to_string()),
                ("description", vm.description.clone()),
            ];
            let identity = [
                ("tags", tags.clone()),
                // Proxmox then refuses to destroy the VM or remove its
                // disks until the flag is lifted (pve-guest-common
                // AbstractConfig.pm check_protection, from qemu-server
                // Qemu.pm destroy_vm and update_vm_api): a VM holding a
                // volume's data is not lost to a click or to IaC that
                // prunes unknown VMs.
                ("protection", "1".to_string()),
            ];
            let with_identity: Vec<(&str, String)> = form
                .iter()
                .cloned()
                .chain(identity.iter().cloned())
                .collect();
            let created = match client.create_vm(node, &with_identity, d).await {
                // qemu-server 9.2's create_vm checks the tags of a new VM
                // against an old tag list of `{}` (Qemu.pm create_vm:
                // assert_tag_permissions($vmid, {}, …)), which a restrictive
                // policy refuses whatever the tags; update_vm checks them
                // right. The VM is made without them, then given them.
                Err(e) if is_tag_refusal(&e) => {
                    tracing::info!(vmid, error = %e, "the tag policy refused tags at creation; tagging after");
                    match client.create_vm(node, &form, d).await {
                        Ok(()) => self.tag_new_vm(client, node, vmid, &identity, d).await,
                        Err(e) => Err(e),
                    }
                }
                other => other,
            };
            match created {
                Ok(()) => return Ok(self.made(client, node, vmid, vm.name, Some(tags)).await),
                // The create whose answer was lost landed meanwhile: its VM,
                // if it is this one.
                Err(e) if e.kind() == ErrorKind::AlreadyExists && doubted == Some(vmid) => {
                    doubted = None;
                    if let Some(found) = self.landed(client, node, vmid, vm.name, d).await? {
                        return Ok(found);
                    }
                    last = e.message();
                }
                // A concurrent create took the VMID (qemu-server create_vm:
                // "unable to create VM N - VM N already exists on node 'x'").
                Err(e) if e.kind() == ErrorKind::AlreadyExists => last = e.message(),
                // Nothing under the id, unless the answer was lost (then the
                // create may have happened and the id stays kept, for this
                // VM's next create).
                Err(e) if e.is_transient() => {
                    self.recent_vmids.lost(vmid, client.region(), vm.name);
                    return Err(denied(e));
                }
                Err(e) => {
                    self.recent_vmids.forget(vmid);
                    return Err(denied(e));
                }
            }
        }
        Err(CtlError::Unavailable(format!(
            "creating VM {} on {node}: every VMID tried was taken meanwhile ({last})",
            vm.name
        )))
    }

    /// VM `vmid` on `node`, which an earlier create of `name` whose answer
    /// was lost may have made: it, if its config names it; Unavailable while
    /// it is still being created (`lock: create`, no name yet); `None` if it
    /// is another VM.
    async fn landed(
        &self,
        client: &Client,
        node: &str,
        vmid: u32,
        name: &str,
        d: Deadline,
    ) -> Result<Option<VmResource>, CtlError> {
        let cfg = client.vm_config(node, vmid, d).await?;
        match cfg.values.get("name") {
            Some(n) if n == name => {
                let tags = cfg.values.get("tags").cloned();
                Ok(Some(self.made(client, node, vmid, name, tags).await))
            }
            None if cfg.values.get("lock").map(String::as_str) == Some("create") => {
                self.recent_vmids.lost(vmid, client.region(), name);
                Err(CtlError::Unavailable(format!(
                    "VM {vmid}, created for {name} by a call whose answer was lost, is not written yet; the next call finds it"
                )))
            }
            _ => Ok(None),
        }
    }

    /// VM `vmid` that this controller made on `node` as `name`, as the
    /// cached VM list will show it once read again.
    async fn made(
        &self,
        client: &Client,
        node: &str,
        vmid: u32,
        name: &str,
        tags: Option<String>,
    ) -> VmResource {
        self.vms.invalidate(client.region()).await;
        VmResource {
            vmid,
            node: node.to_string(),
            name: Some(name.to_string()),
            kind: "qemu".into(),
            template: None,
            tags,
            hastate: None,
        }
    }

    /// Unavailable while a VM this controller made a moment ago is still
    /// being created: until qemu-server writes its config it holds only
    /// `lock: create` (API2/Qemu.pm create_vm, create_and_lock_config), so a
    /// create whose answer did not come yet cannot be recognised, and a
    /// second VM would be a stray.
    async fn none_being_created(&self, client: &Client, d: Deadline) -> Result<(), CtlError> {
        let rows = self.vms.all(client, d).await?;
        for v in rows
            .iter()
            .filter(|v| v.name.is_none() && self.recent_vmids.recent(v.vmid))
        {
            if let Ok(cfg) = client.vm_config(&v.node, v.vmid, d).await
                && cfg.values.get("lock").map(String::as_str) == Some("create")
                && !cfg.values.contains_key("name")
            {
                return Err(CtlError::Unavailable(format!(
                    "VM {} that this controller is creating is not written yet; the next call finds it",
                    v.vmid
                )));
            }
        }
        Ok(())
    }

    /// Gives a VM just made without them its tags and protection, in one
    /// write. A refusal (the policy refuses the tags too) or any other
    /// failure destroys the empty VM again, unless that write may have
    /// been applied: then the next call finds the VM, tagged or not
    /// (`VmIndex::own` tags a VM of the driver found without its tags).
    async fn tag_new_vm(
        &self,
        client: &Client,
        node: &str,
        vmid: u32,
        identity: &[(&str, String)],
        d: Deadline,
    ) -> Result<(), PveError> {
        let tagged = client.update_config(node, vmid, identity, d).await;
        if let Err(e) = &tagged
            && !matches!(e, PveError::AnswerLost { .. })
            && let Err(d_err) = client.destroy_vm(node, vmid, d).await
        {
            tracing::error!(vmid, error = %d_err, "destroying an untagged VM of the driver failed; pvecsictl doctor lists it");
        }
        tagged
    }

    /// Lifts `protection` from one of the controller's own VMs, for its own
    /// destroy or disk removal (both refused while it is set; a change of
    /// the flag itself is not, and needs `VM.Config.Options`: qemu-server
    /// Qemu.pm $generaloptions). `cfg` is the config as last read; the
    /// answer says whether the flag was lifted (the config changed).
    pub async fn unprotect(
        &self,
        client: &Client,
        node: &str,
        vmid: u32,
        cfg: &VmConfig,
        d: Deadline,
    ) -> Result<bool, CtlError> {
        if !is_protected(&cfg.values) {
            return Ok(false);
        }
        let form = [
            ("delete", "protection".to_string()),
            ("digest", cfg.digest.clone()),
        ];
        client
            .update_config(node, vmid, &form, d)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::PermissionDenied => CtlError::refused(
                    format!(
                        "lifting the protection of the driver's own VM {vmid} before changing its disks"
                    ),
                    format!("grant VM.Config.Options on /vms/{vmid} to the CSI role"),
                    e,
                ),
                _ => CtlError::from(e),
            })?;
        Ok(true)
    }

    /// Removes drive `keys` from one of the controller's own VMs (without
    /// `force`, so a disk the VM owns stays as `unusedN`), and protects the
    /// VM again in the same write: qemu-server's update_vm_api checks each
    /// delete against the config as it is, then applies the new options.
    pub async fn remove_own_drives(
        &self,
        client: &Client,
        node: &str,
        vmid: u32,
        cfg: VmConfig,
        keys: &[&str],
        d: Deadline,
    ) -> Result<(), CtlError> {
        let lifted = self.unprotect(client, node, vmid, &cfg, d).await?;
        let removed = async {
            let cfg = if lifted {
                client.vm_config(node, vmid, d).await?
            } else {
                cfg
            };
            let form = [
                ("delete", keys.join(",")),
                ("protection", "1".to_string()),
                ("digest", cfg.digest.clone()),
            ];
            client.update_config(node, vmid, &form, d).await
        }
        .await;
        if removed.is_err() && lifted {
            self.protect_again(client, node, vmid, d).await;
        }
        Ok(removed?)
    }

    /// Sets `protection` again on one of the controller's own VMs after a
    /// lift whose work failed; a failure is logged (the next write to the
    /// VM protects it, and `pvecsictl doctor` lists it).
    pub async fn protect_again(&self, client: &Client, node: &str, vmid: u32, d: Deadline) {
        let form = [("protection", "1".to_string())];
        if let Err(e) = client.update_config(node, vmid, &form, d).await {
            tracing::error!(vmid, error = %e, "protecting the driver's own VM again failed");
        }
    }

    /// Keeps `vmid` from the next creates for a while: a VM being destroyed
    /// must not give its VMID to a new copy that a retried delete of the
    /// old one (answered late, or not at all) would then destroy.
    pub fn retire_vmid(&self, vmid: u32) {
        self.recent_vmids.hand_out(vmid);
    }

    /// The lowest free VMID of `vmid_range`, never the placeholder's: a VM
    /// under `controllerVmID` would own every CSI disk, and destroying it
    /// would free them all. The cluster's VM list gives the candidates;
    /// `/cluster/nextid?vmid=N` confirms each against VMs the token may not
    /// see (pve-manager PVE/API2/Cluster.pm nextid: 400 "VM N already
    /// exists"), as the Go driver's go-proxmox GetNextID probes. An id handed
    /// out lately is skipped while a create under it may still be running.
    async fn next_vmid(
        &self,
        client: &Client,
        disk_owners: &HashSet<u32>,
        d: Deadline,
    ) -> Result<u32, CtlError> {
        let parse = |v: &Value| match v {
            Value::String(s) => s.parse::<u32>().ok(),
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        };
        // The list may be old: nextid below has the last word.
        let listed: HashSet<u32> = self
            .vms
            .all(client, d)
            .await?
            .into_iter()
            .map(|v| v.vmid)
            .collect();
        let range = self.vmid_range;
        let candidates = (range.low..=range.high)
            .filter(|id| *id != self.controller_vmid && !listed.contains(id))
            .filter(|id| !disk_owners.contains(id))
            .filter(|id| !self.recent_vmids.recent(*id));
        for candidate in candidates.take(100) {
            self.recent_vmids.hand_out(candidate);
            match client.next_id(candidate, d).await {
                Ok(v) if parse(&v) == Some(candidate) => return Ok(candidate),
                Ok(v) => {
                    return Err(CtlError::Unavailable(format!(
                        "/cluster/nextid?vmid={candidate} answered {v}"
                    )));
                }
                Err(e) if e.status().is_some_and(|s| s.as_u16() == 400) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CtlError::ResourceExhausted(format!(
            "no free VMID in features.vmIDRange {range} (the cloud config's range for the driver's own VMs; \
             the VMIDs of VMs it destroyed in the last 5 minutes are not reused yet): widen it or free one"
        )))
    }
}

/// VMIDs handed to creates, or of VMs destroyed, in the last five minutes
/// (the Go driver's go-proxmox GetNextID keeps the same window for ids it
/// handed out); for a create whose answer was lost, the VM it was for.
#[derive(Debug, Default)]
pub struct RecentVmids(std::sync::Mutex<HashMap<u32, Handed>>);

const RECENT: Duration = Duration::from_secs(300);

/// One VMID handed out: when, and, if its create's answer was lost, the
/// (region, VM name) it was for.
#[derive(Debug)]
struct Handed {
    at: Instant,
    lost_for: Option<(String, String)>,
}

impl RecentVmids {
    fn recent(&self, vmid: u32) -> bool {
        self.0
            .lock()
            .is_ok_and(|m| m.get(&vmid).is_some_and(|h| h.at.elapsed() < RECENT))
    }

    fn hand_out(&self, vmid: u32) {
        if let Ok(mut m) = self.0.lock() {
            m.retain(|_, h| h.at.elapsed() < RECENT);
            let at = Instant::now();
            m.insert(vmid, Handed { at, lost_for: None });
        }
    }

    fn forget(&self, vmid: u32) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(&vmid);
        }
    }

    /// `vmid`'s create of `name` in `region` lost its answer: the next
    /// create of that VM takes it again ([`Self::lost_create`]).
    fn lost(&self, vmid: u32, region: &str, name: &str) {
        if let Ok(mut m) = self.0.lock() {
            let lost_for = Some((region.to_string(), name.to_string()));
            m.insert(
                vmid,
                Handed {
                    at: Instant::now(),
                    lost_for,
                },
            );
        }
    }

    /// The VMID of a recent create of `name` in `region` whose answer was
    /// lost, taken once.
    fn lost_create(&self, region: &str, name: &str) -> Option<u32> {
        let mut m = self.0.lock().ok()?;
        let (vmid, h) = m.iter_mut().find(|(_, h)| {
            h.at.elapsed() < RECENT
                && h.lost_for
                    .as_ref()
                    .is_some_and(|(r, n)| r == region && n == name)
        })?;
        h.lost_for = None;
        Some(*vmid)
    }
}

/// What creating one of the controller's VMs needs beyond `VM.Allocate`:
/// each parameter it sets is checked (qemu-server src/PVE/API2/Qemu.pm
/// create_vm and $check_vm_modify_config_perm: memory → VM.Config.Memory,
/// cores → VM.Config.CPU, scsihw → VM.Config.HWType, name and description →
/// VM.Config.Options; tags → VM.Config.Options, pve-guest-common
/// src/PVE/GuestHelpers.pm assert_tag_permissions).
pub const NEW_VM_PRIVILEGES: &[&str] = &[
    "VM.Allocate",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.HWType",
    "VM.Config.Options",
];

/// One async lock per holder name: two offline expansions on one node at
/// once find or make one holder VM, not one each.
#[derive(Debug, Default)]
pub struct HolderLocks(std::sync::Mutex<HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>);

impl HolderLocks {
    async fn lock(&self, key: String) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, l| std::sync::Arc::strong_count(l) > 1);
            map.entry(key).or_default().clone()
        };
        m.lock_owned().await
    }
}
