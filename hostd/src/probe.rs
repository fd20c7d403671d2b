//! What a device already holds, asked of libblkid: filesystems, RAID and
//! LUKS superblocks, and partition tables. Anything found means "not blank";
//! and a device without any signature still holds data if any byte of it
//! that hostd samples is not zero.

use std::path::Path;

use libblkid_rs::{BlkidProbe, BlkidSafeprobeRet, BlkidSublks, BlkidSublksFlags};

use crate::direct;
use crate::error::HostdError;

/// The signature found on a device, e.g. `ext4`, `crypto_LUKS`, `gpt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    Blank,
    Filesystem(String),
    PartitionTable(String),
    /// Several signatures at once: certainly not blank.
    Ambiguous,
    /// A filesystem whose mkfs never finished (xfs `sb_inprogress`): the
    /// kernel refuses to mount it, so it holds nothing to lose.
    Unfinished(String),
}

impl std::fmt::Display for Contents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Blank => f.write_str("no signature"),
            Self::Filesystem(t) => write!(f, "a {t} signature"),
            Self::PartitionTable(t) => write!(f, "a {t} partition table"),
            Self::Ambiguous => f.write_str("several conflicting signatures"),
            Self::Unfinished(t) => write!(f, "an unfinished {t} (mkfs was interrupted)"),
        }
    }
}

/// What a device holds, as a decision asks it: libblkid and the sampled
/// bytes on a host ([`crate::host::System`]), a table in unit tests.
pub trait Probe {
    fn probe(&self, device: &Path) -> Result<Contents, HostdError>;
    /// See [`first_data`].
    fn first_data(&self, device: &Path) -> Result<Option<u64>, HostdError>;
    /// See [`first_data_in`].
    fn first_data_in(&self, device: &Path, len: u64) -> Result<Option<u64>, HostdError>;
}

pub fn probe(device: &Path) -> Result<Contents, HostdError> {
    let fail = |e: libblkid_rs::BlkidErr| HostdError::lib("probing", device.display(), e);
    let mut p = BlkidProbe::new_from_filename(device).map_err(fail)?;
    p.enable_superblocks(true).map_err(fail)?;
    // A superblock whose checksum is wrong is still a filesystem someone's
    // data is in: libblkid drops such superblocks unless told not to.
    p.set_superblock_flags(BlkidSublksFlags::new(vec![
        BlkidSublks::Type,
        BlkidSublks::Usage,
        BlkidSublks::Magic,
        BlkidSublks::Badcsum,
    ]))
    .map_err(fail)?;
    p.enable_partitions(true).map_err(fail)?;
    match p.do_safeprobe().map_err(fail)? {
        BlkidSafeprobeRet::None => Ok(Contents::Blank),
        BlkidSafeprobeRet::Ambiguous => Ok(Contents::Ambiguous),
        BlkidSafeprobeRet::Success => {
            if let Ok(t) = p.lookup_value("TYPE") {
                drop(p);
                if t == "xfs" && xfs_in_progress(device)? {
                    return Ok(Contents::Unfinished(t));
                }
                Ok(Contents::Filesystem(t))
            } else if let Ok(t) = p.lookup_value("PTTYPE") {
                Ok(Contents::PartitionTable(t))
            } else {
                Ok(Contents::Ambiguous)
            }
        }
    }
}

/// The size in bytes an ext2/3/4 or xfs filesystem on `device` says it
/// has, from its primary superblock: ext4 `s_blocks_count_lo`/`_hi` times
/// `1024 << s_log_block_size` (the high word only with the 64bit feature),
/// xfs `sb_dblocks` times `sb_blocksize` (big-endian).
pub fn fs_bytes(device: &Path) -> Result<Option<u64>, HostdError> {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 2048];
    std::fs::File::open(device)
        .and_then(|f| f.read_exact_at(&mut head, 0))
        .map_err(|e| HostdError::io("reading the superblock of", device.display(), e))?;
    let le32 = |o: usize| u32::from_le_bytes([head[o], head[o + 1], head[o + 2], head[o + 3]]);
    if &head[0..4] == b"XFSB" {
        let blocksize = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        let mut d = [0u8; 8];
        d.copy_from_slice(&head[8..16]);
        return Ok(u64::from_be_bytes(d).checked_mul(u64::from(blocksize)));
    }
    let sb = 1024;
    if head[sb + 0x38..sb + 0x3a] == [0x53, 0xef] {
        let incompat_64bit = le32(sb + 0x60) & 0x80 != 0;
        let hi = if incompat_64bit {
            u64::from(le32(sb + 0x150))
        } else {
            0
        };
        let blocks = (hi << 32) | u64::from(le32(sb + 0x04));
        let block = 1024u64.checked_shl(le32(sb + 0x18)).unwrap_or(0);
        return Ok(blocks.checked_mul(block));
    }
    Ok(None)
}

/// Reads the primary XFS superblock's `sb_inprogress` byte (offset 126),
/// which mkfs.xfs sets first and clears last.
fn xfs_in_progress(device: &Path) -> Result<bool, HostdError> {
    use std::io::Read;
    let mut sb = [0u8; 128];
    std::fs::File::open(device)
        .and_then(|mut f| f.read_exact(&mut sb))
        .map_err(|e| HostdError::io("reading the XFS superblock of", device.display(), e))?;
    Ok(&sb[0..4] == b"XFSB" && sb[126] != 0)
}

