//! `clean`: disks named `vm-<controllerVmID>-…` that no PersistentVolume
//! refers to, with size and age. Deleted only with `--yes`, and never one
//! attached to a VM.

use serde::Serialize;

use crate::state::State;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub region: String,
    pub node: String,
    pub volid: String,
    pub size: u64,
    pub age_days: Option<i64>,
    /// VMs it is attached to: such a disk is never deleted.
    pub attached_to: Vec<u32>,
}

/// The driver's disks without a PersistentVolume.
pub fn orphans(s: &State, now: i64) -> Vec<Orphan> {
    let prefix = format!("vm-{}-", s.controller_vmid);
    let mut out: Vec<Orphan> = s
        .disks
        .iter()
        .filter(|d| {
            let name = d.volid.split_once(':').map(|(_, n)| n).unwrap_or_default();
            name.rsplit('/')
                .next()
                .is_some_and(|base| base.starts_with(&prefix))
        })
        .filter(|d| {
            // A PV's handle ends with `<storage>/<volume name>`.
            let (storage, name) = d.volid.split_once(':').unwrap_or_default();
            !s.handles.iter().any(|h| {
                h.ends_with(&format!("/{storage}/{name}"))
                    && h.starts_with(&format!("{}/", d.region))
            })
        })
        .map(|d| Orphan {
            region: d.region.clone(),
            node: d.node.clone(),
            volid: d.volid.clone(),
            size: d.size,
            age_days: d.ctime.map(|c| (now - c) / 86_400),
            attached_to: s.attached_to(&d.volid),
        })
        .collect();
    out.sort_by(|a, b| (&a.region, &a.volid).cmp(&(&b.region, &b.volid)));
    out
}
