//! Direct I/O on a device: exactly the bytes asked for, no readahead, no
//! page cache another writer may have left stale. Files that do not take
//! O_DIRECT (a test's image on tmpfs) are opened plainly.

use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::error::HostdError;

nix::ioctl_write_ptr_bad!(blkzeroout, nix::request_code_none!(0x12, 127), [u64; 2]);

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

/// Makes each `(offset, length)` range of the device `f` is open on read
/// back as zeros. A block device is asked to zero them itself (BLKZEROOUT:
/// the kernel drops its cached pages of the range, uses the device's
/// write-zeroes command without unmapping, and writes zero pages where the
/// device has none), one request per range instead of a synchronous write
/// per MiB. Only where the request does not apply (a regular file, a kernel
/// without it) are zeros written instead; any other refusal (EBUSY: a
/// filesystem or a mapping holds the device) is the answer. The caller syncs.
pub fn zero(f: &std::fs::File, ranges: &[(u64, u64)]) -> std::io::Result<()> {
    use nix::errno::Errno;
    let block = f.metadata()?.file_type().is_block_device();
    for &(at, len) in ranges {
        if block {
            // SAFETY: `f` is open on a block device; the argument is the two
            // u64s the ioctl reads (linux block/ioctl.c blk_ioctl_zeroout).
            match unsafe { blkzeroout(f.as_raw_fd(), &[at, len]) } {
                Ok(_) => continue,
                Err(Errno::ENOTTY | Errno::EOPNOTSUPP) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let chunk = Aligned::zeroed(len.min(8 << 20) as usize);
        let mut o = at;
        while o < at + len {
            let n = (at + len - o).min(chunk.len as u64) as usize;
            f.write_all_at(&chunk.buf()[..n], o)?;
            o += n as u64;
        }
    }
    Ok(())
}
