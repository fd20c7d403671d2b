//! Drive property strings (`scsiN: <volume>,key=value,…`): parsing,
//! normalisation and the canonical form Proxmox stores (volume first, keys
//! sorted, booleans as 1/0, `size` in the largest exact unit).

use std::collections::BTreeMap;

/// Sub-options that are booleans in the qemu-server drive schema.
const BOOLEANS: &[&str] = &[
    "backup",
    "detect_zeroes",
    "iothread",
    "replicate",
    "ro",
    "scsiblock",
    "shared",
    "snapshot",
    "ssd",
];

/// Options that can change on a running disk without re-plugging it.
pub const HOT_CHANGEABLE: &[&str] = &[
    "backup",
    "replicate",
    "serial",
    "wwn",
    "size",
    "iops",
    "iops_rd",
    "iops_wr",
    "iops_max",
    "iops_rd_max",
    "iops_wr_max",
    "iops_max_length",
    "iops_rd_max_length",
    "iops_wr_max_length",
    "mbps",
    "mbps_rd",
    "mbps_wr",
    "mbps_max",
    "mbps_rd_max",
    "mbps_wr_max",
    "bps",
    "bps_rd",
    "bps_wr",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drive {
    pub volume: String,
    pub opts: BTreeMap<String, String>,
}

/// `scsi0`…`scsi30`, `virtio0`…`virtio15`, `sata0`…`sata5`, `ide0`…`ide3`.
pub fn is_drive_key(key: &str) -> bool {
    let (bus, max) = if let Some(n) = key.strip_prefix("scsi") {
        (n, 30)
    } else if let Some(n) = key.strip_prefix("virtio") {
        (n, 15)
    } else if let Some(n) = key.strip_prefix("sata") {
        (n, 5)
    } else if let Some(n) = key.strip_prefix("ide") {
        (n, 3)
    } else {
        return false;
    };
    bus.parse::<u32>().is_ok_and(|n| n <= max) && !bus.starts_with('+')
}

pub fn is_unused_key(key: &str) -> bool {
    key.strip_prefix("unused")
        .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n <= 255))
}

/// Hot-pluggable buses.
pub fn hotpluggable(key: &str) -> bool {
    key.starts_with("scsi") || key.starts_with("virtio")
}

fn bool_value(v: &str) -> Option<&'static str> {
    match v {
        "1" | "on" | "yes" | "true" => Some("1"),
        "0" | "off" | "no" | "false" => Some("0"),
        _ => None,
    }
}

impl Drive {
    /// Parses a drive value; the error is the text Proxmox puts on the key.
    pub fn parse(value: &str) -> Result<Self, String> {
        let mut volume = None;
        let mut opts = BTreeMap::new();
        for part in value.split(',') {
            let (k, v) = match part.split_once('=') {
                Some((k, v)) => (k, v),
                None if volume.is_none() => {
                    volume = Some(part.to_string());
                    continue;
                }
                None => return Err("unable to parse drive options".into()),
            };
            if k == "file" || k == "volume" {
                volume = Some(v.to_string());
                continue;
            }
            let v = if BOOLEANS.contains(&k) {
                bool_value(v)
                    .ok_or("unable to parse drive options")?
                    .to_string()
            } else {
                v.to_string()
            };
            if opts.insert(k.to_string(), v).is_some() {
                return Err(format!(
                    "duplicate key in comma-separated list property: {k}"
                ));
            }
        }
        let volume = volume
            .filter(|v| !v.is_empty())
            .ok_or("unable to parse drive options")?;
        // Mutually exclusive throttles, as qemu-server rejects them.
        for (a, b) in [
            ("iops", "iops_rd"),
            ("iops", "iops_wr"),
            ("mbps", "mbps_rd"),
            ("mbps", "mbps_wr"),
        ] {
            if opts.contains_key(a) && opts.contains_key(b) {
                return Err("unable to parse drive options".into());
            }
        }
        for m in [
            "iops_max",
            "iops_rd_max",
            "iops_wr_max",
            "mbps_max",
            "mbps_rd_max",
            "mbps_wr_max",
        ] {
            if opts.contains_key(m) && !opts.contains_key(m.trim_end_matches("_max")) {
                return Err("unable to parse drive options".into());
            }
        }
        Ok(Self { volume, opts })
    }

