//! What a device already holds, asked of libblkid: filesystems, RAID and
//! LUKS superblocks, and partition tables. Anything found means "not blank".

use std::path::Path;

use libblkid_rs::{BlkidProbe, BlkidSafeprobeRet};

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

pub fn probe(device: &Path) -> Result<Contents, HostdError> {
    let fail = |e: libblkid_rs::BlkidErr| HostdError::failed("probing", device.display(), e);
    let mut p = BlkidProbe::new_from_filename(device).map_err(fail)?;
    p.enable_superblocks(true).map_err(fail)?;
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

/// Reads the primary XFS superblock's `sb_inprogress` byte (offset 126),
/// which mkfs.xfs sets first and clears last.
fn xfs_in_progress(device: &Path) -> Result<bool, HostdError> {
    use std::io::Read;
    let mut sb = [0u8; 128];
    std::fs::File::open(device)
        .and_then(|mut f| f.read_exact(&mut sb))
        .map_err(|e| HostdError::failed("reading the XFS superblock of", device.display(), e))?;
    Ok(&sb[0..4] == b"XFSB" && sb[126] != 0)
}
