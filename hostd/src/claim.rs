//! Claims: the disk's own proof that a volume has held its filesystem.
//!
//! A volume the controller created blank for a filesystem
//! (`contract::BlankFor::Filesystem`, read from the handle the disk's serial
//! proves) may arrive holding another volume's bytes: thick LVM allocates
//! extents as a removed volume left them unless the storage has `saferemove`
//! (pve-storage src/PVE/Storage/LVMPlugin.pm `lvcreate` runs `lvcreate -aly
//! -Wy`, which zeroes the first 4 KiB and wipes signatures;
//! `free_lvm_volumes_locked` zeroes only with `saferemove`). Its first
//! stage formats it whatever it holds, if no signature was made on it
//! since; no later stage ever does. A claim tells the two apart: 4 KiB
//! that hostd writes into the last MiB of the disk's last 512 MiB step,
//! which the filesystem is made short of, after mkfs and before the first
//! mount. It names the volume by a hash of its handle: a claim in reused
//! extents is another volume's, not this one's.
//!
//! Only hostd writes block devices, and the filesystem never covers the
//! last MiB, so neither the node plugin nor a pod can remove a claim. An
//! expansion writes the claim at the new end before the filesystem grows
//! over the old one; until it runs, the old end is found among the ends
//! the controller's 512 MiB allocation step allows.

use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use proxmox_csi_common::contract::{self, BlankFor};

use crate::direct::{self, ALIGN, Aligned, open};
use crate::error::HostdError;
use crate::mkfs::MkfsOptions;

/// The tail a claimed volume's filesystem is made short of.
pub const RESERVED: u64 = 1 << 20;
/// The controller allocates and grows volumes in steps of 512 MiB.
const STEP: u64 = 512 << 20;
const MAGIC: &[u8; 16] = b"proxmox-csi:cl1\n";
/// Magic and hash: what a claim is compared on.
const KEY: usize = 16 + 32;

/// What a volume's claim says when it is staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Not created blank for a filesystem (a copy, a restore, a Go driver's
    /// or an unmarked disk): hostd's general rules alone decide.
    Unmarked,
    /// Created blank for a filesystem and never claimed: this stage formats it.
    FirstStage,
    /// Created blank, unclaimed, holding a signature made since its
    /// allocation: staged by the general rules, and claimed only if its
    /// filesystem is exactly the size a first stage makes (one whose claim
    /// a crash kept from being written), never one covering the whole disk.
    MadeSince,
    /// Claimed, at this byte: it has held its filesystem.
    Held(u64),
}

impl Claim {
    /// Reads `device`'s claim if `volume_id` names a volume created blank
    /// for a filesystem.
    pub fn of(volume_id: &str, device: &Path) -> Result<Self, HostdError> {
        if !contract::disk_mark(volume_id).is_some_and(|(k, _)| k == BlankFor::Filesystem) {
            return Ok(Self::Unmarked);
        }
        Ok(match find(device, volume_id)? {
            Some(at) => Self::Held(at),
            None => Self::FirstStage,
        })
    }

    pub fn held_filesystem(self) -> Option<u64> {
        match self {
            Self::Held(at) => Some(at),
            _ => None,
        }
    }

    /// `opts` with the size a filesystem made on `fs_device` (the disk
    /// `raw`, or its LUKS mapping) gets: ending where the claim begins.
    pub fn sized(
        self,
        opts: MkfsOptions,
        raw: &Path,
        fs_device: &Path,
    ) -> Result<MkfsOptions, HostdError> {
        if self != Self::FirstStage {
            return Ok(opts);
        }
        Ok(MkfsOptions {
            size_bytes: first_stage_size(raw, fs_device)?,
            ..opts
        })
    }

    /// After a first stage's mkfs: claims `device` (the disk, under a LUKS
    /// mapping too) for `volume_id`.
    pub fn write(
        self,
        volume_id: &str,
        device: &Path,
        actions: &mut Vec<String>,
    ) -> Result<(), HostdError> {
        if matches!(self, Self::FirstStage | Self::MadeSince) {
            let at = write(device, volume_id)?;
            actions.push(format!("claimed at byte {at}"));
        }
        Ok(())
    }
}

/// The size of the filesystem a first stage makes on `fs_device` (the disk
/// `raw`, or its LUKS mapping): up to where the claim begins.
pub fn first_stage_size(raw: &Path, fs_device: &Path) -> Result<u64, HostdError> {
    let raw_size = direct::size(&mut open(raw, false)?, raw)?;
    let fs_device_size = direct::size(&mut open(fs_device, false)?, fs_device)?;
    Ok(fs_end(
        claim_place(raw_size, raw)?,
        raw_size,
        fs_device_size,
    ))
}

/// Where the claim goes on a disk of `size` bytes: 1 MiB before its end,
/// the end rounded down to the controller's step, so that it is found
/// again after the next growth (a disk grown off the step out of band
/// loses the rest of its last step to that).
fn claim_at(size: u64) -> Option<u64> {
    if size >= STEP {
        Some(size / STEP * STEP - RESERVED)
    } else {
        (size >= 2 * RESERVED).then(|| size - RESERVED)
    }
}

