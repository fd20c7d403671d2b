//! The host behind the seams the decisions read through (`probe::Probe`,
//! `blockdev::BlockDevices`, `luks::Crypt`, `mounts::Mounts`): [`System`]
//! calls the functions that touch the real devices. Unit tests give the
//! decisions a table instead (`volume::fake`).

use std::path::Path;

use crate::blockdev::{self, BlockDevices};
use crate::device;
use crate::error::HostdError;
use crate::luks::{self, Crypt};
use crate::mounts::{self, MountEntry, Mounts};
use crate::probe::{self, Contents, Probe};

/// Everything a decision reads of the host, and the closes it makes.
pub trait Host: Probe + BlockDevices + Crypt + Mounts {}

impl<T: Probe + BlockDevices + Crypt + Mounts> Host for T {}

/// This machine: sysfs, libblkid, libcryptsetup, the mount table.
#[derive(Debug, Clone, Copy, Default)]
pub struct System;

impl Probe for System {
    fn probe(&self, device: &Path) -> Result<Contents, HostdError> {
        probe::probe(device)
    }
    fn first_data(&self, device: &Path) -> Result<Option<u64>, HostdError> {
        probe::first_data(device)
    }
    fn first_data_in(&self, device: &Path, len: u64) -> Result<Option<u64>, HostdError> {
        probe::first_data_in(device, len)
    }
}

impl BlockDevices for System {
    fn kernel_name(&self, node: &Path) -> Option<String> {
        blockdev::kernel_name(node)
    }
    fn majmin(&self, node: &Path) -> Result<String, HostdError> {
        device::majmin(node)
    }
    fn majmin_of(&self, name: &str) -> Option<String> {
        blockdev::majmin_of(name)
    }
    fn active(&self, mapping: &str) -> Option<String> {
        blockdev::active(mapping)
    }
    fn slaves(&self, name: &str) -> Vec<String> {
        blockdev::slaves(name)
    }
    fn held(&self, name: &str) -> bool {
        blockdev::held(name)
    }
    fn backing_present(&self, mapping: &str) -> bool {
        blockdev::backing_present(mapping)
    }
    fn serial(&self, name: &str) -> Option<String> {
        device::serial_of(name)
    }
}

impl Crypt for System {
    fn is_open(&self, name: &str) -> bool {
        luks::is_open(name)
    }
    fn has_keyslot(&self, device: &Path) -> Result<bool, HostdError> {
        luks::has_keyslot(device)
    }
    fn go_mapping_on(&self, disk: &str) -> Option<(String, String)> {
        luks::go_mapping_on(disk)
    }
    fn close(&self, name: &str, force: bool) -> Result<(), HostdError> {
        luks::close(name, force)
    }
}

impl Mounts for System {
    fn table(&self) -> Result<Vec<MountEntry>, HostdError> {
        mounts::table()
    }
}
