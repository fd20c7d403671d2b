//! `doctor`: what commonly breaks, each finding with its remedy.

use proxmox_csi_common::contract::{TOPOLOGY_REGION, TOPOLOGY_ZONE};
use serde::Serialize;

use proxmox_csi_common::support;
use proxmox_csi_controller::drive::is_disk_key;

use crate::state::State;

mod tags;
use tags::tag_policy;

/// The privileges of the minimal CSI role.
pub const MINIMAL_ROLE: &[&str] = &[
    "VM.Audit",
    "VM.Config.Disk",
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.Audit",
];
/// Fewer free CSI slots than this on a worker VM is worth a warning.
const FEW_SLOTS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Ok,
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub subject: String,
    pub severity: Severity,
    pub finding: String,
    pub remedy: String,
}

fn f(
    check: &'static str,
    subject: impl Into<String>,
    severity: Severity,
    finding: impl Into<String>,
    remedy: impl Into<String>,
) -> Finding {
    Finding {
        check,
        subject: subject.into(),
        severity,
        finding: finding.into(),
        remedy: remedy.into(),
    }
}

/// Every check, over the state read once.
pub fn run(s: &State) -> Vec<Finding> {
    let mut out = Vec::new();
    token(s, &mut out);
    versions(s, &mut out);
    tag_policy(s, &mut out);
    nodes(s, &mut out);
    storages(s, &mut out);
    thick_lvm(s, &mut out);
    workers(s, &mut out);
    own_vms(s, &mut out);
    unclaimed_copies(s, &mut out);
    classes(s, &mut out);
    out
}

/// Proxmox VE and Kubernetes against docs/support.md: outside it is a
/// warning, not an error (most things work; nothing was tested there).
fn versions(s: &State, out: &mut Vec<Finding>) {
    let matrix = "docs/support.md";
    let supported = support::proxmox_supported_text();
    for (region, version) in &s.proxmox_versions {
        out.push(match support::proxmox_supported(version) {
            Some(true) => f(
                "versions",
                region.as_str(),
                Severity::Ok,
                format!("Proxmox VE {version} (supported: {supported})"),
                "",
            ),
            _ => f(
                "versions",
                region.as_str(),
                Severity::Warning,
                format!("Proxmox VE {version} is outside this release's support ({supported})"),
                format!("upgrade Proxmox VE to a supported release ({matrix})"),
            ),
        });
    }
    let Some((major, minor, git)) = &s.kubernetes_version else {
        return;
    };
    let (lo, hi) = support::KUBERNETES_MINORS;
    // Some distributions serve the minor as `34+`.
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    let finding = match (major.as_str(), digits.parse::<u32>()) {
        ("1", Ok(m)) if m < lo => f(
            "versions",
            "kubernetes",
            Severity::Warning,
            format!("Kubernetes {git} is older than this release supports (1.{lo}–1.{hi})"),
            format!("upgrade Kubernetes to 1.{lo} or later ({matrix})"),
        ),
        ("1", Ok(m)) if m > hi => f(
            "versions",
            "kubernetes",
            Severity::Info,
            format!("Kubernetes {git} is newer than this release was tested with (1.{lo}–1.{hi})"),
            format!("check {matrix} of a newer release"),
        ),
        ("1", Ok(_)) => f(
            "versions",
            "kubernetes",
            Severity::Ok,
            format!("Kubernetes {git} (supported: 1.{lo}–1.{hi})"),
            "",
        ),
        _ => f(
            "versions",
            "kubernetes",
            Severity::Warning,
            format!(
                "Kubernetes reports version {major}.{minor} ({git}), which is not a release this driver knows"
            ),
            format!("see {matrix}"),
        ),
    };
    out.push(finding);
}

/// The driver's own VMs (copy VMs, holders) that hold volume data without
/// Proxmox's protection: made by an earlier version, or left so by a
/// failed write. A click or an IaC run that prunes unknown VMs would
/// destroy their volumes.
fn own_vms(s: &State, out: &mut Vec<Finding>) {
    use proxmox_csi_controller::vms::{OWN_TAG, is_protected};
    for vm in s.vms.iter().filter(|v| v.res.has_tag(OWN_TAG)) {
        if is_protected(&vm.config) {
            continue;
        }
        out.push(f(
            "own VM protection",
            format!("VM {} ({})", vm.res.vmid, vm.res.name.as_deref().unwrap_or_default()).as_str(),
            Severity::Warning,
            "a VM of the driver without protection: destroying it destroys the volume data it holds",
            format!("qm set {} --protection 1", vm.res.vmid),
        ));
    }
}