/// [`claim_at`], or why `device` has no room for a claim.
fn claim_place(size: u64, device: &Path) -> Result<u64, HostdError> {
    claim_at(size).ok_or_else(|| {
        HostdError::failed(
            "claiming",
            device.display(),
            format!("{size} bytes leave no room for a claim"),
        )
    })
}

/// The size of a claimed volume's filesystem on its device of
/// `device_size` bytes (the disk of `raw_size` bytes, or a LUKS mapping
/// whose data starts `raw_size - device_size` into it): up to the claim at
/// `at`. Sizes read after a growth only move the end down, never onto the claim.
pub fn fs_end(at: u64, raw_size: u64, device_size: u64) -> u64 {
    let offset = raw_size.saturating_sub(device_size);
    at.saturating_sub(offset) & !(ALIGN as u64 - 1)
}

fn record(volume_id: &str) -> [u8; KEY] {
    let mut r = [0u8; KEY];
    r[..16].copy_from_slice(MAGIC);
    r[16..].copy_from_slice(&Sha256::digest(volume_id.as_bytes()));
    r
}

/// Where a claim would be on a disk of `size` bytes: the end it has now
/// first, then every end it may have had before an expansion, largest first.
fn places(size: u64) -> Vec<u64> {
    let mut at: Vec<u64> = claim_at(size).into_iter().collect();
    let mut end = size / STEP * STEP;
    while end >= STEP {
        if !at.contains(&(end - RESERVED)) {
            at.push(end - RESERVED);
        }
        end -= STEP;
    }
    at
}

/// The byte offset of `volume_id`'s claim on `device`, if it has one.
pub fn find(device: &Path, volume_id: &str) -> Result<Option<u64>, HostdError> {
    find_from(device, Some(volume_id), 0)
}

/// The byte offset of the first claim at or beyond byte `from` of
/// `device`: `volume_id`'s, or with `None` any volume's. Where a mounted
/// filesystem ends is `from`: a record inside the filesystem is a file's
/// bytes, which a pod may write, never a claim.
pub fn find_from(
    device: &Path,
    volume_id: Option<&str>,
    from: u64,
) -> Result<Option<u64>, HostdError> {
    let want = volume_id.map(record);
    let mut f = open(device, false)?;
    let size = direct::size(&mut f, device)?;
    let mut block = Aligned::zeroed(ALIGN);
    for at in places(size).into_iter().filter(|at| *at >= from) {
        f.read_exact_at(block.buf_mut(), at)
            .map_err(|e| HostdError::io("reading a claim on", device.display(), e))?;
        let found = match &want {
            Some(w) => block.buf()[..KEY] == *w,
            None => block.buf()[..MAGIC.len()] == *MAGIC,
        };
        if found {
            return Ok(Some(at));
        }
    }
    Ok(None)
}

/// Writes `volume_id`'s claim at `device`'s current end, durably; the offset.
pub fn write(device: &Path, volume_id: &str) -> Result<u64, HostdError> {
    write_beyond(device, volume_id, 0)
}

/// [`write`], refused before anything is written when the claim's place
/// lies before byte `floor` (where a mounted filesystem ends).
pub fn write_beyond(device: &Path, volume_id: &str, floor: u64) -> Result<u64, HostdError> {
    let mut f = open(device, true)?;
    let size = direct::size(&mut f, device)?;
    let at = claim_place(size, device)?;
    if at < floor {
        return Err(HostdError::failed(
            "claiming",
            device.display(),
            format!(
                "the claim's place at byte {at} lies inside the filesystem, which ends at {floor}"
            ),
        ));
    }
    // The whole reserved MiB: nothing a grown disk's new extents held
    // (an end label of a removed volume) stays where libblkid looks.
    let mut tail = Aligned::zeroed(RESERVED as usize);
    tail.buf_mut()[..KEY].copy_from_slice(&record(volume_id));
    f.write_all_at(tail.buf(), at)
        .and_then(|()| f.sync_all())
        .map_err(|e| HostdError::io("writing the claim on", device.display(), e))?;
    Ok(at)
}