    /// The canonical form Proxmox stores.
    pub fn canonical(&self) -> String {
        let mut s = self.volume.clone();
        for (k, v) in &self.opts {
            s.push_str(&format!(",{k}={v}"));
        }
        s
    }

    /// `<storage>:<size GiB>`: a request to allocate a new volume.
    pub fn allocation(&self) -> Option<(String, f64)> {
        let re = regex::Regex::new(r"^(([^/:\s]+):)?(\d+(\.\d+)?)$").ok()?;
        let c = re.captures(&self.volume)?;
        Some((c.get(2)?.as_str().to_string(), c[3].parse().ok()?))
    }

    /// `(storage, volname)` of a managed volume.
    pub fn volid(&self) -> Option<(&str, &str)> {
        self.volume
            .split_once(':')
            .filter(|(s, n)| !s.is_empty() && !n.is_empty())
    }

    pub fn is_cdrom(&self) -> bool {
        self.opts.get("media").map(String::as_str) == Some("cdrom")
            || self.volume == "cdrom"
            || self.volume == "none"
    }

    /// Whether `other` differs only in options that can change live.
    pub fn only_hot_changes(&self, other: &Drive) -> bool {
        if self.volume != other.volume {
            return false;
        }
        let keys: std::collections::BTreeSet<&String> =
            self.opts.keys().chain(other.opts.keys()).collect();
        keys.into_iter()
            .filter(|k| self.opts.get(*k) != other.opts.get(*k))
            .all(|k| HOT_CHANGEABLE.contains(&k.as_str()))
    }
}

/// `disk-size` output: the largest binary unit that divides exactly.
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// `disk-size` input: `\d+(\.\d+)?([KMGT](iB)?)?`, binary units, bytes without unit.
pub fn parse_size(s: &str) -> Option<u64> {
    let re = regex::Regex::new(r"^(\d+(?:\.\d+)?)([KMGT])?(?:iB)?$").ok()?;
    let c = re.captures(s)?;
    let n: f64 = c[1].parse().ok()?;
    let mult = match c.get(2).map(|m| m.as_str()) {
        Some("K") => 1u64 << 10,
        Some("M") => 1 << 20,
        Some("G") => 1 << 30,
        Some("T") => 1 << 40,
        _ => 1,
    };
    Some((n * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form_matches_proxmox() {
        let d = Drive::parse(
            "local-lvm:vm-9999-pvc-x,ssd=on,backup=0,wwn=0x5056432d49443031,iothread=1,discard=on,cache=writethrough",
        )
        .unwrap();
        let mut d2 = d.clone();
        d2.opts.insert("size".into(), format_size(10 << 30));
        assert_eq!(
            d2.canonical(),
            "local-lvm:vm-9999-pvc-x,backup=0,cache=writethrough,discard=on,iothread=1,size=10G,ssd=1,wwn=0x5056432d49443031"
        );
        assert_eq!(
            Drive::parse("file=local:9999/x.raw,ro=yes")
                .unwrap()
                .canonical(),
            "local:9999/x.raw,ro=1"
        );
    }

    #[test]
    fn rejects_what_qemu_server_rejects() {
        assert_eq!(
            Drive::parse("a:b,backup=0,backup=1").unwrap_err(),
            "duplicate key in comma-separated list property: backup"
        );
        assert!(Drive::parse("a:b,iops=1,iops_rd=2").is_err());
        assert!(Drive::parse("a:b,mbps_max=5").is_err());
        assert!(Drive::parse("a:b,ssd=maybe").is_err());
    }

    #[test]
    fn sizes_and_keys() {
        assert_eq!(format_size(1536 << 20), "1536M");
        assert_eq!(format_size(123), "123");
        assert_eq!(parse_size("10G"), Some(10 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert!(is_drive_key("scsi30") && !is_drive_key("scsi31") && !is_drive_key("scsihw"));
        assert!(is_unused_key("unused0") && !is_unused_key("unused256"));
        assert_eq!(
            Drive::parse("local-lvm:4").unwrap().allocation(),
            Some(("local-lvm".into(), 4.0))
        );
    }
}
