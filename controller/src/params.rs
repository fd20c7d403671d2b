//! StorageClass (and VolumeAttributesClass) parameters, with the Go
//! driver's keys and meanings (proxmox-csi-plugin pkg/csi/parameters.go).
//! A class is immutable, so what the Go driver accepted keeps working with
//! Go's meaning, and is a warning (see `warnings`): an unknown key is
//! ignored, a boolean that is not one of `strconv.ParseBool`'s spellings is
//! false, a VolumeAttributesClass limit of 0 keeps the old limit. The legacy
//! `fstype` the external-provisioner passes through is the provisioner's
//! business. What Go fails on (a number that does not parse) is an error
//! that names the key; so is a value Proxmox would refuse at every attach.

use std::collections::{BTreeMap, HashMap};

use crate::warnings::{ParamWarning, Reason};

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

/// The VolumeAttributesClass keys `apply_mutable` reads.
pub const MUTABLE_KEYS: &[&str] = &[
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
    /// What was taken with the Go driver's meaning rather than refused.
    pub warnings: Vec<ParamWarning>,
}

/// Go's strconv.ParseBool, whose error the Go driver ignores
/// (pkg/csi/parameters.go unmarshalTag): any other spelling is false.
fn parse_bool(key: &str, v: &str, warnings: &mut Vec<ParamWarning>) -> bool {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
        "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
        _ => {
            warnings.push(ParamWarning::new(
                key,
                Reason::NotABoolean {
                    value: v.to_string(),
                },
            ));
            false
        }
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

/// A throttle: Go parses a signed number (strconv.ParseInt) and sets a
/// limit only above 0 (ExtractParameters: `*p.Iops > 0`).
pub fn limit(key: &str, v: &str) -> Result<Option<u64>, ParamError> {
    let n: i64 = number(key, v)?;
    Ok(u64::try_from(n).ok().filter(|n| *n > 0))
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
                "ssd" => p.ssd = Some(parse_bool(key, v, &mut p.warnings)),
                // Go never read `discard`: a value it would have ignored
                // must not fail a publish of an old PV.
                "discard" => {
                    const ALLOWED: &[&str] = &["on", "ignore"];
                    if ALLOWED.contains(&v) {
                        p.discard = Some(v.to_string());
                    } else {
                        p.warnings.push(ParamWarning::new(
                            key,
                            Reason::ValueIgnored {
                                value: v.to_string(),
                                allowed: ALLOWED,
                            },
                        ));
                    }
                }
                "aio" => p.aio = Some(one_of(key, v, &["native", "threads", "io_uring"])?),
                "iothread" => p.iothread = parse_bool(key, v, &mut p.warnings),
                "backup" => p.backup = parse_bool(key, v, &mut p.warnings),
                "diskIOPS" => p.iops = limit(key, v)?,
                "diskMBps" => p.mbps = limit(key, v)?,
                "blockSize" => p.block_size = Some(number(key, v)?),
                "inodeSize" => p.inode_size = Some(number(key, v)?),
                "replicate" => p.replicate = parse_bool(key, v, &mut p.warnings),
                "replicateSchedule" => p.replicate_schedule = Some(v.to_string()),
                "replicateZones" => {
                    p.replicate_zones = v
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                }
                other => p
                    .warnings
                    .push(ParamWarning::new(other, Reason::UnknownKey)),
            }
        }
        p.warnings.sort_by(|a, b| a.key.cmp(&b.key));
        if p.storage.is_empty() {
            return Err(ParamError {
                key: "storage".into(),
                reason: "parameter storage must be provided".into(),
            });
        }
        Ok(p)
    }

    /// A VolumeAttributesClass applied at attach: as `apply_mutable`, but a
    /// key no driver reads is left out and returned, never refused (the Go
    /// driver ignores it, pkg/csi/parameters.go ExtractModifyVolumeParameters
    /// reads only its own fields; a class cannot be changed, so a refusal
    /// would fail every attach of the PV).
    pub fn apply_mutable_at_attach(
        &mut self,
        params: &HashMap<String, String>,
    ) -> Result<Vec<String>, ParamError> {
        let (known, unknown): (HashMap<_, _>, HashMap<_, _>) = params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .partition(|(k, _)| MUTABLE_KEYS.contains(&k.as_str()));
        self.apply_mutable(&known)?;
        let mut unknown: Vec<String> = unknown.into_keys().collect();
        unknown.sort();
        Ok(unknown)
    }

    /// Applies VolumeAttributesClass values on top; returns the class's
    /// warnings. As in the Go driver (ExtractModifyVolumeParameters,
    /// MergeMap), an empty value or a limit of 0 leaves what is there; a key
    /// no driver reads is refused, as the CSI spec asks.
    pub fn apply_mutable(
        &mut self,
        params: &HashMap<String, String>,
    ) -> Result<Vec<ParamWarning>, ParamError> {
        let mut warnings = Vec::new();
        for (key, v) in params {
            if v.is_empty() {
                continue;
            }
            match key.as_str() {
                "diskIOPS" | "diskMBps" => {
                    let Some(n) = limit(key, v)? else {
                        warnings.push(ParamWarning::new(key, Reason::ZeroKeepsLimit));
                        continue;
                    };
                    if key == "diskIOPS" {
                        self.iops = Some(n);
                    } else {
                        self.mbps = Some(n);
                    }
                }
                "backup" => self.backup = parse_bool(key, v, &mut warnings),
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
                "replicateSchedule" | "replicateZones" => {
                    warnings.push(ParamWarning::new(key, Reason::NotActedOn))
                }
                // The spec's INVALID_ARGUMENT for a parameter not supported
                // (`tests/conformance`: "ControllerModifyVolume: an unsupported
                // mutable parameter is INVALID_ARGUMENT"); every key the Go
                // driver reads is above.
                other => {
                    return Err(ParamError {
                        key: other.into(),
                        reason: "is not a mutable parameter; allowed: diskIOPS, diskMBps, backup, cache, \
                                 replicateSchedule, replicateZones"
                            .into(),
                    });
                }
            }
        }
        warnings.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(warnings)
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
        assert_eq!(StorageParams::parse(&ctx).unwrap().warnings.len(), 5);
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
    fn a_discard_go_never_read_is_a_warning_not_a_refusal() {
        let p = StorageParams::parse(&map(&[("storage", "s"), ("discard", "true")])).unwrap();
        assert_eq!(p.discard, None);
        assert_eq!(
            p.warnings
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["discard: \"true\" is not one of on, ignore; left unset, as the Go driver leaves it"]
        );
    }

    #[test]
    fn errors_name_the_key_and_what_is_allowed() {
        let e = |pairs: &[(&str, &str)]| StorageParams::parse(&map(pairs)).unwrap_err().to_string();
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
        assert_eq!(
            p.warnings,
            [ParamWarning::new("stroage", Reason::UnknownKey)]
        );
        assert_eq!(p.format.as_deref(), Some("raw"));
        assert_eq!(
            e(&[("ssd", "1")]),
            "parameter storage: parameter storage must be provided"
        );
        assert_eq!(
            e(&[("storage", "s"), ("diskIOPS", "lots")]),
            "parameter diskIOPS: \"lots\" is not a number"
        );
        // Go parses a signed number and sets no limit for one of 0 or less.
        let p = StorageParams::parse(&map(&[("storage", "s"), ("diskIOPS", "-5")])).unwrap();
        assert_eq!(p.iops, None);
    }

    #[test]
    fn booleans_are_gos_parse_bool_and_anything_else_is_false() {
        for (v, want) in [
            ("True", true),
            ("1", true),
            ("t", true),
            ("TRUE", true),
            ("F", false),
        ] {
            let p = StorageParams::parse(&map(&[("storage", "s"), ("backup", v)])).unwrap();
            assert_eq!((p.backup, p.warnings.len()), (want, 0), "{v}");
        }
        let p = StorageParams::parse(&map(&[
            ("storage", "s"),
            ("ssd", "yes"),
            ("iothread", "on"),
        ]))
        .unwrap();
        assert_eq!((p.ssd, p.iothread), (Some(false), false));
        assert_eq!(
            p.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
            [
                "iothread: \"on\" is not a boolean (true, false, 1, 0, t, f), taken as false as the Go driver does",
                "ssd: \"yes\" is not a boolean (true, false, 1, 0, t, f), taken as false as the Go driver does",
            ]
        );
    }

    #[test]
    fn a_class_limit_of_zero_keeps_the_limit() {
        let mut p = StorageParams::parse(&map(&[("storage", "s"), ("diskIOPS", "300")])).unwrap();
        let w = p
            .apply_mutable(&map(&[
                ("diskIOPS", "-1"),
                ("diskMBps", "20"),
                ("replicateSchedule", "*/5"),
                ("replicateZones", "a,b"),
                ("backup", ""),
            ]))
            .unwrap();
        assert_eq!((p.iops, p.mbps, p.backup), (Some(300), Some(20), false));
        assert_eq!(
            w,
            [
                ParamWarning::new("diskIOPS", Reason::ZeroKeepsLimit),
                ParamWarning::new("replicateSchedule", Reason::NotActedOn),
                ParamWarning::new("replicateZones", Reason::NotActedOn),
            ]
        );
        assert!(
            p.apply_mutable(&map(&[("tier", "gold")]))
                .unwrap_err()
                .to_string()
                .starts_with("parameter tier: is not a mutable parameter")
        );
        // What Go fails on fails here too.
        assert_eq!(
            p.apply_mutable(&map(&[("diskMBps", "fast")]))
                .unwrap_err()
                .to_string(),
            "parameter diskMBps: \"fast\" is not a number"
        );
    }
}

#[cfg(test)]
mod documented {
    /// Every key a class may carry is in docs/parameters.md, as a table row.
    #[test]
    fn every_key_is_in_the_parameter_reference() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/parameters.md"
        ))
        .unwrap_or_default();
        let keys = super::KEYS.iter().chain(super::MUTABLE_KEYS).chain(&[
            "attached",
            "zone",
            "csi.storage.k8s.io/fstype",
        ]);
        for key in keys {
            assert!(
                doc.contains(&format!("| `{key}` |")),
                "docs/parameters.md has no row for `{key}`"
            );
        }
    }
}
