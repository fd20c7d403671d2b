//! Identifiers shared by the controller and the node plugin, parsed once at
//! the edge and trusted after.

use std::fmt;

/// The Node label that sets how many volumes of this driver a node takes;
/// NodeGetInfo reports it as max_volumes_per_node and ControllerPublishVolume
/// refuses one more (the Go driver's label and default, pkg/csi/driver.go
/// NodeLabelMaxVolumeAttachments, DefaultMaxVolumesPerNode).
pub const MAX_VOLUMES_LABEL: &str = "csi.proxmox.sinextra.dev/max-volume-attachments";
pub const DEFAULT_MAX_VOLUMES: i64 = 24;
/// scsi1–scsi30: the slots a CSI disk can take (scsi0 is the boot disk).
pub const SCSI_SLOTS: i64 = 30;

/// The label's value as the Go driver reads it (pkg/csi/node.go maxVolumes):
/// 0 to 30, anything else is no label. 0 sets no limit of the label's own
/// (Go reports 0, which Kubernetes takes as unlimited); the VM's SCSI slots
/// still are one, so 0 is read as all of them.
pub fn max_volumes_label(value: &str) -> Option<i64> {
    match value.trim().parse::<i64>().ok()? {
        0 => Some(SCSI_SLOTS),
        n if (1..=SCSI_SLOTS).contains(&n) => Some(n),
        _ => None,
    }
}

/// A CSI node id: `<node>` or `<node>/<vmid>`, as the Go driver writes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeId {
    pub name: String,
    pub vmid: Option<u32>,
}

/// Why a string is not a CSI node id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdError {
    #[error("node id {raw:?}: {vmid:?} after '/' is not a VM id (100 or more)")]
    NotAVmId { raw: String, vmid: String },
    #[error(
        "node id {raw:?}: {name:?} is not a Kubernetes node name (lower-case letters, digits, '-' and '.')"
    )]
    NotANodeName { raw: String, name: String },
}

impl NodeId {
    pub fn parse(raw: &str) -> Result<Self, NodeIdError> {
        let (name, vmid) = match raw.split_once('/') {
            Some((n, v)) => {
                // Digits only, no leading zero: one spelling per VM id.
                let canonical =
                    !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && !v.starts_with('0');
                let vmid = v
                    .parse::<u32>()
                    .ok()
                    .filter(|id| canonical && *id >= 100)
                    .ok_or_else(|| NodeIdError::NotAVmId {
                        raw: raw.to_string(),
                        vmid: v.to_string(),
                    })?;
                (n, Some(vmid))
            }
            None => (raw, None),
        };
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !valid {
            return Err(NodeIdError::NotANodeName {
                raw: raw.to_string(),
                name: name.to_string(),
            });
        }
        Ok(Self {
            name: name.to_string(),
            vmid,
        })
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.vmid {
            Some(v) => write!(f, "{}/{v}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms_and_prints_them_back() {
        for raw in ["worker-2", "worker-2/112", "node.example.com/100"] {
            assert_eq!(NodeId::parse(raw).unwrap().to_string(), raw);
        }
        // Found by fuzzing: other spellings of a VM id do not print back.
        for raw in ["workr-2/0522", "w/+112", "w/ 112"] {
            assert!(NodeId::parse(raw).is_err(), "{raw}");
        }
        assert_eq!(NodeId::parse("w/112").unwrap().vmid, Some(112));
        for bad in ["", "/112", "Worker", "w x"] {
            assert!(
                matches!(NodeId::parse(bad), Err(NodeIdError::NotANodeName { .. })),
                "{bad}"
            );
        }
        for bad in ["w/abc", "w/99", "w/112/3"] {
            assert!(
                matches!(NodeId::parse(bad), Err(NodeIdError::NotAVmId { .. })),
                "{bad}"
            );
        }
        assert_eq!(
            NodeId::parse("w/99").unwrap_err().to_string(),
            "node id \"w/99\": \"99\" after '/' is not a VM id (100 or more)"
        );
    }
}
