//! A filesystem volume's stage: what is formatted, and only on a disk
//! proven blank or fresh (see `claim`), then mounted.

use super::encrypted::mapping_on;
use super::gocompat::close_idle_go_mapping;
use super::*;

impl Volumes {
    /// Returns the actions taken and `major:minor` of what is mounted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_filesystem(
        &self,
        volume_id: &str,
        device: &Path,
        disk: &DiskId,
        staging: &Place,
        fs: &pb::Filesystem,
        read_only: bool,
        crypt: Option<(String, &Secret<Vec<u8>>)>,
        timings: &mut HashMap<String, u64>,
    ) -> Result<(Vec<String>, String), HostdError> {
        let fs_type = FsType::parse(&fs.fs_type)?;
        let opts = MkfsOptions {
            block_size: fs.block_size,
            inode_size: fs.inode_size,
            replace_unfinished: false,
            size_bytes: 0,
        };
        mkfs::validate(opts)?;
        let mut flags = fs.mount_flags.clone();
        if fs_type == FsType::Xfs && !flags.iter().any(|f| f == "nouuid") {
            // Clones and snapshots share the XFS UUID; the Go driver mounts with nouuid too.
            flags.push("nouuid".into());
        }
        let mount_opts = mountopts::check("filesystem.mount_flags", Some(fs_type.name()), &flags)?;
        // A volume without a mark (a copy, a restore, a Go driver's disk)
        // has no claim its filesystem must stop short of: its disk may have
        // grown past its filesystem, at its copy or at publish, where the
        // kernel may not have seen it yet. Only a disk whose serial names
        // the volume: a serial-less disk taken over from the Go driver may
        // be a claimed volume's under another name.
        let grows = !read_only
            && contract::disk_mark(volume_id).is_none()
            && self.resolver.proves_volume_id(device, volume_id);
        if grows && let Some(name) = blockdev::kernel_name(device) {
            blockdev::rescan(&name);
        }
        let checks = Instant::now();
        let table = mounts::table()?;
        // What gets the filesystem: the disk, or its LUKS mapping.
        let mapping = crypt.as_ref().map(|(name, _)| luks::mapper_path(name));
        let fs_device = mapping.as_deref().unwrap_or(device);
        if let Some(m) = table.iter().rev().find(|m| m.mount_point == staging.path) {
            let mm = device::majmin(fs_device).ok();
            if mm.as_deref() == Some(m.majmin.as_str()) && m.fs_type == fs_type.name() {
                // This volume's mapping, on this very disk.
                if let Some((name, _)) = &crypt
                    && let Err(elsewhere) = mapping_on(&HOST, name, device)
                {
                    return Err(HostdError::StagedDifferently {
                        path: staging.path.clone(),
                        what: "a mount point",
                        detail: format!("{elsewhere}, mounted there"),
                    });
                }
                let mut actions = vec!["already staged".to_string()];
                if grows {
                    grow_to_disk(device, fs_device, fs_type, staging, crypt, &mut actions)?;
                }
                return Ok((actions, m.majmin.clone()));
            }
            // Staged by the Go driver, on its mapping of this very disk.
            let go = blockdev::kernel_name(device)
                .and_then(|disk| luks::go_mapping_on(&disk))
                .and_then(|(_, dm)| blockdev::majmin_of(&dm));
            if crypt.is_some()
                && go.as_deref() == Some(m.majmin.as_str())
                && m.fs_type == fs_type.name()
            {
                return Ok((
                    vec!["already staged (by the Go driver, on its mapping)".into()],
                    m.majmin.clone(),
                ));
            }
            return Err(HostdError::StagedDifferently {
                path: staging.path.clone(),
                what: "a mount point",
                detail: format!(
                    "{} ({}) is mounted there, the request is {} ({})",
                    m.source,
                    m.fs_type,
                    fs_device.display(),
                    fs_type.name()
                ),
            });
        }
        let mut actions = Vec::new();
        if let Some(closed) = close_idle_go_mapping(&HOST, device, &table)? {
            actions.push(closed);
        }
        device::verify_unused(device, &table, crypt.as_ref().map(|(n, _)| n.as_str()))?;
        // The id's mark counts only where the disk's serial proves the id.
        let mut claim = if self.resolver.proves_volume_id(device, volume_id) {
            Claim::of(volume_id, device)?
        } else {
            Claim::Unmarked
        };
        timings.insert("checks".into(), ms(checks));
        // Proxmox's lvcreate wipes the signatures a removed volume left;
        // one found now was made since: by this node's own first stage that
        // did not finish (its note says so; nothing was mounted, so it is
        // made again), or by another node's, or by the Go node plugin during
        // a switch of drivers: then the general rules decide.
        if claim == Claim::FirstStage && !self.bindings.format_begun(volume_id, disk) {
            let t = Instant::now();
            if formatted_since_allocation(&HOST, device)? {
                tracing::info!(%volume_id, device = %device.display(), "a volume created blank holds a signature made since: staged by the general rules");
                claim = Claim::MadeSince;
            }
            timings.insert("probe".into(), ms(t));
        }
        if claim == Claim::FirstStage {
            let t = Instant::now();
            self.first_stage(
                volume_id,
                device,
                disk,
                read_only,
                crypt.as_ref(),
                &mut actions,
            )?;
            timings.insert("wipe".into(), ms(t));
        }
        let mut made_luks = false;
        if let Some((name, pass)) = &crypt {
            made_luks = self.open_luks(
                volume_id,
                device,
                disk,
                (name, pass),
                claim,
                read_only,
                &table,
                &mut actions,
                timings,
            )?;
        }
        let started = Instant::now();
        let case = FsCase {
            device,
            fs_device,
            fs_type,
            claim,
            read_only,
            encrypted: crypt.is_some(),
            made_luks,
            // Data hostd's own interrupted format left is not someone's.
            begun: self.bindings.format_begun(volume_id, disk),
        };
        let plan = fs_plan(&HOST, &case)?;
        timings.insert("plan".into(), ms(started));
        match plan {
            FsPlan::Format => {
                self.bindings.begin_format(volume_id, disk)?;
                self.still_the_disk(volume_id, device, disk, claim)?;
                mkfs::run(fs_type, fs_device, claim.sized(opts, device, fs_device)?)?;
                timings.insert("mkfs".into(), ms(started));
                actions.push(if case.begun && claim != Claim::FirstStage {
                    format!("mkfs {} (an earlier mkfs was interrupted)", fs_type.name())
                } else {
                    format!("mkfs {}", fs_type.name())
                });
                // Claimed before the first mount: no data is ever in the
                // volume without its claim.
                let t = Instant::now();
                self.still_the_disk(volume_id, device, disk, claim)?;
                claim.write(volume_id, device, &mut actions)?;
                timings.insert("claim".into(), ms(t));
                self.bindings.end_format(volume_id)?;
            }
            FsPlan::Remake => {
                let opts = MkfsOptions {
                    replace_unfinished: true,
                    ..opts
                };
                self.still_the_disk(volume_id, device, disk, claim)?;
                mkfs::run(fs_type, fs_device, claim.sized(opts, device, fs_device)?)?;
                timings.insert("mkfs".into(), ms(started));
                actions.push(format!(
                    "mkfs {} (an earlier mkfs was interrupted)",
                    fs_type.name()
                ));
                self.still_the_disk(volume_id, device, disk, claim)?;
                claim.write(volume_id, device, &mut actions)?;
                self.bindings.end_format(volume_id)?;
            }
            FsPlan::Keep => {
                // Made by a first stage whose claim a crash kept from being
                // written: exactly its size, so the tail is free. A
                // filesystem over the whole disk stays unclaimed.
                if claim == Claim::MadeSince
                    && probe::fs_bytes(fs_device)?
                        == Some(claim::first_stage_size(device, fs_device)?)
                {
                    self.still_the_disk(volume_id, device, disk, claim)?;
                    claim.write(volume_id, device, &mut actions)?;
                }
                self.bindings.end_format(volume_id)?;
            }
        }
        staging.ensure_dir()?;
        let t = Instant::now();
        let target = staging.open()?;
        // What the pod gets: the disk as verified, or a mapping opened on it.
        self.still_the_disk(volume_id, device, disk, claim)?;
        mounts::mount_fs(
            fs_device,
            &target.proc_path(),
            fs_type.name(),
            &mount_opts,
            read_only,
        )?;
        timings.insert("mount".into(), ms(t));
        actions.push(format!(
            "mounted {} at {}",
            fs_device.display(),
            staging.path.display()
        ));
        if grows {
            let t = Instant::now();
            if let Err(e) = grow_to_disk(device, fs_device, fs_type, staging, crypt, &mut actions) {
                // Unmounted, so that the retry grows it before it is used.
                unmount_all(staging)?;
                return Err(e);
            }
            timings.insert("grow".into(), ms(t));
        }
        Ok((actions, device::majmin(fs_device)?))
    }

    /// The first stage of a volume created blank for a filesystem: what
    /// its storage left in it is a removed volume's (see `claim`), and the
    /// head and tail where signatures live are zeroed so that the general
    /// rules below format it. Its own mapping, left by a first stage that
    /// did not finish, is closed first.
    fn first_stage(
        &self,
        volume_id: &str,
        device: &Path,
        disk: &DiskId,
        read_only: bool,
        crypt: Option<&(String, &Secret<Vec<u8>>)>,
        actions: &mut Vec<String>,
    ) -> Result<(), HostdError> {
        if read_only {
            return Err(HostdError::DeviceRefused {
                device: device.to_path_buf(),
                reason: "the volume was created blank and has never been staged: what it holds is what its storage left, nothing of its own to mount read-only".into(),
            });
        }
        if let Some((name, _)) = crypt
            && blockdev::active(name).is_some()
        {
            luks::close(name, false)?;
            actions.push(format!(
                "closed {name}, left by a first stage that did not finish"
            ));
        }
        self.still_the_disk(volume_id, device, disk, Claim::FirstStage)?;
        claim::wipe(device)?;
        self.bindings.begin_format(volume_id, disk)?;
        actions.push(
            "wiped the head and tail its storage left (first stage of a volume created blank)"
                .into(),
        );
        Ok(())
    }

    /// The disk under `device`'s name is still the one verified (`disk`)
    /// and, for a marked volume (its serial proved `volume_id`), proves it
    /// still: checked right before each write over bytes hostd did not
    /// make (the wipe, luksFormat, mkfs, the claim), and before the LUKS
    /// open and the mount that hand it to a pod. Each opens the device by
    /// its name, which a detached disk hands to the next one attached.
    pub(super) fn still_the_disk(
        &self,
        volume_id: &str,
        device: &Path,
        disk: &DiskId,
        claim: Claim,
    ) -> Result<(), HostdError> {
        let proven = claim == Claim::Unmarked || self.resolver.proves_volume_id(device, volume_id);
        if proven && DiskId::of(device).ok().as_ref() == Some(disk) {
            return Ok(());
        }
        Err(HostdError::DeviceRefused {
            device: device.to_path_buf(),
            reason: "the disk changed since it was verified (detached, or another attached under its name); the stage is retried".into(),
        })
    }
}

