//! `clean`: the disks named `vm-<controllerVmID>-…` that no PersistentVolume
//! refers to, each with what `--yes` does to it. A disk is deleted only when
//! everything says it is this cluster's and unused: its name carries this
//! cluster's id (or it has none and `--include-unattributed` was given), no
//! VM config, VolumeSnapshotContent or VolumeAttachment names it, and it is
//! older than the grace period (a CreateVolume may still be running).

use serde::Serialize;

use crate::state::State;
use proxmox_csi_controller::volume::{ClusterId, cluster_of, pv_of};

/// What the operator said.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--cluster-id`: given by the operator, not read from the cluster.
    pub cluster_id: Option<ClusterId>,
    /// Disks named without a cluster id (the Go driver's, and this driver's
    /// before cluster ids) may be deleted too.
    pub include_unattributed: bool,
    /// Disks younger than this are kept.
    pub min_age_secs: i64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            cluster_id: None,
            include_unattributed: false,
            min_age_secs: 24 * 3600,
        }
    }
}

/// Why a disk stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "reason")]
pub enum Keep {
    /// VM configs name it, in a disk slot or as `unusedN`.
    AttachedTo { vmids: Vec<u32> },
    /// A Kubernetes object names it.
    NamedBy { kind: &'static str, name: String },
    /// Its name carries another cluster's id.
    OtherCluster { cluster_id: String },
    /// Its name carries no cluster id.
    Unattributed,
    /// Younger than the grace period.
    Young { age_secs: i64 },
    /// The storage does not say when it was made.
    AgeUnknown,
}

impl std::fmt::Display for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Keep::AttachedTo { vmids } => write!(f, "kept: VM {vmids:?} refers to it"),
            Keep::NamedBy { kind, name } => write!(f, "kept: {kind} {name} names it"),
            Keep::OtherCluster { cluster_id } => {
                write!(f, "kept: cluster {cluster_id}'s (not this cluster's)")
            }
            Keep::Unattributed => f.write_str(
                "kept: no cluster id in its name (the Go driver's, or from before cluster ids); \
                 --include-unattributed deletes it",
            ),
            Keep::Young { age_secs } => write!(
                f,
                "kept: {} min old, younger than --min-age-hours",
                age_secs / 60
            ),
            Keep::AgeUnknown => f.write_str("kept: the storage does not say how old it is"),
        }
    }
}

/// What `--yes` does to a disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "action")]
pub enum Verdict {
    Delete,
    Keep(Keep),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub region: String,
    pub node: String,
    pub volid: String,
    pub size: u64,
    pub age_days: Option<i64>,
    /// The cluster id its name carries.
    pub cluster_id: Option<String>,
    pub verdict: Verdict,
}

/// Why `--yes` must not run at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "--cluster-id {given} is not this Kubernetes cluster's id ({own}, from namespace \
         kube-system): the PersistentVolumes read are another cluster's, so its disks would \
         look unused; nothing deleted"
    )]
    NotThisCluster { given: String, own: String },
    #[error(
        "this Kubernetes cluster has no id (namespace kube-system has no UID), so neither a \
         disk nor --cluster-id can be proven this cluster's; nothing deleted"
    )]
    NoClusterId,
    #[error(
        "{count} disk(s) carry no cluster id, so whose they are cannot be read from Proxmox: \
         run again with --cluster-id <this cluster's id> to delete only this cluster's disks \
         (add --include-unattributed to delete the unattributed ones too); nothing deleted"
    )]
    Unattributed { count: usize },
}

/// The cluster whose disks `--yes` may delete, or why it may not run.
pub fn own_cluster(s: &State, opts: &Options) -> Result<ClusterId, Refusal> {
    match (&opts.cluster_id, &s.cluster_id) {
        (Some(given), Some(own)) if given != own => Err(Refusal::NotThisCluster {
            given: given.to_string(),
            own: own.to_string(),
        }),
        (Some(_), None) | (None, None) => Err(Refusal::NoClusterId),
        (Some(id), _) | (None, Some(id)) => Ok(id.clone()),
    }
}

