//! StorageClass (and VolumeAttributesClass) parameters, with the Go
//! driver's keys and meanings. A StorageClass is immutable, so what the Go
//! driver accepted keeps working: an unknown key is logged and ignored (Go
//! ignores it), the legacy `fstype` the external-provisioner passes through
//! is the provisioner's business. What Go fails on (a bad boolean or
//! number) is an error that names the key and what is allowed.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("parameter {key}: {reason}")]
pub struct ParamError {
    pub key: String,
    pub reason: String,
}

/// Keys the Go driver reads, plus `discard` (settable on its own).
const KEYS: &[&str] = &[
    "storage",
    "storageFormat",
    "cache",
    "ssd",
    "discard",
    "aio",
    "iothread",
    "backup",
    "diskIOPS",
    "diskMBps",
    "blockSize",
    "inodeSize",
    "replicate",
    "replicateSchedule",
    "replicateZones",
];

/// Keys a VolumeAttributesClass may set.
const MUTABLE_KEYS: &[&str] = &[
    "diskIOPS",
    "diskMBps",
    "backup",
    "cache",
    "replicateSchedule",
    "replicateZones",
];

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StorageParams {
    pub storage: String,
    pub format: Option<String>,
    pub cache: Option<String>,
    pub ssd: Option<bool>,
    pub discard: Option<String>,
    pub aio: Option<String>,
    pub iothread: bool,
    pub backup: bool,
    pub iops: Option<u64>,
    pub mbps: Option<u64>,
    pub block_size: Option<u32>,
    pub inode_size: Option<u32>,
    pub replicate: bool,
    pub replicate_schedule: Option<String>,
    pub replicate_zones: Vec<String>,
    /// Keys this driver does not know, ignored (a warning each).
    pub ignored: Vec<String>,
}

/// Go's strconv.ParseBool.
fn parse_bool(key: &str, v: &str) -> Result<bool, ParamError> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(ParamError {
            key: key.into(),
            reason: format!("{v:?} is not a boolean; allowed: true, false, 1, 0"),
        }),
    }
}

