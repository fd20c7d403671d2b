//! Validation of CSI node requests, turning each into the narrow hostd
//! request it stands for. Every refusal names the field and what is allowed.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use proxmox_csi_common::contract::PublishContext;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::volume_capability::AccessType;
use proxmox_csi_proto::csi::v1::volume_capability::access_mode::Mode;
use proxmox_csi_proto::hostd::v1 as hostd;

use crate::error::AgentError;

/// Secret key holding the LUKS passphrase, as in the Go driver.
pub const PASSPHRASE_KEY: &str = "encryption-passphrase";

/// Mount options that would change what is mounted rather than how.
const FORBIDDEN_FLAGS: &[&str] = &[
    "bind",
    "rbind",
    "remount",
    "move",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "private",
    "rprivate",
    "unbindable",
    "runbindable",
    "loop",
    "x-mount.mkdir",
];

#[derive(Debug, Clone)]
pub struct Rules {
    /// kubelet's root directory; paths must lie under it.
    pub kubelet_root: PathBuf,
}

fn required<'a>(field: &str, v: &'a str) -> Result<&'a str, AgentError> {
    if v.is_empty() {
        Err(AgentError::invalid(field, "is required"))
    } else {
        Ok(v)
    }
}

pub fn volume_id(v: &str) -> Result<&str, AgentError> {
    required("volume_id", v)?;
    if v.len() > 512 || v.chars().any(char::is_control) {
        return Err(AgentError::invalid(
            "volume_id",
            "must be at most 512 characters without control characters",
        ));
    }
    Ok(v)
}

impl Rules {
    /// A path kubelet gave us: absolute, no `..`, under kubelet's root.
    /// hostd repeats the check after resolving symlinks on the host.
    pub fn path(&self, field: &str, v: &str) -> Result<String, AgentError> {
        required(field, v)?;
        let p = Path::new(v);
        if !p.is_absolute() {
            return Err(AgentError::invalid(
                field,
                format!("{v:?} is not an absolute path"),
            ));
        }
        if p.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(AgentError::invalid(field, format!("{v:?} contains '..'")));
        }
        if !p.starts_with(&self.kubelet_root) {
            return Err(AgentError::invalid(
                field,
                format!(
                    "{v:?} is not under kubelet's directory {}",
                    self.kubelet_root.display()
                ),
            ));
        }
        Ok(v.to_string())
    }

    /// A `volume_path` of NodeGetVolumeStats or NodeExpandVolume: one that
    /// could not hold a volume of ours (relative, outside kubelet's tree)
    /// names no volume, the spec's NOT_FOUND.
    fn volume_path(&self, v: &str) -> Result<String, AgentError> {
        required("volume_path", v)?;
        self.path("volume_path", v)
            .map_err(|e| AgentError::NoVolumeAt {
                path: v.to_string(),
                source: Box::new(e),
            })
    }
}

/// The access type and mode, checked: single-node modes only.
fn capability<'a>(
    field: &str,
    cap: Option<&'a csi::VolumeCapability>,
) -> Result<(&'a AccessType, Mode), AgentError> {
    let cap = cap.ok_or_else(|| AgentError::invalid(field, "is required"))?;
    let access = cap.access_type.as_ref().ok_or_else(|| {
        AgentError::invalid(format!("{field}.access_type"), "must be mount or block")
    })?;
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| m.mode())
        .ok_or_else(|| AgentError::invalid(format!("{field}.access_mode"), "is required"))?;
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => Ok((access, mode)),
        other => Err(AgentError::invalid(
            format!("{field}.access_mode"),
            format!(
                "{} is not supported: a Proxmox disk is attached to one VM at a time; \
                 allowed: SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER",
                other.as_str_name()
            ),
        )),
    }
}

