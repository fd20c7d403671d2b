//! Volume handles, exactly as the Go driver writes them:
//! `region/zone/storage/disk`, or `region//storage/disk` on shared storage.

use std::fmt;

use proxmox_csi_common::contract::{self, BlankFor};

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
    pub fn parse(raw: &str) -> Result<Self, String> {
        let parts: Vec<&str> = raw.splitn(4, '/').collect();
        let [region, zone, storage, disk] = parts.as_slice() else {
            return Err(format!(
                "volume id {raw:?}: VolumeID must be in the format of region/zone/storageName/diskName"
            ));
        };
        if region.is_empty() || storage.is_empty() || disk.is_empty() {
            return Err(format!(
                "volume id {raw:?}: region, storage and disk must not be empty (region/zone/storageName/diskName)"
            ));
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

/// The Go driver's owner regex: `(^|-|/)vm-([1-9][0-9]{2,8})(-|$)`.
/// The PV name in a disk name, as the Go driver reads it (pkg/utils/volume
/// volume.go PV): what follows `vm-<id>-`, without an extension.
pub fn pv_of(disk: &str) -> Option<&str> {
    let mut parts = disk.splitn(3, '-');
    let (_, _, rest) = (parts.next()?, parts.next()?, parts.next()?);
    rest.split('.').next().filter(|pv| !pv.is_empty())
}

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

/// 12 hex digits of a UID: 48 bits, so two clusters sharing one Proxmox
/// cluster do not meet by chance.
const DERIVED_LEN: usize = 12;

impl ClusterId {
    /// 1 to 16 of `[a-z0-9]`: valid in a disk name on every storage.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if !contract::is_cluster_id(raw) {
            return Err(format!(
                "cluster id {raw:?}: 1 to {} lower-case letters and digits",
                contract::CLUSTER_ID_MAX
            ));
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

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The disk name of a new volume: `vm-<vmid>-<name>`, with the format as
/// its extension where the storage names formats so (file storage, where
/// Proxmox adds the `<vmid>/` directory; qcow2 on thick LVM); with a
/// cluster id, its mark and the id follow the name (`.csf-<id>`).
pub fn disk_filename(
    vmid: u32,
    name: &str,
    mark: Option<(BlankFor, &ClusterId)>,
    extension: Option<&str>,
) -> String {
    let name = disk_name(name);
    let mark = mark.map_or_else(String::new, |(kind, c)| format!("{}{c}", kind.mark()));
    match extension {
        Some(format) => format!("vm-{vmid}-{name}{mark}.{format}"),
        None => format!("vm-{vmid}-{name}{mark}"),
    }
}

/// The cluster id in a disk name (`<storage>:` and `<vmid>/` may precede
/// it, a format extension may follow); `None` for disks named without one:
/// the Go driver's, and this driver's before cluster ids.
pub fn cluster_of(disk: &str) -> Option<ClusterId> {
    contract::disk_mark(disk).map(|(_, id)| ClusterId(id.to_string()))
}

/// A CSI volume name as the part of a disk name every storage accepts:
/// LVM's `[a-z0-9][a-z0-9-_.]*[a-z0-9]` (case-insensitive; pve-storage
/// src/PVE/Storage/Plugin.pm parse_lvm_name) is the narrowest. The
/// provisioner's `pvc-<uid>` is kept as it is (the Go driver's disk names);
/// any other name has the other characters replaced and a hash of the name
/// appended, so two names never share a disk.
pub fn disk_name(name: &str) -> String {
    // A name that holds a mark itself would read as a marked disk's.
    let marked = contract::holds_mark(name);
    let allowed =
        move |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_') || (c == '.' && !marked);
    if !name.is_empty()
        && !marked
        && name.chars().all(allowed)
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return name.to_string();
    }
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(name.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect();
    let clean: String = name
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .collect();
    format!(
        "{}-{hash}",
        clean.trim_matches(|c: char| !c.is_ascii_alphanumeric())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names_are_valid_on_every_storage() {
        assert_eq!(
            disk_name("pvc-5bc58ec7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"),
            "pvc-5bc58ec7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
        );
        let odd = disk_name("sanity-vol+1-83CE3ED4");
        assert!(
            odd.starts_with("sanity-vol-1-83CE3ED4-")
                && odd.len() == "sanity-vol-1-83CE3ED4-".len() + 8,
            "{odd}"
        );
        assert_ne!(disk_name("a+b"), disk_name("a-b"));
        assert!(
            disk_name("x/")
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        );
    }

    #[test]
    fn cluster_ids_are_written_into_disk_names_and_read_back() {
        let id = ClusterId::from_namespace_uid("5BC58EC7-1c2d-4e5f-8a9b-0c1d2e3f4a5b").unwrap();
        assert_eq!(id.as_str(), "5bc58ec71c2d");
        assert_eq!(ClusterId::from_namespace_uid("12ab"), None);
        let block = disk_filename(9999, "pvc-a", Some((BlankFor::Filesystem, &id)), None);
        assert_eq!(block, "vm-9999-pvc-a.csf-5bc58ec71c2d");
        let file = disk_filename(
            9999,
            "pvc-a",
            Some((BlankFor::Filesystem, &id)),
            Some("qcow2"),
        );
        let raw = disk_filename(9999, "pvc-b", Some((BlankFor::Block, &id)), None);
        assert_eq!(raw, "vm-9999-pvc-b.csb-5bc58ec71c2d");
        assert_eq!(cluster_of(&raw), Some(id.clone()));
        // Disks named before what they were made for was recorded.
        assert_eq!(
            cluster_of("vm-9999-pvc-c.csi-5bc58ec71c2d"),
            Some(id.clone())
        );
        assert_eq!(file, "vm-9999-pvc-a.csf-5bc58ec71c2d.qcow2");
        assert_eq!(disk_filename(9999, "pvc-a", None, None), "vm-9999-pvc-a");
        for name in [
            block.clone(),
            format!("local-lvm:{block}"),
            format!("nfs:9999/{file}"),
        ] {
            assert_eq!(cluster_of(&name), Some(id.clone()), "{name}");
        }
        // The PV name the Go driver reads is kept.
        assert_eq!(pv_of(&block), Some("pvc-a"));
        assert_eq!(owner_of(&block), Some(9999));
        for legacy in [
            "vm-9999-pvc-a",
            "vm-9999-snapshot-x",
            "9999/vm-9999-pvc-a.raw",
        ] {
            assert_eq!(cluster_of(legacy), None, "{legacy}");
        }
        assert_eq!(cluster_of("vm-9999-a.csi-UPPER"), None);
        // A volume named like a marked disk is not taken for that cluster's.
        for name in ["x.csi-aaaa11112222", "x.csb-aaaa11112222"] {
            let forged = disk_filename(9999, name, None, None);
            assert_eq!(cluster_of(&forged), None, "{forged}");
        }
        assert!(ClusterId::parse("").is_err() && ClusterId::parse("a-b").is_err());
        assert!(ClusterId::parse("prod1").is_ok());
    }

    #[test]
    fn parses_and_prints_the_go_drivers_handles() {
        let v = VolumeId::parse("Region-1/pve-1/data/vm-9999-pvc-5bc58ec7").unwrap();
        assert_eq!(v.zone.as_deref(), Some("pve-1"));
        assert_eq!(v.volid(), "data:vm-9999-pvc-5bc58ec7");
        assert_eq!(v.owner(), Some(9999));
        assert_eq!(v.to_string(), "Region-1/pve-1/data/vm-9999-pvc-5bc58ec7");
        let s = VolumeId::parse("r//nfs/9999/vm-9999-pvc-a.raw").unwrap();
        assert_eq!(s.zone, None);
        assert_eq!(s.disk, "9999/vm-9999-pvc-a.raw");
        assert_eq!(s.to_string(), "r//nfs/9999/vm-9999-pvc-a.raw");
        let e = VolumeId::parse("r/z/s").unwrap_err();
        assert!(
            e.contains("VolumeID must be in the format of region/zone/storageName/diskName"),
            "{e}"
        );
        assert!(VolumeId::parse("r/z//d").is_err());
    }

    #[test]
    fn owner_follows_the_go_regex() {
        assert_eq!(owner_of("vm-100-disk-1"), Some(100));
        assert_eq!(owner_of("9999/vm-9999-pvc-a.raw"), Some(9999));
        assert_eq!(owner_of("base-100-disk-0/vm-101-disk-0"), Some(101));
        assert_eq!(owner_of("vm-99-disk-1"), None);
        assert_eq!(owner_of("pvc-1"), None);
    }
}