/// Clone and restore copy VMs (tagged `csi-volume`) whose volume no
/// PersistentVolume names: still copying, or the claim was deleted while it
/// copied and the provisioner forgot it (a restart between two calls), so
/// nothing will destroy it (docs/snapshots.md, Limits). Which one only the
/// claim's UID, in the VM's name, tells.
fn unclaimed_copies(s: &State, out: &mut Vec<Finding>) {
    use proxmox_csi_controller::ctl::VOLUME_TAG;
    use proxmox_csi_controller::vms::OWN_TAG;
    for vm in s
        .vms
        .iter()
        .filter(|v| v.res.has_tag(OWN_TAG) && v.res.has_tag(VOLUME_TAG))
    {
        let vmid = vm.res.vmid;
        let disk = format!("/vm-{vmid}-");
        if s.all_handles.iter().any(|h| h.contains(&disk)) {
            continue;
        }
        let name = vm.res.name.as_deref().unwrap_or_default();
        let uid = name.strip_prefix("pvc-").unwrap_or(name);
        out.push(f(
            "unclaimed copy",
            format!("VM {vmid} ({name})").as_str(),
            Severity::Warning,
            "a clone or restore that no PersistentVolume holds: still copying, or its claim was deleted while it copied",
            format!(
                "if no claim has UID {uid} (kubectl get pvc -A -o custom-columns=UID:.metadata.uid): \
                 qm set {vmid} --protection 0 && qm destroy {vmid} --purge"
            ),
        ));
    }
}

/// Classes whose parameters the driver takes with the Go driver's meaning
/// (a warning each, see proxmox_csi_controller::warnings), or refuses.
fn classes(s: &State, out: &mut Vec<Finding>) {
    use proxmox_csi_controller::ctl::snapshot_class_warnings;
    use proxmox_csi_controller::params::StorageParams;
    use proxmox_csi_controller::warnings::ClassKind;
    for c in &s.classes {
        let judged: Result<Vec<String>, String> = match c.kind {
            ClassKind::StorageClass => StorageParams::parse(&c.parameters)
                .map(|p| p.warnings.iter().map(ToString::to_string).collect())
                .map_err(|e| e.to_string()),
            ClassKind::VolumeAttributesClass => {
                let mut p = StorageParams {
                    storage: "-".into(),
                    ..Default::default()
                };
                p.apply_mutable(&c.parameters)
                    .map(|w| w.iter().map(ToString::to_string).collect())
                    .map_err(|e| e.to_string())
            }
            ClassKind::VolumeSnapshotClass => snapshot_class_warnings(&c.parameters)
                .map(|w| w.iter().map(ToString::to_string).collect())
                .map_err(|e| e.to_string()),
        };
        let subject = format!("{} {}", c.kind.as_str(), c.name);
        out.push(match judged {
            Ok(w) if w.is_empty() => f("class parameters", subject, Severity::Ok, "every parameter is read as written", ""),
            Ok(w) => f(
                "class parameters",
                subject,
                Severity::Warning,
                w.join("; "),
                "the class keeps working with the Go driver's meaning; classes are immutable, so make a new one \
                 without these keys and move claims to it to say what is meant",
            ),
            Err(e) => f(
                "class parameters",
                subject,
                Severity::Error,
                format!("volumes of this class fail: {e}"),
                "make a new class with a valid value; classes are immutable",
            ),
        });
    }
}

fn token(s: &State, out: &mut Vec<Finding>) {
    for region in &s.regions {
        let have = s.privileges.get(region).cloned().unwrap_or_default();
        let missing: Vec<&str> = MINIMAL_ROLE
            .iter()
            .copied()
            .filter(|p| !have.contains(*p))
            .collect();
        out.push(if missing.is_empty() {
            f(
                "token privileges",
                region.as_str(),
                Severity::Ok,
                "the token holds the minimal CSI role on /",
                "",
            )
        } else {
            f(
                "token privileges",
                region.as_str(),
                Severity::Error,
                format!("the token lacks {} on /", missing.join(", ")),
                format!(
                    "pveum role modify CSI -append 1 -privs \"{}\" (docs/proxmox-role.md)",
                    missing.join(" ")
                ),
            )
        });
    }
}

