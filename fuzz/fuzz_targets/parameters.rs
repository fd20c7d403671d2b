//! StorageClass parameters (`key=value` lines): no panic; accepted ones go
//! through the volume context and come back the same, but for the warnings
//! (the context carries what the values were taken as, not what was written).
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use proxmox_csi_controller::params::StorageParams;

fuzz_target!(|text: &str| {
    let map: HashMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Ok(p) = StorageParams::parse(&map) {
        let ctx: HashMap<String, String> = p.context().into_iter().collect();
        let back = StorageParams::from_context(&ctx).expect("a context we wrote parses");
        assert_eq!(
            back,
            StorageParams {
                warnings: Vec::new(),
                ..p.clone()
            },
            "{map:?}"
        );
        let _ = p.drive_options(true);
    }
});