/// Zeroes what a first stage formats over: the first 8 MiB (partition
/// tables, superblocks, LUKS headers and their secondary copies) and the
/// last MiB (backup GPT, MD and ZFS labels at the end; up to 4095 bytes
/// more where the size is not a multiple of 4 KiB). The rest of a previous
/// volume's bytes stay where the new filesystem does not look.
pub fn wipe(device: &Path) -> Result<(), HostdError> {
    const HEAD: u64 = 8 << 20;
    let mut f = open(device, true)?;
    let size = direct::size(&mut f, device)?;
    let tail = size.saturating_sub(RESERVED) / ALIGN as u64 * ALIGN as u64;
    let ranges: Vec<(u64, u64)> = [(0, HEAD.min(tail)), (tail, size - tail)]
        .into_iter()
        .filter(|&(_, len)| len > 0)
        .collect();
    direct::zero(&f, &ranges)
        .and_then(|()| f.sync_all())
        .map_err(|e| HostdError::io("wiping stale bytes on", device.display(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn claims_sit_at_the_end_and_at_every_end_an_expansion_left() {
        assert_eq!(places(1024 * MIB), [1023 * MIB, 511 * MIB]);
        assert_eq!(places(1536 * MIB), [1535 * MIB, 1023 * MIB, 511 * MIB]);
        // A size off the step (a static PV, an out-of-band resize) claims
        // at its last step's end, where the next growth still looks.
        assert_eq!(places(700 * MIB), [511 * MIB]);
        assert_eq!(places(1124 * MIB), [1023 * MIB, 511 * MIB]);
        assert_eq!(places(300 * MIB), [299 * MIB]);
        assert_eq!(places(MIB), Vec::<u64>::new());
        // The filesystem ends where the claim begins, on the disk or in a
        // LUKS mapping whose data starts 16 MiB in.
        assert_eq!(fs_end(1023 * MIB, 1024 * MIB, 1024 * MIB), 1023 * MIB);
        assert_eq!(fs_end(1023 * MIB, 1024 * MIB, 1008 * MIB), 1007 * MIB);
        // The disk grew again before its size was read: the end stays put.
        assert_eq!(
            fs_end(1023 * MIB, 1536 * MIB, 1536 * MIB - 16 * MIB),
            1007 * MIB
        );
    }

    #[test]
    fn a_claim_is_found_for_its_volume_only_and_survives_growth() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(512 * MIB).unwrap();
        assert_eq!(find(&img, "r/z/s/vm-9999-a.csf-x").unwrap(), None);
        assert_eq!(write(&img, "r/z/s/vm-9999-a.csf-x").unwrap(), 511 * MIB);
        assert_eq!(
            find(&img, "r/z/s/vm-9999-a.csf-x").unwrap(),
            Some(511 * MIB)
        );
        assert_eq!(find(&img, "r/z/s/vm-9999-b.csf-x").unwrap(), None);
        // Grown by the controller, not yet by hostd: the old end still counts.
        f.set_len(1536 * MIB).unwrap();
        assert_eq!(
            find(&img, "r/z/s/vm-9999-a.csf-x").unwrap(),
            Some(511 * MIB)
        );
        assert_eq!(write(&img, "r/z/s/vm-9999-a.csf-x").unwrap(), 1535 * MIB);
        assert_eq!(
            find(&img, "r/z/s/vm-9999-a.csf-x").unwrap(),
            Some(1535 * MIB)
        );
    }

    #[test]
    fn a_wipe_clears_the_head_and_the_tail_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk");
        std::fs::write(&img, vec![0xa5u8; (32 * MIB) as usize]).unwrap();
        wipe(&img).unwrap();
        let bytes = std::fs::read(&img).unwrap();
        let mib = MIB as usize;
        assert!(bytes[..8 * mib].iter().all(|b| *b == 0));
        assert!(bytes[8 * mib..31 * mib].iter().all(|b| *b == 0xa5));
        assert!(bytes[31 * mib..].iter().all(|b| *b == 0));
    }

    #[test]
    fn a_wipe_on_a_block_device_zeroes_the_disk_and_what_its_cache_held() {
        testkit::require_root!();
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk");
        std::fs::write(&img, vec![0xa5u8; (32 * MIB) as usize]).unwrap();
        let dev = testkit::loopdev::Loop::attach(&img).unwrap();
        // Read through the device's page cache first: what the cache held
        // must not outlive the wipe.
        assert!(std::fs::read(&dev.dev).unwrap().iter().all(|b| *b == 0xa5));
        wipe(&dev.dev).unwrap();
        let mib = MIB as usize;
        let check = |bytes: Vec<u8>, what: &str| {
            assert!(bytes[..8 * mib].iter().all(|b| *b == 0), "{what}: head");
            assert!(
                bytes[8 * mib..31 * mib].iter().all(|b| *b == 0xa5),
                "{what}: middle"
            );
            assert!(bytes[31 * mib..].iter().all(|b| *b == 0), "{what}: tail");
        };
        check(std::fs::read(&dev.dev).unwrap(), "the device, cached");
        drop(dev);
        check(std::fs::read(&img).unwrap(), "the backing file");
    }

    #[test]
    fn a_wipe_of_a_mounted_device_is_refused_and_its_superblock_stays() {
        testkit::require_root!();
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(32 * MIB)
            .unwrap();
        let dev = testkit::loopdev::Loop::attach(&img).unwrap();
        let ok = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&dev.dev)
            .status()
            .unwrap();
        assert!(ok.success());
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        nix::mount::mount(
            Some(&dev.dev),
            &mnt,
            Some("ext4"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        // The kernel refuses to zero a device a filesystem holds (EBUSY):
        // that refusal stands, and no zeros are written in its place.
        let refused = wipe(&dev.dev);
        nix::mount::umount(&mnt).unwrap();
        assert!(refused.is_err(), "a mounted device was wiped");
        // ext4's magic (0xEF53 at byte 1080) is still where it was.
        let after = std::fs::read(&img).unwrap();
        assert_eq!(after[1080..1082], [0x53, 0xef], "the superblock was wiped");
    }
}