/// What a filesystem stage knows when it decides what to do with what
/// `fs_device` holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct FsCase<'a> {
    /// The disk.
    pub(super) device: &'a Path,
    /// What gets the filesystem: the disk, or its LUKS mapping.
    pub(super) fs_device: &'a Path,
    pub(super) fs_type: FsType,
    pub(super) claim: Claim,
    pub(super) read_only: bool,
    pub(super) encrypted: bool,
    /// This stage wrote the LUKS header.
    pub(super) made_luks: bool,
    /// hostd's note says a stage of this volume began formatting this very disk.
    pub(super) begun: bool,
}

/// What a filesystem stage does with what `fs_device` holds (see [`fs_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FsPlan {
    /// Blank, and proven so (or hostd's own): mkfs.
    Format,
    /// hostd's own interrupted mkfs: made again.
    Remake,
    /// The filesystem asked for is there: mounted as it is.
    Keep,
}

/// Formats only what is proven blank or hostd's own; refuses everything
/// else that is not the filesystem asked for, and a claimed volume whose
/// filesystem is gone.
pub(super) fn fs_plan(host: &impl Probe, c: &FsCase<'_>) -> Result<FsPlan, HostdError> {
    // A first stage's checks found no signature made since the allocation,
    // and it zeroed the head and tail itself (`first_stage`), then wrote
    // the LUKS header if any: a probe now would read those zeroes, or the
    // fresh mapping's noise, over what the removed volume left, which the
    // first-format rule formats over whatever it holds.
    if c.claim == Claim::FirstStage && !c.read_only && (!c.encrypted || c.made_luks) {
        return Ok(FsPlan::Format);
    }
    let found = host.probe(c.fs_device)?;
    let fs_type = c.fs_type.name();
    match found {
        _ if c.claim.held_filesystem().is_some()
            && !matches!(&found, Contents::Filesystem(t) if t == fs_type) =>
        {
            Err(HostdError::HoldsData {
                device: c.fs_device.to_path_buf(),
                found: format!(
                    "{found}, and the volume's claim at byte {} says it has held its filesystem: \
                     its header is damaged or was overwritten, and it is never formatted again",
                    c.claim.held_filesystem().unwrap_or_default()
                ),
            })
        }
        Contents::Blank => {
            if c.read_only {
                return Err(read_only_blank(c.fs_device));
            }
            if !c.encrypted && !c.begun {
                refuse_data(host, c.device)?;
            }
            // A mapping's plaintext reads as noise whatever it holds: a
            // LUKS volume without a filesystem signature is formatted
            // only when this stage, or one whose note proves hostd began
            // it, wrote its header.
            if c.encrypted && !c.made_luks && !c.begun {
                return Err(HostdError::HoldsData {
                    device: c.fs_device.to_path_buf(),
                    found: "an existing LUKS volume whose contents carry no filesystem signature (raw data, or a damaged superblock)".into(),
                });
            }
            Ok(FsPlan::Format)
        }
        Contents::Unfinished(t) if t == fs_type => {
            // One byte says mkfs never finished: made again only when
            // hostd's own note, or this stage's LUKS header, proves the
            // interrupted mkfs was hostd's.
            if c.read_only {
                return Err(read_only_blank(c.fs_device));
            }
            if !c.made_luks && !c.begun {
                return Err(HostdError::HoldsData {
                    device: c.fs_device.to_path_buf(),
                    found: format!("an unfinished {t} that hostd did not begin"),
                });
            }
            Ok(FsPlan::Remake)
        }
        Contents::Filesystem(t) if t == fs_type => Ok(FsPlan::Keep),
        found => Err(HostdError::HoldsData {
            device: c.fs_device.to_path_buf(),
            found: found.to_string(),
        }),
    }
}