fn one_of(key: &str, v: &str, allowed: &[&str]) -> Result<String, ParamError> {
    if allowed.contains(&v) {
        Ok(v.to_string())
    } else {
        Err(ParamError {
            key: key.into(),
            reason: format!("{v:?} is not allowed; allowed: {}", allowed.join(", ")),
        })
    }
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, ParamError> {
    v.parse().map_err(|_| ParamError {
        key: key.into(),
        reason: format!("{v:?} is not a number"),
    })
}

impl StorageParams {
    pub fn parse(params: &HashMap<String, String>) -> Result<Self, ParamError> {
        let mut p = Self {
            iothread: true,
            ..Default::default()
        };
        for (key, value) in params {
            // Sidecar metadata (csi.storage.k8s.io/pvc/name …) is not ours to check.
            if key.starts_with("csi.storage.k8s.io/") || value.is_empty() {
                continue;
            }
            let v = value.as_str();
            match key.as_str() {
                "storage" => p.storage = v.to_string(),
                // Go: anything but qcow2 is raw (pkg/csi/controller.go).
                "storageFormat" => {
                    p.format = Some(if v == "qcow2" { "qcow2" } else { "raw" }.to_string())
                }
                // The external-provisioner's legacy key, passed through
                // (pkg/controller/controller.go prepareProvision); the
                // filesystem reaches the node in the volume capability.
                "fstype" | "fsType" | "FSType" => {}
                "cache" => {
                    p.cache = Some(one_of(
                        key,
                        v,
                        &["none", "writethrough", "writeback", "unsafe", "directsync"],
                    )?)
                }
                "ssd" => p.ssd = Some(parse_bool(key, v)?),
                "discard" => p.discard = Some(one_of(key, v, &["on", "ignore"])?),
                "aio" => p.aio = Some(one_of(key, v, &["native", "threads", "io_uring"])?),
                "iothread" => p.iothread = parse_bool(key, v)?,
                "backup" => p.backup = parse_bool(key, v)?,
                "diskIOPS" => p.iops = Some(number(key, v)?).filter(|n| *n > 0),
                "diskMBps" => p.mbps = Some(number(key, v)?).filter(|n| *n > 0),
                "blockSize" => p.block_size = Some(number(key, v)?),
                "inodeSize" => p.inode_size = Some(number(key, v)?),
                "replicate" => p.replicate = parse_bool(key, v)?,
                "replicateSchedule" => p.replicate_schedule = Some(v.to_string()),
                "replicateZones" => {
                    p.replicate_zones = v
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                }
                other => {
                    tracing::warn!(
                        parameter = other,
                        "unknown StorageClass parameter, ignored; known: {}",
                        KEYS.join(", ")
                    );
                    p.ignored.push(other.to_string());
                }
            }
        }
        p.ignored.sort();
        if p.storage.is_empty() {
            return Err(ParamError {
                key: "storage".into(),
                reason: "parameter storage must be provided".into(),
            });
        }
        Ok(p)
    }

    /// Applies VolumeAttributesClass values on top.
    pub fn apply_mutable(&mut self, params: &HashMap<String, String>) -> Result<(), ParamError> {
        for (key, v) in params {
            match key.as_str() {
                "diskIOPS" => self.iops = Some(number::<u64>(key, v)?).filter(|n| *n > 0),
                "diskMBps" => self.mbps = Some(number::<u64>(key, v)?).filter(|n| *n > 0),
                "backup" => self.backup = parse_bool(key, v)?,
                "cache" => {
                    self.cache = Some(one_of(
                        key,
                        v,
                        &["none", "writethrough", "writeback", "unsafe", "directsync"],
                    )?)
                }
                // The Go driver's VolumeAttributesClass keys for replication,
                // parsed and not acted on there (pkg/csi/parameters.go
                // ModifyVolumeParameters): accepted and ignored alike.
                "replicateSchedule" | "replicateZones" => {}
                other => {
                    return Err(ParamError {
                        key: other.into(),
                        reason: format!(
                            "not a mutable parameter; allowed: {}",
                            MUTABLE_KEYS.join(", ")
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The volume context: the Go driver's rendering, which the node reads
    /// (`ssd`, `blockSize`, `inodeSize`) and publish takes the drive options from.
    pub fn context(&self) -> BTreeMap<String, String> {
        let b = |v: bool| if v { "1" } else { "0" }.to_string();
        let mut c = BTreeMap::from([
            ("storage".to_string(), self.storage.clone()),
            ("backup".to_string(), b(self.backup)),
            ("iothread".to_string(), b(self.iothread)),
            ("replicate".to_string(), b(self.replicate)),
        ]);
        let mut opt = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                c.insert(k.to_string(), v);
            }
        };
        opt("storageFormat", self.format.clone());
        opt("cache", self.cache.clone());
        opt("ssd", self.ssd.map(b));
        opt("discard", self.discard.clone());
        opt("aio", self.aio.clone());
        opt("diskIOPS", self.iops.map(|v| v.to_string()));
        opt("diskMBps", self.mbps.map(|v| v.to_string()));
        opt("blockSize", self.block_size.map(|v| v.to_string()));
        opt("inodeSize", self.inode_size.map(|v| v.to_string()));
        opt("replicateSchedule", self.replicate_schedule.clone());
        if !self.replicate_zones.is_empty() {
            c.insert("replicateZones".into(), self.replicate_zones.join(","));
        }
        c
    }

    /// Back from a volume context at publish. The context is the PV's
    /// volumeAttributes, which others write too: the external-provisioner
    /// adds `storage.kubernetes.io/csiProvisionerIdentity` to every PV
    /// (external-provisioner pkg/controller/controller.go, Provision), and
    /// the Go driver's contexts carry `resizeRequired`, `resizeSizeBytes`,
    /// `iops_*`, `mbps_*` (proxmox-csi-plugin pkg/csi/parameters.go,
    /// StorageParameters and ModifyVolumeParameters.MergeMap). Only the keys
    /// we know are read; the rest is not ours to police.
    pub fn from_context(ctx: &HashMap<String, String>) -> Result<Self, ParamError> {
        let known: HashMap<String, String> = ctx
            .iter()
            .filter(|(k, _)| KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Self::parse(&known)
    }

    /// Drive options for the VM config: `backup`, `iothread`, `replicate`,
    /// cache, aio, `ssd` (with `discard=on` unless discard is set), throttles.
    pub fn drive_options(&self, read_only: bool) -> BTreeMap<String, String> {
        let b = |v: bool| if v { "1" } else { "0" }.to_string();
        let mut o = BTreeMap::from([
            ("backup".to_string(), b(self.backup)),
            ("iothread".to_string(), b(self.iothread)),
            ("replicate".to_string(), b(self.replicate)),
        ]);
        if let Some(c) = &self.cache {
            o.insert("cache".into(), c.clone());
        }
        if let Some(a) = &self.aio {
            o.insert("aio".into(), a.clone());
        }
        match (self.ssd, &self.discard) {
            (Some(true), None) => {
                o.insert("ssd".into(), "1".into());
                o.insert("discard".into(), "on".into());
            }
            (ssd, discard) => {
                if let Some(s) = ssd {
                    o.insert("ssd".into(), b(s));
                }
                if let Some(d) = discard {
                    o.insert("discard".into(), d.clone());
                }
            }
        }
        if let Some(n) = self.iops {
            o.insert("iops_rd".into(), n.to_string());
            o.insert("iops_wr".into(), n.to_string());
        }
        if let Some(n) = self.mbps {
            o.insert("mbps_rd".into(), n.to_string());
            o.insert("mbps_wr".into(), n.to_string());
        }
        if read_only {
            o.insert("ro".into(), "1".into());
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_the_go_drivers_parameters() {
        let p = StorageParams::parse(&map(&[
            ("storage", "local-lvm"),
            ("ssd", "true"),
            ("cache", "writethrough"),
            ("diskIOPS", "4000"),
            ("backup", "1"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]))
        .unwrap();
        assert!(p.iothread && p.backup);
        let o = p.drive_options(false);
        assert_eq!(o["ssd"], "1");
        assert_eq!(o["discard"], "on");
        assert_eq!(o["iops_rd"], "4000");
        let ctx = p.context();
        assert_eq!(ctx["ssd"], "1");
        let back = StorageParams::from_context(&ctx.into_iter().collect()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn a_context_keeps_only_the_keys_we_know() {
        let ctx = map(&[
            ("storage", "local-lvm"),
            ("ssd", "1"),
            (
                "storage.kubernetes.io/csiProvisionerIdentity",
                "1730000000000-8081-csi.proxmox.sinextra.dev",
            ),
            ("resizeRequired", "true"),
            ("resizeSizeBytes", "1073741824"),
            ("iops_rd", "100"),
            ("mbps_wr", "10"),
        ]);
        let p = StorageParams::from_context(&ctx).unwrap();
        assert_eq!((p.storage.as_str(), p.ssd), ("local-lvm", Some(true)));
        // Read as a StorageClass, the foreign keys would be ignored with a warning each.
        assert_eq!(StorageParams::parse(&ctx).unwrap().ignored.len(), 5);
    }

    #[test]
    fn discard_can_be_set_on_its_own() {
        let p = StorageParams::parse(&map(&[
            ("storage", "s"),
            ("ssd", "1"),
            ("discard", "ignore"),
        ]))
        .unwrap();
        let o = p.drive_options(true);
        assert_eq!(
            (o["ssd"].as_str(), o["discard"].as_str(), o["ro"].as_str()),
            ("1", "ignore", "1")
        );
    }

    #[test]
    fn errors_name_the_key_and_what_is_allowed() {
        let e = |pairs: &[(&str, &str)]| StorageParams::parse(&map(pairs)).unwrap_err().to_string();
        assert_eq!(
            e(&[("storage", "s"), ("ssd", "yes")]),
            "parameter ssd: \"yes\" is not a boolean; allowed: true, false, 1, 0"
        );
        assert!(
            e(&[("storage", "s"), ("cache", "fast")]).starts_with(
                "parameter cache: \"fast\" is not allowed; allowed: none, writethrough"
            )
        );
        // As the Go driver: an unknown key is ignored (and logged), the
        // provisioner's legacy `fstype` too, any format but qcow2 is raw.
        let p = StorageParams::parse(&map(&[
            ("storage", "s"),
            ("stroage", "x"),
            ("fstype", "xfs"),
            ("storageFormat", "vmdk"),
        ]))
        .unwrap();
        assert_eq!(p.ignored, ["stroage"]);
        assert_eq!(p.format.as_deref(), Some("raw"));
        assert_eq!(
            e(&[("ssd", "1")]),
            "parameter storage: parameter storage must be provided"
        );
        assert_eq!(
            e(&[("storage", "s"), ("diskIOPS", "lots")]),
            "parameter diskIOPS: \"lots\" is not a number"
        );
    }
}
