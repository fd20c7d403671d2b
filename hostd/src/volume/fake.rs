//! A host made of tables, for the decisions' unit tests: what each device
//! holds, sysfs's names and numbers, the mappings, the mount table. It
//! records what the decisions close, and touches nothing.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::blockdev::BlockDevices;
use crate::error::HostdError;
use crate::luks::Crypt;
use crate::mounts::{MountEntry, Mounts};
use crate::probe::{Contents, Probe};

#[derive(Debug, Default)]
pub(super) struct Fake {
    /// What each device node holds (libblkid's answer).
    pub contents: HashMap<PathBuf, Contents>,
    /// The first non-zero byte of a device among the ones hostd samples.
    pub data_at: HashMap<PathBuf, u64>,
    /// The first non-zero byte of a device's LUKS header area.
    pub header_data_at: HashMap<PathBuf, u64>,
    /// Devices whose LUKS header has a key slot.
    pub keyslots: HashSet<PathBuf>,
    /// Device node → kernel name.
    pub names: HashMap<PathBuf, String>,
    /// Device node → `major:minor` (bound nodes included).
    pub nodes: HashMap<PathBuf, String>,
    /// Kernel name → `major:minor`.
    pub majmins: HashMap<String, String>,
    /// Mapping name → kernel name (`dm-N`) of the active mapping.
    pub active: HashMap<String, String>,
    /// Mappings with a `/dev/mapper` node.
    pub open: HashSet<String>,
    /// Kernel name → the devices under it.
    pub slaves: HashMap<String, Vec<String>>,
    /// Devices another device sits on.
    pub held: HashSet<String>,
    /// Mappings whose disk is gone.
    pub backing_gone: HashSet<String>,
    /// Kernel name → SCSI serial.
    pub serials: HashMap<String, String>,
    pub table: Vec<MountEntry>,
    /// What was closed, in order: the mapping and whether by force.
    pub closed: RefCell<Vec<(String, bool)>>,
    /// How often the sampled bytes were read.
    pub samples: Cell<u32>,
}

impl Fake {
    /// A disk `/dev/<name>` numbered `majmin`, holding `contents`.
    pub fn disk(mut self, name: &str, majmin: &str, contents: Contents) -> Self {
        let node = Path::new("/dev").join(name);
        self.names.insert(node.clone(), name.into());
        self.nodes.insert(node.clone(), majmin.into());
        self.majmins.insert(name.into(), majmin.into());
        self.contents.insert(node, contents);
        self
    }

    /// An active mapping `name` (kernel name `dm`, numbered `majmin`) on `disk`.
    pub fn mapping(mut self, name: &str, dm: &str, majmin: &str, disk: &str) -> Self {
        self.active.insert(name.into(), dm.into());
        self.open.insert(name.into());
        self.majmins.insert(dm.into(), majmin.into());
        self.slaves.insert(dm.into(), vec![disk.into()]);
        self
    }

    pub fn mounted(mut self, majmin: &str, at: &str) -> Self {
        self.table.push(entry(majmin, at, "ext4"));
        self
    }

    pub fn closed(&self) -> Vec<(String, bool)> {
        self.closed.borrow().clone()
    }
}

pub(super) fn entry(majmin: &str, at: &str, fs_type: &str) -> MountEntry {
    MountEntry {
        mount_point: at.into(),
        majmin: majmin.into(),
        root: "/".into(),
        fs_type: fs_type.into(),
        source: String::new(),
        read_only: false,
        super_read_only: false,
    }
}

fn missing(what: &Path) -> HostdError {
    HostdError::failed("probing", what.display(), "no such device in the fake")
}

impl Probe for Fake {
    fn probe(&self, device: &Path) -> Result<Contents, HostdError> {
        self.contents
            .get(device)
            .cloned()
            .ok_or_else(|| missing(device))
    }
    fn first_data(&self, device: &Path) -> Result<Option<u64>, HostdError> {
        self.samples.set(self.samples.get() + 1);
        Ok(self.data_at.get(device).copied())
    }
    fn first_data_in(&self, device: &Path, len: u64) -> Result<Option<u64>, HostdError> {
        self.samples.set(self.samples.get() + 1);
        Ok(self
            .header_data_at
            .get(device)
            .copied()
            .filter(|at| *at < len))
    }
}

impl BlockDevices for Fake {
    fn kernel_name(&self, node: &Path) -> Option<String> {
        self.names.get(node).cloned()
    }
    fn majmin(&self, node: &Path) -> Result<String, HostdError> {
        self.nodes.get(node).cloned().ok_or_else(|| missing(node))
    }
    fn majmin_of(&self, name: &str) -> Option<String> {
        self.majmins.get(name).cloned()
    }
    fn active(&self, mapping: &str) -> Option<String> {
        self.active.get(mapping).cloned()
    }
    fn slaves(&self, name: &str) -> Vec<String> {
        self.slaves.get(name).cloned().unwrap_or_default()
    }
    fn held(&self, name: &str) -> bool {
        self.held.contains(name)
    }
    fn backing_present(&self, mapping: &str) -> bool {
        self.active.contains_key(mapping) && !self.backing_gone.contains(mapping)
    }
    fn serial(&self, name: &str) -> Option<String> {
        self.serials.get(name).cloned()
    }
}

impl Crypt for Fake {
    fn is_open(&self, name: &str) -> bool {
        self.open.contains(name)
    }
    fn has_keyslot(&self, device: &Path) -> Result<bool, HostdError> {
        Ok(self.keyslots.contains(device))
    }
    /// As `luks::go_mapping_on`: `<disk>-encrypted`, active on that disk alone.
    fn go_mapping_on(&self, disk: &str) -> Option<(String, String)> {
        let name = format!("{disk}-encrypted");
        let dm = self.active.get(&name)?;
        (self.slaves(dm) == [disk.to_string()]).then(|| (name, dm.clone()))
    }
    fn close(&self, name: &str, force: bool) -> Result<(), HostdError> {
        self.closed.borrow_mut().push((name.into(), force));
        Ok(())
    }
}

impl Mounts for Fake {
    fn table(&self) -> Result<Vec<MountEntry>, HostdError> {
        Ok(self.table.clone())
    }
}