fn nodes(s: &State, out: &mut Vec<Finding>) {
    for n in &s.nodes {
        let Some(vm) = s.vm_of(n) else {
            out.push(f(
                "node → VM",
                n.name.as_str(),
                Severity::Error,
                "no Proxmox VM is found for this node (providerID, instance-id annotation, or a VM of the same name)",
                "set spec.providerID to proxmox://<region>/<vmid> or name the VM like the node",
            ));
            continue;
        };
        match (&n.region, &n.zone) {
            (Some(r), _) if !s.regions.contains(r) => out.push(f(
                "topology labels",
                n.name.as_str(),
                Severity::Error,
                format!(
                    "{TOPOLOGY_REGION}={r} is not a region of the cloud config ({})",
                    s.regions.join(", ")
                ),
                "label the node with its cluster's region, or add the cluster to the cloud config",
            )),
            (Some(_), Some(z)) if *z != vm.res.node => out.push(f(
                "topology labels",
                n.name.as_str(),
                Severity::Error,
                format!(
                    "{TOPOLOGY_ZONE}={z}, but its VM {} runs on Proxmox node {}",
                    vm.res.vmid, vm.res.node
                ),
                format!(
                    "kubectl label node {} {TOPOLOGY_ZONE}={} --overwrite",
                    n.name, vm.res.node
                ),
            )),
            (Some(_), Some(_)) => out.push(f(
                "topology labels",
                n.name.as_str(),
                Severity::Ok,
                format!("VM {} on {}", vm.res.vmid, vm.res.node),
                "",
            )),
            _ => out.push(f(
                "topology labels",
                n.name.as_str(),
                Severity::Error,
                format!("the node has no {TOPOLOGY_REGION} or zone label"),
                "run the Proxmox cloud controller manager, or label the node by hand",
            )),
        }
    }
}

/// The storages each Proxmox node with workers sees, and the ones it does
/// not while other nodes do (volumes there cannot reach its workers).
fn storages(s: &State, out: &mut Vec<Finding>) {
    let mut worker_nodes: Vec<(String, String)> = s
        .nodes
        .iter()
        .filter_map(|n| s.vm_of(n))
        .map(|v| (v.region.clone(), v.res.node.clone()))
        .collect();
    worker_nodes.sort();
    worker_nodes.dedup();
    for (region, node) in worker_nodes {
        let rows: Vec<&proxmox_csi_controller::pve::api::StorageResource> = s
            .storages
            .iter()
            .filter(|(r, row)| *r == region && row.node == node)
            .map(|(_, row)| row)
            .collect();
        let available: Vec<&str> = rows
            .iter()
            .filter(|r| r.status == "available")
            .map(|r| r.storage.as_str())
            .collect();
        let elsewhere: std::collections::BTreeSet<&str> = s
            .storages
            .iter()
            .filter(|(r, row)| *r == region && row.node != node && row.status == "available")
            .map(|(_, row)| row.storage.as_str())
            .collect();
        let missing: Vec<&str> = elsewhere
            .into_iter()
            .filter(|st| !available.contains(st))
            .collect();
        let subject = format!("{region}/{node}");
        out.push(f(
            "storages",
            subject.as_str(),
            Severity::Ok,
            format!("available: {}", available.join(", ")),
            "",
        ));
        if !missing.is_empty() {
            out.push(f(
                "storages",
                subject.as_str(),
                Severity::Warning,
                format!("not available here but on other nodes: {}", missing.join(", ")),
                "restrict StorageClasses using them with allowedTopologies, or enable the storage on this node",
            ));
        }
    }
}

/// Thick LVM keeps a removed volume's bytes in its extents unless the
/// storage has `saferemove` (pve-storage src/PVE/Storage/LVMPlugin.pm
/// `free_lvm_volumes_locked`): the driver formats its new volumes over
/// them (hostd's claims, docs/security.md), but whoever gets those extents
/// outside the driver, another VM's disk, can read them.
fn thick_lvm(s: &State, out: &mut Vec<Finding>) {
    for (region, storage, safe) in &s.thick_lvm {
        let subject = format!("{region}/{storage}");
        match safe {
            Some(true) => out.push(f("saferemove", subject, Severity::Ok, "thick LVM zeroes removed volumes", "")),
            Some(false) => out.push(f(
                "saferemove",
                subject,
                Severity::Warning,
                "thick LVM without saferemove: a deleted volume's bytes stay in its extents for the next disk allocated there",
                format!("pvesm set {storage} --saferemove 1 (removals then zero the volume in a background task)"),
            )),
            None => out.push(f(
                "saferemove",
                subject,
                Severity::Info,
                "thick LVM whose config the token cannot read (GET /storage/{storage} needs Datastore.Allocate): saferemove unknown",
                format!("check /etc/pve/storage.cfg for saferemove on {storage}"),
            )),
        }
    }
}

