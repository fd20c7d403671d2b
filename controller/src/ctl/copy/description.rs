//! What a copy VM's config says about it: its name, its description's
//! `key=value` lines (written once, at its creation) and its disk's size.

use std::collections::BTreeMap;

use super::CopySpec;
use crate::drive::DriveLine;
use crate::naming::described::{CLAIM_UID, CREATED, MARK, SOURCE, STORAGE};

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
pub(super) fn describe(spec: &CopySpec, created: i64) -> String {
    let mark = format!("{:08x}", rand::random::<u32>());
    let what = spec.kind.what();
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
        owned = crate::naming::OWNED,
        claim = spec
            .claim_uid
            .as_ref()
            .map(|u| format!("{CLAIM_UID}={u}\n"))
            .unwrap_or_default(),
    )
}

/// Unix seconds now.
pub(super) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_secs() as i64)
        .unwrap_or(0)
}

/// A copy VM's mark (`describe`); `None` for one made before marks.
pub fn mark_of(config: &BTreeMap<String, String>) -> Option<String> {
    described(config, MARK)
}

/// A `key=value` line of a copy VM's description.
pub(crate) fn described(config: &BTreeMap<String, String>, key: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::copy::CopyKind;

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
            kind: CopyKind::Snapshot,
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
