//! Volume and snapshot handles: no panic; what parses prints back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxmox_csi_controller::ctl::SnapshotId;
use proxmox_csi_controller::volume::VolumeId;

fuzz_target!(|raw: &str| {
    if let Ok(v) = VolumeId::parse(raw) {
        assert_eq!(VolumeId::parse(&v.to_string()).as_ref(), Ok(&v), "{raw:?}");
        assert!(!v.storage.is_empty() && !v.disk.is_empty() && !v.region.is_empty());
        let _ = v.owner();
    }
    if let Ok(s) = SnapshotId::parse(raw) {
        assert_eq!(
            SnapshotId::parse(&s.to_string()).as_ref(),
            Ok(&s),
            "{raw:?}"
        );
    }
});