/// Refuses `--yes` when it sees a disk it cannot attribute and the operator
/// did not say which cluster this is.
pub fn check_yes(s: &State, opts: &Options, orphans: &[Orphan]) -> Result<(), Refusal> {
    own_cluster(s, opts)?;
    // A disk a VM or a Kubernetes object names is someone's, whoever made it.
    let count = orphans
        .iter()
        .filter(|o| {
            o.cluster_id.is_none()
                && !matches!(
                    o.verdict,
                    Verdict::Keep(Keep::AttachedTo { .. } | Keep::NamedBy { .. })
                )
        })
        .count();
    if count > 0 && opts.cluster_id.is_none() {
        return Err(Refusal::Unattributed { count });
    }
    Ok(())
}

/// The disk's name in handles: after `<storage>:` and any `<vmid>/`.
fn base_name(volid: &str) -> &str {
    let name = volid.split_once(':').map_or(volid, |(_, n)| n);
    name.rsplit('/').next().unwrap_or(name)
}

/// A handle names a disk when one of its `/`, `:` or `@` separated parts is
/// the disk's name: a volume handle's last part, a snapshot handle's.
fn names(handle: &str, base: &str) -> bool {
    handle.split(['/', ':', '@']).any(|part| part == base)
}

/// The driver's disks without a PersistentVolume, each judged.
pub fn orphans(s: &State, opts: &Options, now: i64) -> Vec<Orphan> {
    let prefix = format!("vm-{}-", s.controller_vmid);
    let own = own_cluster(s, opts).ok();
    let mut out: Vec<Orphan> = s
        .disks
        .iter()
        .filter(|d| base_name(&d.volid).starts_with(&prefix))
        // A PV names a disk by its name, whatever region and storage id its
        // handle says: one NFS export or VG may be two storages, one share
        // two regions' (and file storages' names carry the VMID directory).
        .filter(|d| !s.all_handles.iter().any(|h| names(h, base_name(&d.volid))))
        .map(|d| {
            let base = base_name(&d.volid);
            let cluster = cluster_of(base);
            let age = d.ctime.map(|c| now - c);
            let attached = s.attached_to(&d.volid);
            let snapshot = s.snapshot_handles.iter().find(|h| names(h, base));
            let attachment = s.attachments.iter().find(|a| {
                a.handle.as_deref().is_some_and(|h| names(h, base))
                    || (a.pv.is_some() && a.pv.as_deref() == pv_of(base))
            });
            let keep = if !attached.is_empty() {
                Some(Keep::AttachedTo { vmids: attached })
            } else if let Some(h) = snapshot {
                Some(Keep::NamedBy {
                    kind: "VolumeSnapshotContent",
                    name: h.clone(),
                })
            } else if let Some(a) = attachment {
                Some(Keep::NamedBy {
                    kind: "VolumeAttachment",
                    name: a.name.clone(),
                })
            } else {
                match (&cluster, &own) {
                    (Some(c), Some(own)) if c == own => None,
                    (Some(c), _) => Some(Keep::OtherCluster {
                        cluster_id: c.to_string(),
                    }),
                    (None, _) if !opts.include_unattributed => Some(Keep::Unattributed),
                    (None, _) => None,
                }
            };
            let keep = keep.or(match age {
                None => Some(Keep::AgeUnknown),
                Some(a) if a < opts.min_age_secs => Some(Keep::Young { age_secs: a }),
                Some(_) => None,
            });
            Orphan {
                region: d.region.clone(),
                node: d.node.clone(),
                volid: d.volid.clone(),
                size: d.size,
                age_days: age.map(|a| a / 86_400),
                cluster_id: cluster.map(|c| c.to_string()),
                verdict: keep.map_or(Verdict::Delete, Verdict::Keep),
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.region, &a.volid).cmp(&(&b.region, &b.volid)));
    out
}