/// One of `contract::FS_TYPES`; none given is the first (ext4).
fn fs_type(field: &str, v: &str) -> Result<String, AgentError> {
    use proxmox_csi_common::contract::{FS_TYPES, fs_types_allowed};
    match v {
        "" => Ok(FS_TYPES[0].into()),
        v if FS_TYPES.contains(&v) => Ok(v.into()),
        other => Err(AgentError::invalid(
            field,
            format!(
                "{other:?} is not supported; allowed: {}",
                fs_types_allowed()
            ),
        )),
    }
}

/// The capability's mount flags, one option per entry. An entry may hold
/// several, comma-separated, as a StorageClass's `mountOptions` often do
/// (`"noatime,discard"`): mount(8) and the Go driver take them so. A comma
/// inside double quotes (an SELinux `context="…:c1,c2"`) separates nothing.
fn mount_flags(field: &str, flags: &[String]) -> Result<Vec<String>, AgentError> {
    let options = proxmox_csi_common::mount_options::split(flags);
    for f in &options {
        let name = f.split('=').next().unwrap_or_default();
        if f.contains([' ', '\n', '\t']) || f.chars().any(char::is_control) {
            return Err(AgentError::invalid(
                field,
                format!("{f:?} is not a mount option: it holds a space or a control character"),
            ));
        }
        if FORBIDDEN_FLAGS.contains(&name) {
            return Err(AgentError::invalid(
                field,
                format!("{f:?} is not allowed: it changes what is mounted, not how"),
            ));
        }
    }
    Ok(options)
}

/// Go's strconv.ParseBool, which StorageClass values follow.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn context_u32(ctx: &HashMap<String, String>, key: &str) -> Result<u32, AgentError> {
    match ctx.get(key).map(String::as_str) {
        None | Some("") => Ok(0),
        Some(v) => v.parse::<u32>().map_err(|_| {
            AgentError::invalid(
                format!("volume_context.{key}"),
                format!("{v:?} is not a number"),
            )
        }),
    }
}

fn passphrase(
    field: &str,
    secrets: &HashMap<String, String>,
) -> Result<Option<hostd::Encryption>, AgentError> {
    match secrets.get(PASSPHRASE_KEY) {
        None => Ok(None),
        Some(p) if p.is_empty() => Err(AgentError::invalid(
            format!("{field}.{PASSPHRASE_KEY}"),
            "is empty",
        )),
        Some(p) => Ok(Some(hostd::Encryption {
            passphrase: p.as_bytes().to_vec(),
        })),
    }
}

/// The disk's identity from the publish context (`PublishContext`: ours,
/// or a Go driver's, so volumes attached before a switch of drivers keep
/// staging).
fn device(ctx: &HashMap<String, String>) -> Result<hostd::Device, AgentError> {
    let c = PublishContext::from_map(ctx).map_err(AgentError::InvalidContext)?;
    Ok(hostd::Device {
        wwn: c.wwn,
        serial: c.serial.unwrap_or_default(),
    })
}

impl Rules {
    pub fn stage(
        &self,
        r: &csi::NodeStageVolumeRequest,
    ) -> Result<hostd::StageRequest, AgentError> {
        let volume_id = volume_id(&r.volume_id)?.to_string();
        let staging_path = self.path("staging_target_path", &r.staging_target_path)?;
        let (access, mode) = capability("volume_capability", r.volume_capability.as_ref())?;
        let device = device(&r.publish_context)?;
        let encryption = passphrase("secrets", &r.secrets)?;
        let access = match access {
            AccessType::Block(_) => hostd::stage_request::Access::Block(hostd::RawBlock {}),
            AccessType::Mount(m) => {
                let mut flags = mount_flags("volume_capability.mount.mount_flags", &m.mount_flags)?;
                let ssd = r.volume_context.get("ssd").map(String::as_str);
                if ssd.and_then(parse_bool) == Some(true) && !flags.iter().any(|f| f == "noatime") {
                    flags.push("noatime".into());
                }
                hostd::stage_request::Access::Filesystem(hostd::Filesystem {
                    fs_type: fs_type("volume_capability.mount.fs_type", &m.fs_type)?,
                    block_size: context_u32(&r.volume_context, "blockSize")?,
                    inode_size: context_u32(&r.volume_context, "inodeSize")?,
                    mount_flags: flags,
                })
            }
        };
        Ok(hostd::StageRequest {
            volume_id,
            device: Some(device),
            staging_path,
            access: Some(access),
            encryption,
            read_only: mode == Mode::SingleNodeReaderOnly,
        })
    }

