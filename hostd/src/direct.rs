//! Direct I/O on a device: exactly the bytes asked for, no readahead, no
//! page cache another writer may have left stale. Files that do not take
//! O_DIRECT (a test's image on tmpfs) are opened plainly.

use std::io::{Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::HostdError;

/// The alignment O_DIRECT wants of buffers and offsets: 4 KiB covers every
/// logical block size.
pub const ALIGN: usize = 4096;

/// A zeroed buffer of `len` bytes aligned to [`ALIGN`].
#[derive(Debug)]
pub struct Aligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    pub fn zeroed(len: usize) -> Self {
        let storage = vec![0u8; len + ALIGN];
        let start = storage.as_ptr().align_offset(ALIGN);
        Self {
            storage,
            start,
            len,
        }
    }

    pub fn buf(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// Opens `device` for direct reads, or writes that are durable when they
/// return (O_SYNC).
pub fn open(device: &Path, write: bool) -> Result<std::fs::File, HostdError> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(write);
    let direct = o
        .clone()
        .custom_flags(nix::libc::O_DIRECT | if write { nix::libc::O_SYNC } else { 0 })
        .open(device);
    match direct {
        Ok(f) => Ok(f),
        Err(_) => o
            .open(device)
            .map_err(|e| HostdError::io("opening", device.display(), e)),
    }
}

/// The size of the device `f` is open on.
pub fn size(f: &mut std::fs::File, device: &Path) -> Result<u64, HostdError> {
    f.seek(SeekFrom::End(0))
        .map_err(|e| HostdError::io("sizing", device.display(), e))
}
