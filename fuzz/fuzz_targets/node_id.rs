//! CSI node ids: no panic; what parses prints back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxmox_csi_common::NodeId;

fuzz_target!(|raw: &str| {
    if let Ok(n) = NodeId::parse(raw) {
        assert_eq!(n.to_string(), raw);
        assert!(n.vmid.is_none_or(|v| v >= 100));
    }
});
