//! The handles the controller issues and reads back, exactly as the Go
//! driver writes them: volume ids `region/zone/storage/disk` (an empty zone
//! on shared storage), snapshot ids, and the cluster id carried in disk
//! names. Parsed once at the edge, with a typed error naming what is wrong.

use std::fmt;

use crate::contract;

/// Which kind of handle a malformed id was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleKind {
    Volume,
    Snapshot,
}

impl fmt::Display for HandleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Volume => "volume id",
            Self::Snapshot => "snapshot id",
        })
    }
}

/// Why a string is not a volume or snapshot id of this driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    /// The Go driver's text for fewer than four parts (pkg/utils/volume
    /// volume.go, parsing a volume id).
    #[error("{kind} {raw:?}: VolumeID must be in the format of region/zone/storageName/diskName")]
    NotFourParts { kind: HandleKind, raw: String },
    #[error(
        "{kind} {raw:?}: region, storage and disk must not be empty (region/zone/storageName/diskName)"
    )]
    EmptyPart { kind: HandleKind, raw: String },
    #[error(
        "snapshot id {raw:?}: {SNAPSHOT_PREFIX} must be followed by a VMID (and .<8 hex digits>)"
    )]
    NotACopyVm { raw: String },
}

/// A parsed volume handle.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VolumeId {
    pub region: String,
    /// The Proxmox node for local storage; `None` on shared storage.
    pub zone: Option<String>,
    pub storage: String,
    /// The volume name after `<storage>:` (may contain `/` on file storage).
    pub disk: String,
}

impl VolumeId {
    pub fn parse(raw: &str) -> Result<Self, HandleError> {
        Self::parse_as(HandleKind::Volume, raw)
    }

    fn parse_as(kind: HandleKind, raw: &str) -> Result<Self, HandleError> {
        let parts: Vec<&str> = raw.splitn(4, '/').collect();
        let [region, zone, storage, disk] = parts.as_slice() else {
            return Err(HandleError::NotFourParts {
                kind,
                raw: raw.to_string(),
            });
        };
        if region.is_empty() || storage.is_empty() || disk.is_empty() {
            return Err(HandleError::EmptyPart {
                kind,
                raw: raw.to_string(),
            });
        }
        Ok(Self {
            region: region.to_string(),
            zone: (!zone.is_empty()).then(|| zone.to_string()),
            storage: storage.to_string(),
            disk: disk.to_string(),
        })
    }

    /// `<storage>:<disk>`.
    pub fn volid(&self) -> String {
        format!("{}:{}", self.storage, self.disk)
    }

    /// The owner VMID in the disk name (`vm-<vmid>-…`).
    pub fn owner(&self) -> Option<u32> {
        owner_of(&self.disk)
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.region,
            self.zone.as_deref().unwrap_or_default(),
            self.storage,
            self.disk
        )
    }
}

/// The disk-name prefix of a snapshot held by a copy VM:
/// `region/zone/storage/snapshot-vm-<vmid>[.<mark>]`.
pub const SNAPSHOT_PREFIX: &str = "snapshot-vm-";

/// A parsed snapshot handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotId {
    /// A copy VM of this controller.
    Copy {
        region: String,
        zone: String,
        storage: String,
        vmid: u32,
        /// The copy VM's mark (`csi-mark` in its description, random at its
        /// creation): Proxmox hands a VMID out again once its VM is gone, and
        /// a snapshot id must never name another snapshot's copy. Absent in
        /// ids of earlier versions, which match only unmarked VMs.
        mark: Option<String>,
    },
    /// A Go driver snapshot: a plain volume.
    Volume(VolumeId),
}

impl SnapshotId {
    pub fn parse(raw: &str) -> Result<Self, HandleError> {
        let v = VolumeId::parse_as(HandleKind::Snapshot, raw)?;
        let Some(rest) = v.disk.strip_prefix(SNAPSHOT_PREFIX) else {
            return Ok(Self::Volume(v));
        };
        let (vmid, mark) = match rest.split_once('.') {
            Some((vmid, mark)) => (vmid, Some(mark)),
            None => (rest, None),
        };
        let (vmid, mark) = match (vmid.parse::<u32>(), mark) {
            (Ok(vmid), None) => (vmid, None),
            (Ok(vmid), Some(m)) if is_mark(m) => (vmid, Some(m.to_string())),
            _ => {
                return Err(HandleError::NotACopyVm {
                    raw: raw.to_string(),
                });
            }
        };
        Ok(Self::Copy {
            region: v.region,
            zone: v.zone.unwrap_or_default(),
            storage: v.storage,
            vmid,
            mark,
        })
    }

