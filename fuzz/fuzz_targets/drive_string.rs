//! Drive strings read back from VM configs: no panic, and rendering is
//! stable (render, parse, render gives the same text).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxmox_csi_controller::drive::{DriveLine, is_disk_key};

fuzz_target!(|raw: &str| {
    let line = DriveLine::parse(raw);
    let once = line.render();
    let twice = DriveLine::parse(&once).render();
    assert_eq!(once, twice, "{raw:?}");
    let _ = is_disk_key(raw);
});