fn workers(s: &State, out: &mut Vec<Finding>) {
    let placeholder = format!("vm-{}-", s.controller_vmid);
    for n in &s.nodes {
        let Some(vm) = s.vm_of(n) else { continue };
        let subject = format!("VM {} ({})", vm.res.vmid, n.name);
        match vm.config.get("scsihw").map(String::as_str) {
            Some("virtio-scsi-pci") => {}
            // qemu-server QemuServer.pm qemu_devicedelverify: each disk's own
            // controller goes only after the guest ejected it, checked once
            // a second (up to 5 s on PVE 8, 15 s on PVE 9).
            Some("virtio-scsi-single") => out.push(f(
                "SCSI controller",
                subject.as_str(),
                Severity::Info,
                "scsihw is virtio-scsi-single: every detach waits for the guest to eject the disk's own controller, a second or more per volume (docs/BENCHMARKS.md, bursts)",
                format!("for faster detaches: qm set {} --scsihw virtio-scsi-pci (after a restart of the VM; disks then share one controller and its iothread)", vm.res.vmid),
            )),
            other => out.push(f(
                "SCSI controller",
                subject.as_str(),
                Severity::Error,
                format!("scsihw is {}: hot-plugged disks get no WWN udev can name", other.unwrap_or("lsi (the default)")),
                format!("qm set {} --scsihw virtio-scsi-pci (takes effect after a restart of the VM)", vm.res.vmid),
            )),
        }
        let used = (1..=30)
            .filter(|i| vm.config.contains_key(&format!("scsi{i}")))
            .count();
        let free = 30 - used;
        out.push(f(
            "free SCSI slots",
            subject.as_str(),
            if free < FEW_SLOTS {
                Severity::Warning
            } else {
                Severity::Ok
            },
            format!("{free} of scsi1–scsi30 free"),
            if free < FEW_SLOTS {
                "move volumes to other nodes, or lower the node's volume limit"
            } else {
                ""
            },
        ));
        let held: Vec<&String> = vm
            .config
            .iter()
            .filter(|(k, v)| {
                is_disk_key(k)
                    && v.split(',')
                        .next()
                        .is_some_and(|vol| vol.contains(&placeholder))
            })
            .map(|(k, _)| k)
            .collect();
        if !held.is_empty() {
            out.push(f(
                "placeholder-owned disks",
                subject.as_str(),
                Severity::Info,
                format!("holds {} disk(s) owned by VMID {} ({}): Proxmox refuses to migrate the VM with them", held.len(), s.controller_vmid, held.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")),
                "drain the node (the driver detaches them) before migrating its VM",
            ));
        }
        // Proxmox refuses to remove a protected VM's disks (pve-guest-common
        // AbstractConfig.pm check_protection, from qemu-server Qemu.pm
        // update_vm_api): every unpublish from this worker fails.
        if vm.config.get("protection").is_some_and(|p| p.trim() == "1") {
            out.push(f(
                "protection",
                subject.as_str(),
                Severity::Warning,
                "protection: 1: Proxmox refuses to remove its disks, so no volume can be unpublished from it (attaching still works)",
                format!("qm set {} --protection 0, or keep it and drain the node before protecting it", vm.res.vmid),
            ));
        }
        if !vm.pending.is_empty() {
            out.push(f(
                "pending changes",
                subject.as_str(),
                Severity::Error,
                format!("changes not applied: {}", vm.pending.join(", ")),
                format!(
                    "revert them: qm set {} --revert {}",
                    vm.res.vmid,
                    vm.pending.join(",")
                ),
            ));
        }
        for (k, v) in vm.config.iter().filter(|(k, _)| k.starts_with("unused")) {
            if v.contains(&placeholder) {
                out.push(f(
                    "unused disks",
                    subject.as_str(),
                    Severity::Error,
                    format!("{k}: {v} is a CSI disk kept as unused (its PV may point at it)"),
                    format!("qm set {} --delete {k} (without --force: keeps the disk) after checking its PV", vm.res.vmid),
                ));
            }
        }
    }
}

/// Whether the findings call for a non-zero exit.
pub fn failed(findings: &[Finding]) -> bool {
    findings.iter().any(|x| x.severity >= Severity::Warning)
}
