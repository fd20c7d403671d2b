//! The drive line a publish writes (`scsiN: <volid>,<options>,wwn=…,serial=…`)
//! and what is read back from VM configs.

use std::collections::BTreeMap;

/// `scsi1`–`scsi30`: the slots a CSI volume may take (scsi0 is the boot
/// disk), as many as the node plugin reports at most (`SCSI_SLOTS`).
pub const SLOTS: std::ops::RangeInclusive<u32> = 1..=(proxmox_csi_common::SCSI_SLOTS as u32);

/// A drive value split into its volume and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveLine {
    pub volume: String,
    pub opts: BTreeMap<String, String>,
}

impl DriveLine {
    pub fn parse(value: &str) -> Self {
        let mut parts = value.split(',');
        let first = parts.next().unwrap_or_default();
        let volume = first
            .strip_prefix("file=")
            .or_else(|| first.strip_prefix("volume="))
            .unwrap_or(first);
        let opts = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self {
            volume: volume.to_string(),
            opts,
        }
    }

    pub fn render(&self) -> String {
        // A volume that looks like an option keeps its `file=` key.
        let mut s = if self.volume.contains('=') {
            format!("file={}", self.volume)
        } else {
            self.volume.clone()
        };
        for (k, v) in &self.opts {
            s.push_str(&format!(",{k}={v}"));
        }
        s
    }
}

pub use proxmox_csi_common::contract::{serial_for, wwn_for};

/// Drive keys (`scsiN`…) of a config whose volume is `volid`.
pub fn slots_with(config: &BTreeMap<String, String>, volid: &str) -> Vec<String> {
    config
        .iter()
        .filter(|(k, _)| is_disk_key(k))
        .filter(|(_, v)| DriveLine::parse(v).volume == volid)
        .map(|(k, _)| k.clone())
        .collect()
}

/// Where a guest finds drive `scsi<index>`: its SCSI target and LUN, by the
/// VM's `scsihw` (qemu-server src/PVE/QemuServer/DriveDevice.pm scsihw_infos,
/// print_drivedevice_full). lsi and lsi53c810 (the default, 7 ids per
/// controller) and pvscsi address a drive by `scsi-id=<index % maxdev>` at
/// LUN 0; virtio-scsi-pci, virtio-scsi-single and megasas by `scsi-id=0,
/// lun=<index>` (virtio-scsi-single on a controller of its own).
pub fn scsi_address(scsihw: Option<&str>, index: u32) -> ScsiAddress {
    match scsihw.unwrap_or("lsi") {
        hw if hw.starts_with("lsi") => ScsiAddress {
            target: index % 7,
            lun: 0,
        },
        "pvscsi" => ScsiAddress {
            target: index,
            lun: 0,
        },
        _ => ScsiAddress {
            target: 0,
            lun: index,
        },
    }
}

/// A drive's SCSI target and LUN as the guest sees them (`scsi_address`),
/// as the publish context carries them.
pub use proxmox_csi_common::contract::ScsiAddress;

pub fn is_disk_key(k: &str) -> bool {
    ["scsi", "virtio", "sata", "ide"].iter().any(|bus| {
        k.strip_prefix(bus)
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_is_stable() {
        // Found by fuzzing: a doubled `file=` key changed on each round.
        for raw in [
            "file=file=local-isklocal-isk-0,size=2G",
            "local-lvm:vm-1-disk-0,size=1G",
            "file=local-lvm:vm-1-disk-0",
        ] {
            let once = DriveLine::parse(raw).render();
            assert_eq!(DriveLine::parse(&once).render(), once, "{raw}");
        }
    }

    #[test]
    fn drive_lines_round_trip() {
        let d = DriveLine::parse("local-lvm:vm-9999-pvc-a,backup=0,size=1G,wwn=0x5000c500a1b2c3d4");
        assert_eq!(d.volume, "local-lvm:vm-9999-pvc-a");
        assert_eq!(d.opts["wwn"], "0x5000c500a1b2c3d4");
        assert_eq!(
            d.render(),
            "local-lvm:vm-9999-pvc-a,backup=0,size=1G,wwn=0x5000c500a1b2c3d4"
        );
        let cfg = BTreeMap::from([
            (
                "scsi0".to_string(),
                "local-lvm:vm-112-disk-0,size=32G".to_string(),
            ),
            ("scsi3".to_string(), d.render()),
            ("unused0".to_string(), "local-lvm:vm-9999-pvc-a".to_string()),
        ]);
        assert_eq!(slots_with(&cfg, "local-lvm:vm-9999-pvc-a"), ["scsi3"]);
    }
}

#[cfg(test)]
mod address_tests {
    use super::{ScsiAddress, scsi_address};

    /// qemu-server's own cfg2cmd expectations (src/test/cfg2cmd/scsihw-*.conf.cmd).
    #[test]
    fn each_controller_type_addresses_its_drives_as_qemu_server_does() {
        let at = |target, lun| ScsiAddress { target, lun };
        assert_eq!(scsi_address(None, 9), at(2, 0));
        assert_eq!(scsi_address(Some("lsi"), 9), at(2, 0));
        assert_eq!(scsi_address(Some("lsi53c810"), 6), at(6, 0));
        assert_eq!(scsi_address(Some("pvscsi"), 16), at(16, 0));
        assert_eq!(scsi_address(Some("virtio-scsi-pci"), 3), at(0, 3));
        assert_eq!(scsi_address(Some("virtio-scsi-single"), 5), at(0, 5));
        assert_eq!(scsi_address(Some("megasas"), 4), at(0, 4));
    }
}