    pub fn unstage(
        &self,
        r: &csi::NodeUnstageVolumeRequest,
    ) -> Result<hostd::UnstageRequest, AgentError> {
        Ok(hostd::UnstageRequest {
            volume_id: volume_id(&r.volume_id)?.to_string(),
            staging_path: self.path("staging_target_path", &r.staging_target_path)?,
        })
    }

    pub fn publish(
        &self,
        r: &csi::NodePublishVolumeRequest,
    ) -> Result<hostd::PublishRequest, AgentError> {
        let volume_id = volume_id(&r.volume_id)?.to_string();
        let target_path = self.path("target_path", &r.target_path)?;
        let (access, mode) = capability("volume_capability", r.volume_capability.as_ref())?;
        if r.staging_target_path.is_empty() {
            // The spec's answer when STAGE_UNSTAGE_VOLUME is advertised.
            return Err(AgentError::Unstaged(
                "staging_target_path: is required: this plugin stages volumes (STAGE_UNSTAGE_VOLUME); call NodeStageVolume first".into(),
            ));
        }
        let staging_path = self.path("staging_target_path", &r.staging_target_path)?;
        // Only for raw block, and only when the context names the disk.
        let block_device = match access {
            AccessType::Block(_) if !r.publish_context.is_empty() => {
                Some(device(&r.publish_context)?)
            }
            _ => None,
        };
        let (block, mount_flags) = match access {
            AccessType::Block(_) => (true, Vec::new()),
            AccessType::Mount(m) => {
                fs_type("volume_capability.mount.fs_type", &m.fs_type)?;
                (
                    false,
                    mount_flags("volume_capability.mount.mount_flags", &m.mount_flags)?,
                )
            }
        };
        Ok(hostd::PublishRequest {
            volume_id,
            staging_path,
            target_path,
            read_only: r.readonly || mode == Mode::SingleNodeReaderOnly,
            block,
            mount_flags,
            single_writer: mode == Mode::SingleNodeSingleWriter,
            device: block_device,
        })
    }

    pub fn unpublish(
        &self,
        r: &csi::NodeUnpublishVolumeRequest,
    ) -> Result<hostd::UnpublishRequest, AgentError> {
        Ok(hostd::UnpublishRequest {
            volume_id: volume_id(&r.volume_id)?.to_string(),
            target_path: self.path("target_path", &r.target_path)?,
        })
    }

    pub fn expand(
        &self,
        r: &csi::NodeExpandVolumeRequest,
    ) -> Result<hostd::ExpandRequest, AgentError> {
        if let Some(cap) = r.volume_capability.as_ref() {
            capability("volume_capability", Some(cap))?;
        }
        let required_bytes = r
            .capacity_range
            .as_ref()
            .map(|c| c.required_bytes)
            .unwrap_or(0);
        let required_bytes = u64::try_from(required_bytes).map_err(|_| {
            AgentError::invalid("capacity_range.required_bytes", "must not be negative")
        })?;
        Ok(hostd::ExpandRequest {
            volume_id: volume_id(&r.volume_id)?.to_string(),
            volume_path: self.volume_path(&r.volume_path)?,
            required_bytes,
            encryption: passphrase("secrets", &r.secrets)?,
        })
    }

    pub fn stats(
        &self,
        r: &csi::NodeGetVolumeStatsRequest,
    ) -> Result<hostd::StatsRequest, AgentError> {
        Ok(hostd::StatsRequest {
            volume_id: volume_id(&r.volume_id)?.to_string(),
            volume_path: self.volume_path(&r.volume_path)?,
        })
    }
}

#[cfg(test)]
mod tests;
