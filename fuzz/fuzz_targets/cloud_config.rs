//! The cloud config: any text is parsed or refused with a message, never a
//! panic; a secret never shows in the refusal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxmox_csi_controller::config::CloudConfig;

fuzz_target!(|text: &str| {
    if let Err(e) = CloudConfig::parse(text) {
        assert!(!e.to_string().is_empty());
    }
});
