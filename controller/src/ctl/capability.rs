//! Volume capabilities a Proxmox disk can honour: one VM at a time, mount
//! (`contract::FS_TYPES`) or block.

use proxmox_csi_common::contract;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::volume_capability::AccessType;
use proxmox_csi_proto::csi::v1::volume_capability::access_mode::Mode;

/// `Err(reason)` names the first capability that cannot be honoured.
pub fn check_capabilities(field: &str, caps: &[csi::VolumeCapability]) -> Result<(), String> {
    if caps.is_empty() {
        return Err(format!(
            "{field}: at least one volume capability is required"
        ));
    }
    for (i, cap) in caps.iter().enumerate() {
        let mode = cap
            .access_mode
            .as_ref()
            .map(|m| m.mode())
            .unwrap_or(Mode::Unknown);
        match mode {
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter => {}
            Mode::Unknown => return Err(format!("{field}[{i}].access_mode: is required")),
            other => {
                return Err(format!(
                    "{field}[{i}].access_mode: {} is not supported: a Proxmox disk is attached to one VM at a time (use a ReadWriteOnce or ReadWriteOncePod claim)",
                    other.as_str_name()
                ));
            }
        }
        match &cap.access_type {
            Some(AccessType::Block(_)) => {}
            Some(AccessType::Mount(m)) => {
                if !m.fs_type.is_empty() && !contract::FS_TYPES.contains(&m.fs_type.as_str()) {
                    return Err(format!(
                        "{field}[{i}].mount.fs_type: {:?} is not supported; allowed: {}",
                        m.fs_type,
                        contract::fs_types_allowed()
                    ));
                }
            }
            None => return Err(format!("{field}[{i}].access_type: must be mount or block")),
        }
    }
    Ok(())
}
