//! Volume handles, exactly as the Go driver writes them:
//! `region/zone/storage/disk`, or `region//storage/disk` on shared storage.

use std::fmt;

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

/// The disk name of a new volume: `vm-<vmid>-<name>`, or on file storage
/// `vm-<vmid>-<name>.<format>` (Proxmox adds the `<vmid>/` directory).
pub fn disk_filename(vmid: u32, name: &str, file_storage: bool, format: &str) -> String {
    let name = disk_name(name);
    if file_storage {
        format!("vm-{vmid}-{name}.{format}")
    } else {
        format!("vm-{vmid}-{name}")
    }
}

/// A CSI volume name as the part of a disk name every storage accepts:
/// LVM's `[a-z0-9][a-z0-9-_.]*[a-z0-9]` (case-insensitive; pve-storage
/// src/PVE/Storage/Plugin.pm parse_lvm_name) is the narrowest. The
/// provisioner's `pvc-<uid>` is kept as it is (the Go driver's disk names);
/// any other name has the other characters replaced and a hash of the name
/// appended, so two names never share a disk.
pub fn disk_name(name: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !name.is_empty()
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
