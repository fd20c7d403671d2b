//! Expand: the disk rescanned, the mapping and the filesystem grown, a
//! claimed volume's claim moved to the disk's new end first.

use super::*;

impl Volumes {
    /// Grows the volume to its disk's size: rescans the disk if it is still
    /// smaller than asked, resizes the LUKS mapping, then the filesystem.
    pub fn expand(&self, req: &mut pb::ExpandRequest) -> Result<pb::ExpandResponse, HostdError> {
        let (place, staged) = self.volume_at(&req.volume_id, &req.volume_path)?;
        let disk = staged
            .mapping
            .as_ref()
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| staged.name.clone());
        if blockdev::size_of(&disk).unwrap_or(0) < req.required_bytes {
            blockdev::rescan(&disk);
        }
        let disk_size = blockdev::size_of(&disk).unwrap_or(0);
        if disk_size < req.required_bytes {
            return Err(HostdError::DeviceNotFound {
                wwn: disk.clone(),
                reason: format!(
                    "disk is {disk_size} bytes after a rescan, {} were asked for; the controller's resize may still be on its way",
                    req.required_bytes
                ),
            });
        }
        if let Some((mapping, disk)) = &staged.mapping {
            // The resize may unlock a key slot: its cost is bounded first.
            luks::check_header_costs(&Path::new("/dev").join(disk), self.kdf_bounds)?;
            // Moved, not copied, into a Secret: wiped when the call ends.
            let pass = req
                .encryption
                .as_mut()
                .filter(|e| !e.passphrase.is_empty())
                .map(|e| Secret::new(std::mem::take(&mut e.passphrase)));
            kdf::resize(mapping, pass.as_ref())?;
        }
        if !place.layout.is_block() {
            let claim_at = self.move_claim(&req.volume_id, &place, &staged, &disk)?;
            // The end is the claim's, whatever the disk grew to since.
            let size = claim_at.and_then(|at| {
                Some(claim::fs_end(
                    at,
                    blockdev::size_of(&disk)?,
                    blockdev::size_of(&staged.name)?,
                ))
            });
            grow_filesystem(&staged, size)?;
        }
        Ok(pb::ExpandResponse {
            size_bytes: blockdev::size_of(&staged.name).unwrap_or(disk_size),
        })
    }

    /// Before a mounted filesystem grows on the disk called `disk` (its
    /// mapping already grown): a claimed volume's claim goes to the disk's new end,
    /// and the filesystem then grows up to it, over the old one; the new
    /// claim's offset. Only claims beyond where the filesystem ends count
    /// (inside it, a record is a file's bytes). A volume without its claim
    /// there (formatted whole by the Go node plugin, or never claimed)
    /// grows over the whole disk, unless another volume's claim lies beyond
    /// the filesystem on a disk whose serial does not name this volume (a
    /// disk taken over from the Go driver): then nothing grows.
    fn move_claim(
        &self,
        volume_id: &str,
        place: &Place,
        staged: &Staged,
        disk: &str,
    ) -> Result<Option<u64>, HostdError> {
        let raw = &Path::new("/dev").join(disk);
        let fs_device = Path::new("/dev").join(&staged.name);
        let root = std::fs::File::open(place.open()?.proc_path())
            .map_err(|e| HostdError::io("opening", place.path.display(), e))?;
        let Some(fs_bytes) = grow::mounted_bytes(&staged.entry.fs_type, &fs_device, &root)? else {
            return Err(HostdError::Unsupported(format!(
                "growing a {} filesystem is not supported",
                staged.entry.fs_type
            )));
        };
        // A LUKS mapping's data starts this far into the disk: from its
        // header, never from sizes the disk's rescan may change between reads.
        let offset = if staged.mapping.is_some() {
            luks::data_offset(raw)?
        } else {
            0
        };
        let fs_end = fs_bytes.saturating_add(offset);
        let marked = contract::disk_mark(volume_id).is_some_and(|(k, _)| k == BlankFor::Filesystem);
        if marked && claim::find_from(raw, Some(volume_id), fs_end)?.is_some() {
            return Ok(Some(claim::write_beyond(raw, volume_id, fs_end)?));
        }
        if !self.resolver.proves_volume_id(raw, volume_id)
            && let Some(at) = claim::find_from(raw, None, fs_end)?
        {
            return Err(HostdError::DeviceRefused {
                device: raw.to_path_buf(),
                reason: format!(
                    "a volume's claim lies at byte {at}, beyond this filesystem's end ({fs_end}), and the disk's serial \
                     does not name volume {volume_id}: it is not grown over it"
                ),
            });
        }
        Ok(None)
    }
}

/// Grows the mounted filesystem to `size` bytes, or to its whole device.
fn grow_filesystem(staged: &Staged, size: Option<u64>) -> Result<(), HostdError> {
    let m = &staged.entry;
    // resize2fs gets the kernel's own node of the mounted device, checked
    // to be it, never the mount table's source text.
    let node = Path::new("/dev").join(&staged.name);
    if staged.name.is_empty() || device::majmin(&node)? != staged.majmin {
        return Err(HostdError::failed(
            "growing the filesystem at",
            m.mount_point.display(),
            format!("/dev has no node of its device {}", staged.majmin),
        ));
    }
    grow::mounted(&m.fs_type, &node, &m.mount_point, size)
}