/// Whether a disk created blank holds what was made on it since its
/// allocation: a signature other than an unfinished xfs or a LUKS header
/// without a key slot, which a first stage that did not finish leaves.
pub(super) fn formatted_since_allocation(
    host: &impl Host,
    device: &Path,
) -> Result<bool, HostdError> {
    Ok(match host.probe(device)? {
        Contents::Blank | Contents::Unfinished(_) => false,
        Contents::Filesystem(t) if t == "crypto_LUKS" => host.has_keyslot(device)?,
        _ => true,
    })
}

/// Grows the filesystem of a volume without a claim, just mounted at
/// `staging` from `fs_device` (the disk `device` or its LUKS mapping), to
/// its disk when the disk is larger: a LUKS mapping opened before the disk
/// grew first.
fn grow_to_disk(
    device: &Path,
    fs_device: &Path,
    fs_type: FsType,
    staging: &Place,
    crypt: Option<(String, &Secret<Vec<u8>>)>,
    actions: &mut Vec<String>,
) -> Result<(), HostdError> {
    if let Some((name, pass)) = crypt {
        let size = |p: &Path| {
            blockdev::kernel_name(p)
                .and_then(|n| blockdev::size_of(&n))
                .unwrap_or(0)
        };
        if size(fs_device) + grow::LUKS_OFFSET + grow::SLACK < size(device) {
            kdf::resize(&name, Some(pass))?;
            actions.push(format!("grew mapping {name} to its disk"));
        }
    }
    // The mount's root, opened for the filesystem's ioctls.
    let root = std::fs::File::open(staging.open()?.proc_path())
        .map_err(|e| HostdError::io("opening", staging.path.display(), e))?;
    let Some((from, to)) = grow::short_of_device(fs_type.name(), fs_device, &root)? else {
        return Ok(());
    };
    grow::mounted(fs_type.name(), fs_device, &staging.path, None)?;
    tracing::info!(device = %fs_device.display(), from, to, "grew the filesystem to its disk");
    actions.push(format!(
        "grew the {} filesystem of {from} bytes to its disk of {to}",
        fs_type.name()
    ));
    Ok(())
}
