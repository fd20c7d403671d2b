//! SMBIOS identity of the VM this node runs in, from `/sys/class/dmi/id`.
//!
//! Proxmox writes the VM's `smbios1` settings there; by convention the
//! serial carries `i=<vmid>` (e.g. `h=worker-2;i=112`), which is how a node
//! learns its VMID without Proxmox credentials.

use std::path::Path;

use crate::error::HostdError;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    pub system_uuid: String,
    pub system_serial: String,
    pub product_name: String,
    pub vmid: Option<u32>,
}

/// Reads the identity under `dmi_dir` (normally `/sys/class/dmi/id`).
pub fn read(dmi_dir: &Path) -> Result<NodeIdentity, HostdError> {
    let field = |name: &str| -> Result<String, HostdError> {
        let path = dmi_dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(s.trim().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(HostdError::io("reading", path.display(), e)),
        }
    };
    let system_serial = field("product_serial")?;
    Ok(NodeIdentity {
        system_uuid: field("product_uuid")?,
        vmid: vmid_from_serial(&system_serial),
        system_serial,
        product_name: field("product_name")?,
    })
}

/// Extracts `i=<vmid>` from a `key=value;key=value` SMBIOS serial. Values may
/// be base64-encoded by Proxmox (`base64=1`), but `i=` is always numeric.
pub fn vmid_from_serial(serial: &str) -> Option<u32> {
    serial
        .split([';', ','])
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == "i")
        .and_then(|(_, v)| v.trim().parse::<u32>().ok())
        .filter(|v| *v >= 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_vmid_in_the_serial() {
        assert_eq!(vmid_from_serial("h=worker-2;i=112"), Some(112));
        assert_eq!(vmid_from_serial("i=100"), Some(100));
        assert_eq!(vmid_from_serial("h=worker-2"), None);
        assert_eq!(vmid_from_serial("i=abc"), None);
        assert_eq!(vmid_from_serial("i=5"), None);
        assert_eq!(vmid_from_serial(""), None);
    }

    #[test]
    fn reads_dmi_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("product_uuid"), "1b2c-3d\n").unwrap();
        std::fs::write(dir.path().join("product_serial"), "h=w2;i=112\n").unwrap();
        let id = read(dir.path()).unwrap();
        assert_eq!(id.system_uuid, "1b2c-3d");
        assert_eq!(id.vmid, Some(112));
        assert_eq!(id.product_name, "");
    }
}