    pub fn region(&self) -> &str {
        match self {
            Self::Copy { region, .. } => region,
            Self::Volume(v) => &v.region,
        }
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Copy {
                region,
                zone,
                storage,
                vmid,
                mark,
            } => {
                write!(f, "{region}/{zone}/{storage}/{SNAPSHOT_PREFIX}{vmid}")?;
                match mark {
                    Some(mark) => write!(f, ".{mark}"),
                    None => Ok(()),
                }
            }
            Self::Volume(v) => v.fmt(f),
        }
    }
}

/// A copy VM's mark: 8 lower-case hex digits.
fn is_mark(s: &str) -> bool {
    s.len() == 8
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The PV name in a disk name, as the Go driver reads it (pkg/utils/volume
/// volume.go PV): what follows `vm-<id>-`, without an extension.
pub fn pv_of(disk: &str) -> Option<&str> {
    let mut parts = disk.splitn(3, '-');
    let (_, _, rest) = (parts.next()?, parts.next()?, parts.next()?);
    rest.split('.').next().filter(|pv| !pv.is_empty())
}

/// The owner VMID of a disk name, by the Go driver's owner regex:
/// `(^|-|/)vm-([1-9][0-9]{2,8})(-|$)`.
pub fn owner_of(disk: &str) -> Option<u32> {
    let bytes = disk.as_bytes();
    let mut i = 0;
    while let Some(pos) = disk[i..].find("vm-") {
        let start = i + pos;
        let boundary = start == 0 || matches!(bytes[start - 1], b'-' | b'/');
        let digits: String = disk[start + 3..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let end = start + 3 + digits.len();
        let after_ok = end == disk.len() || bytes[end] == b'-';
        if boundary && (3..=9).contains(&digits.len()) && !digits.starts_with('0') && after_ok {
            return digits.parse().ok();
        }
        i = start + 3;
    }
    None
}

/// The Kubernetes cluster whose controller created a disk, written into the
/// disk's name after its mark (`vm-<vmid>-<name>.csf-<id>`, see
/// `contract::BlankFor`), so that which cluster a disk belongs to is read
/// from Proxmox alone: by `pvecsictl clean` on a Proxmox cluster that
/// several Kubernetes clusters share.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterId(String);

/// Why a string is not a cluster id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cluster id {raw:?}: 1 to {} lower-case letters and digits",
    contract::CLUSTER_ID_MAX
)]
pub struct ClusterIdError {
    pub raw: String,
}

/// 12 hex digits of a UID: 48 bits, so two clusters sharing one Proxmox
/// cluster do not meet by chance.
const DERIVED_LEN: usize = 12;

impl ClusterId {
    /// 1 to 16 of `[a-z0-9]`: valid in a disk name on every storage.
    pub fn parse(raw: &str) -> Result<Self, ClusterIdError> {
        if !contract::is_cluster_id(raw) {
            return Err(ClusterIdError {
                raw: raw.to_string(),
            });
        }
        Ok(Self(raw.to_string()))
    }

    /// The default id: the first 12 hex digits of the `kube-system`
    /// namespace's UID, which lives as long as the cluster and no two
    /// clusters share.
    pub fn from_namespace_uid(uid: &str) -> Option<Self> {
        let hex: String = uid
            .chars()
            .filter(char::is_ascii_hexdigit)
            .map(|c| c.to_ascii_lowercase())
            .take(DERIVED_LEN)
            .collect();
        (hex.len() == DERIVED_LEN).then_some(Self(hex))
    }

    /// The cluster id in a disk name (`<storage>:` and `<vmid>/` may precede
    /// it, a format extension may follow); `None` for disks named without
    /// one: the Go driver's, and this driver's before cluster ids.
    pub fn of_disk(disk: &str) -> Option<Self> {
        contract::disk_mark(disk).map(|(_, id)| Self(id.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests;