/// Where [`first_data`] reads: its first MiB whole (partition tables,
/// superblocks, LVM and MD labels, LUKS headers), 64 KiB at every MiB up to
/// 64 MiB and at every 64 MiB up to 4 GiB, 4 KiB at every GiB beyond, and
/// its last MiB whole (backup GPT, MD 0.9/1.0 superblocks): under 10 MiB
/// up to 4 GiB, 4 KiB more per GiB beyond, so a stage pays tens of
/// milliseconds on real disks.
const HEAD: u64 = 64 << 20;
const CHUNK: u64 = 64 << 10;
const MIB: u64 = 1 << 20;

/// (offset, length) of each read.
fn samples(size: u64) -> Vec<(u64, u64)> {
    let mut at: Vec<(u64, u64)> = vec![(0, MIB.min(size))];
    let mut o = MIB;
    while o < size {
        let len = if o < (4 << 30) { CHUNK } else { 4 << 10 };
        at.push((o, len.min(size - o)));
        o += if o < HEAD {
            MIB
        } else if o < (4 << 30) {
            64 << 20
        } else {
            1 << 30
        };
    }
    let tail = size.saturating_sub(MIB);
    at.push((tail, size - tail));
    at.sort_unstable();
    at.dedup();
    at
}

/// The offset of the first non-zero byte hostd finds in `device`'s samples,
/// if any: a device with no signature but data in it is not blank (a
/// filesystem whose first MiB was zeroed, a database written to the raw
/// disk). Thin storage reads its unallocated blocks as zeros quickly.
pub fn first_data(device: &Path) -> Result<Option<u64>, HostdError> {
    first_data_where(device, samples)
}

/// The offset of the first non-zero byte among `device`'s first `len`
/// bytes, every one of them read.
pub fn first_data_in(device: &Path, len: u64) -> Result<Option<u64>, HostdError> {
    first_data_where(device, |size| {
        let end = len.min(size);
        (0..end.div_ceil(MIB))
            .map(|i| (i * MIB, MIB.min(end - i * MIB)))
            .collect()
    })
}

fn first_data_where(
    device: &Path,
    reads: impl FnOnce(u64) -> Vec<(u64, u64)>,
) -> Result<Option<u64>, HostdError> {
    use std::os::unix::fs::FileExt;
    let fail = |e: std::io::Error| HostdError::io("reading", device.display(), e);
    // Direct: exactly the bytes sampled, no readahead around each sample
    // and no page cache filled with a disk's zeros.
    let mut f = direct::open(device, false)?;
    let size = direct::size(&mut f, device)?;
    let mut storage = direct::Aligned::zeroed(MIB as usize);
    let buf = storage.buf_mut();
    for (at, len) in reads(size) {
        let chunk = &mut buf[..usize::try_from(len).unwrap_or(0)];
        if let Err(e) = f.read_exact_at(chunk, at) {
            // An unaligned tail under O_DIRECT: read it through the cache.
            std::fs::File::open(device)
                .and_then(|g| g.read_exact_at(chunk, at))
                .map_err(|_| fail(e))?;
        }
        if let Some(i) = chunk.iter().position(|b| *b != 0) {
            return Ok(Some(at + i as u64));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_the_head_then_sparser_and_the_tail() {
        let at = samples(100 << 20);
        assert_eq!(at[..3], [(0, MIB), (MIB, CHUNK), (2 * MIB, CHUNK)]);
        assert_eq!(at.len(), 1 + 63 + 1 + 1, "{at:?}");
        assert_eq!(at[at.len() - 1], (99 * MIB, MIB));
        let big = samples(1 << 40);
        let bytes: u64 = big.iter().map(|(_, l)| l).sum();
        assert!(bytes < 16 * MIB, "{bytes} bytes read of a 1 TiB disk");
        let small: u64 = samples(4 << 30).iter().map(|(_, l)| l).sum();
        assert!(small < 10 * MIB, "{small} bytes read of a 4 GiB disk");
        assert_eq!(*big.last().unwrap(), ((1 << 40) - MIB, MIB));
        assert_eq!(samples(4096), [(0, 4096)]);
    }

    #[test]
    fn finds_data_behind_a_zeroed_head() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        let mut f = std::fs::File::create(&path).unwrap();
        f.set_len(100 << 20).unwrap();
        assert_eq!(first_data(&path).unwrap(), None);
        f.seek(SeekFrom::Start((40 << 20) + 17)).unwrap();
        f.write_all(b"data").unwrap();
        assert_eq!(first_data(&path).unwrap(), Some((40 << 20) + 17));
        // Between two samples: only a whole read of the region finds it.
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(100 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"x", MIB + (128 << 10)).unwrap();
        assert_eq!(first_data(&path).unwrap(), None);
        assert_eq!(
            first_data_in(&path, 16 * MIB).unwrap(),
            Some(MIB + (128 << 10))
        );
        assert_eq!(first_data_in(&path, MIB).unwrap(), None);
    }
}
