//! What the controller and the node agree on about a disk: the publish
//! context keys ControllerPublishVolume writes, and the WWN and serial the
//! controller derives from a volume's handle, which hostd checks again on
//! the node before it touches the disk.

use sha2::{Digest, Sha256};

/// Publish context: the disk's WWN (`0x` + 16 hex digits).
pub const CTX_WWN: &str = "wwn";
/// Publish context: the disk's SCSI serial, when the controller set one.
pub const CTX_SERIAL: &str = "serial";
/// Publish context: the SCSI slot number (`scsiN` → `N`).
pub const CTX_LUN: &str = "lun";
/// Publish context the Go driver's node plugin reads: `/dev/disk/by-id/wwn-<wwn>`.
pub const CTX_GO_DEVICE_PATH: &str = "DevicePath";

/// Prefix of every serial [`serial_for`] makes: a disk whose serial starts
/// with it was attached by this driver, and belongs to exactly one handle.
pub const SERIAL_PREFIX: &str = "csi-";

/// The WWN of a volume: NAA type 5, from a hash of the handle; `salt`
/// changes it when the VM already has a drive with that WWN.
pub fn wwn_for(handle: &str, salt: u32) -> String {
    let h = Sha256::digest(format!("{handle}#{salt}").as_bytes());
    let mut v = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
    v = (v & 0x0FFF_FFFF_FFFF_FFFF) | 0x5000_0000_0000_0000;
    format!("0x{v:016x}")
}

/// A drive serial (≤ 20 characters of Proxmox's allowed set) from the handle.
pub fn serial_for(handle: &str) -> String {
    let h = Sha256::digest(handle.as_bytes());
    let hex: String = h.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{SERIAL_PREFIX}{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wwns_are_naa5_and_stable() {
        let a = wwn_for("r/pve2/local-lvm/vm-9999-pvc-a", 0);
        assert_eq!(a, wwn_for("r/pve2/local-lvm/vm-9999-pvc-a", 0));
        assert_ne!(a, wwn_for("r/pve2/local-lvm/vm-9999-pvc-a", 1));
        assert!(a.starts_with("0x5") && a.len() == 18, "{a}");
    }

    #[test]
    fn serials_fit_proxmox_and_name_their_handle() {
        // Fixed values: a change here breaks every attached disk's identity check.
        assert_eq!(serial_for("r/pve2/local-lvm/vm-9999-pvc-a").len(), 20);
        assert_eq!(serial_for("a"), "csi-ca978112ca1bbdca");
        assert_ne!(
            serial_for("r/pve2/local-lvm/vm-9999-pvc-a"),
            serial_for("r/pve2/local-lvm/vm-9999-pvc-b")
        );
    }
}
