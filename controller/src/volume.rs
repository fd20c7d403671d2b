//! Volume handles, exactly as the Go driver writes them:
//! `region/zone/storage/disk`, or `region//storage/disk` on shared storage.

use proxmox_csi_common::contract::{self, BlankFor};
pub use proxmox_csi_common::handles::{ClusterId, VolumeId, owner_of, pv_of};

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
    ClusterId::of_disk(disk)
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
    }
}
