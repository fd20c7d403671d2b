//! Stage, unstage, publish and unpublish: the operations on one volume.
//!
//! Every operation is idempotent: it first looks at what is already there
//! and answers OK when that is what was asked, or an error naming the
//! difference. Every operation acts only on what its volume staged or
//! published (see `bindings`), on kubelet's exact paths (see `paths`).
//!
//! Everything here blocks (mount(2), libcryptsetup, mkfs): the service runs
//! it on tokio's blocking threads, never on the runtime's workers, so that
//! Health and other volumes' calls answer while a LUKS key is derived.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxmox_csi_common::Secret;
use proxmox_csi_common::contract::{self, BlankFor};
use proxmox_csi_proto::hostd::v1 as pb;

use crate::bindings::{self, Binding, Bindings, DiskId, Tie};
use crate::blockdev;
use crate::claim::{self, Claim};
use crate::device::{self, Resolver, Wwn};
use crate::discovery::{self, DeviceIndex};
use crate::error::HostdError;
use crate::grow;
use crate::kdf;
use crate::luks;
use crate::mkfs::{self, FsType, MkfsOptions};
use crate::mountopts;
use crate::mounts;
use crate::paths::{Kind, KubeletPaths, Layout, Place};
use crate::probe::{self, Contents};

/// File inside a raw block volume's staging directory onto which the device
/// node is bound, so publish can bind it again without naming a device. It
/// lives in kubelet's block staging directory, never in a filesystem.
const BLOCK_FILE: &str = "device";

/// How long a request waits for its device before a SCSI rescan is asked for.
const RESCAN_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug)]
pub struct Volumes {
    pub paths: KubeletPaths,
    pub bindings: Bindings,
    pub resolver: Resolver,
    pub index: Arc<DeviceIndex>,
    /// How long Stage waits for the device to appear.
    pub device_wait: Duration,
    /// Key derivation for new LUKS key slots.
    pub pbkdf: luks::Pbkdf,
    /// The most a LUKS header's key slot may cost to open.
    pub kdf_bounds: luks::KdfBounds,
    /// Disks the Go driver attached (no serial) are taken over (see
    /// docs/security.md, "What stays").
    pub go_takeover: bool,
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

pub fn check_volume_id(id: &str) -> Result<(), HostdError> {
    if id.is_empty() {
        return Err(HostdError::invalid("volume_id", "is empty"));
    }
    if id.len() > 512 || id.chars().any(|c| c.is_control()) {
        return Err(HostdError::invalid(
            "volume_id",
            "must be at most 512 characters without control characters",
        ));
    }
    Ok(())
}

/// A Stage request checked, with its device found: what the blocking part
/// of Stage works from.
#[derive(Debug)]
pub struct StageWork {
    volume_id: String,
    staging: Place,
    device: PathBuf,
    /// The disk as it was verified, checked again right before use: the
    /// wait for a call slot may outlast the disk (detached, and its name
    /// given to the next disk attached).
    disk: DiskId,
    wwn: Wwn,
    serial: String,
    access: pb::stage_request::Access,
    read_only: bool,
    passphrase: Option<Secret<Vec<u8>>>,
    timings: HashMap<String, u64>,
}

impl Volumes {
    /// Volumes mounted or bound under kubelet's staging directories.
    pub fn staged_count(&self) -> usize {
        let base = self.paths.root().join("plugins/kubernetes.io/csi");
        mounts::table()
            .map(|t| {
                t.iter()
                    .filter(|m| m.mount_point.starts_with(&base))
                    .count()
            })
            .unwrap_or(0)
    }

    /// SCSI disks that are neither staged here nor held by a mapping that is:
    /// the boot disk and any disks that are not CSI volumes.
    pub fn other_scsi_disks(&self) -> usize {
        let base = self.paths.root().join("plugins/kubernetes.io/csi");
        let staged: Vec<String> = mounts::table()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.mount_point.starts_with(&base))
            .filter_map(|m| blockdev::name_of(&m.majmin))
            .flat_map(|n| {
                let mut under = blockdev::slaves(&n);
                under.push(n);
                under
            })
            .collect();
        let Ok(disks) = std::fs::read_dir("/sys/block") else {
            return 0;
        };
        disks
            .flatten()
            .filter(|d| d.path().join("device/scsi_device").exists())
            .filter(|d| !staged.contains(&d.file_name().to_string_lossy().into_owned()))
            .count()
    }

    /// Brings the health facts that derive from the index and the mount table up to date.
    pub fn refresh_health(&self, health: &crate::health::Health) {
        health.set_devices_indexed(u32::try_from(self.index.len()).unwrap_or(u32::MAX));
        health.set_volumes_staged(u32::try_from(self.staged_count()).unwrap_or(u32::MAX));
    }

    /// Stage's checks and its wait for the device; nothing is touched yet.
    pub async fn prepare_stage(&self, req: &mut pb::StageRequest) -> Result<StageWork, HostdError> {
        check_volume_id(&req.volume_id)?;
        let access = req
            .access
            .clone()
            .ok_or_else(|| HostdError::invalid("access", "filesystem or block is required"))?;
        let layout = match access {
            pb::stage_request::Access::Filesystem(_) => Layout::FsStaging,
            pb::stage_request::Access::Block(_) => Layout::BlockStaging,
        };
        let staging = self
            .paths
            .place("staging_path", &req.staging_path, &[layout])?;
        self.require_tie("staging_path", &staging, &req.volume_id)?;
        let dev = req
            .device
            .as_ref()
            .ok_or_else(|| HostdError::invalid("device", "is required"))?;
        let wwn = Wwn::parse(&dev.wwn)?;
        check_request_serial(&dev.serial, &req.volume_id)?;
        // Moved, not copied, into a Secret: wiped when the stage is done.
        let passphrase = match req.encryption.as_mut() {
            Some(e) if e.passphrase.is_empty() => {
                return Err(HostdError::invalid("encryption.passphrase", "is empty"));
            }
            Some(e) => Some(Secret::new(std::mem::take(&mut e.passphrase))),
            None => None,
        };
        if let Some(other) = self
            .bindings
            .staged_at(&staging.path)?
            .filter(|b| b.volume_id != req.volume_id)
        {
            return Err(HostdError::NotThisVolume {
                field: "staging_path",
                path: staging.path.clone(),
                volume_id: req.volume_id.clone(),
                reason: format!("volume {} is staged there", other.volume_id),
            });
        }
        let key = self.resolver.key(&wwn);
        let index = &self.index;
        let waiting = Instant::now();
        let rescanned = index.clone();
        let device = index
            .wait_for(&key, self.device_wait, RESCAN_GRACE, move || {
                // Writing each host's `scan` waits for its bus: never on an
                // async worker, and one at a time however many Stages wait.
                static RESCANNING: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !RESCANNING.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    drop(tokio::task::spawn_blocking(move || {
                        discovery::rescan_scsi(&rescanned);
                        RESCANNING.store(false, std::sync::atomic::Ordering::Release);
                    }));
                }
            })
            .await
            .ok_or_else(|| HostdError::DeviceNotFound {
                wwn: wwn.to_string(),
                reason: format!("no block device with {key} within {:?}", self.device_wait),
            })?;
        self.resolver
            .verify_identity(&device, &wwn, &dev.serial, &req.volume_id)?;
        self.require_serial(&device, &req.volume_id, || {
            self.staged_here(&device, &req.volume_id, &staging)
        })?;
        Ok(StageWork {
            volume_id: req.volume_id.clone(),
            disk: DiskId::of(&device)?,
            wwn,
            serial: dev.serial.clone(),
            staging,
            device,
            access,
            read_only: req.read_only,
            passphrase,
            timings: HashMap::from([("wait".to_string(), ms(waiting))]),
        })
    }

    /// Stage's work on the device, once found: blocking.
    pub fn stage(&self, mut w: StageWork) -> Result<pb::StageResponse, HostdError> {
        // The same disk still, under the same name, as it was verified.
        if DiskId::of(&w.device).ok().as_ref() != Some(&w.disk) {
            return Err(HostdError::DeviceRefused {
                device: w.device.clone(),
                reason: "the disk changed since it was verified (detached, or another attached under its name); the stage is retried".into(),
            });
        }
        self.resolver
            .verify_identity(&w.device, &w.wwn, &w.serial, &w.volume_id)?;
        let (actions, majmin, block) = match &w.access {
            pb::stage_request::Access::Filesystem(fs) => {
                let crypt = w
                    .passphrase
                    .as_ref()
                    .map(|p| (luks::mapping_name(&w.volume_id), p));
                let (a, m) = self.stage_filesystem(
                    &w.volume_id,
                    &w.device,
                    &w.staging,
                    fs,
                    w.read_only,
                    crypt,
                    &mut w.timings,
                )?;
                (a, m, false)
            }
            pb::stage_request::Access::Block(_) => {
                let (a, m) = self.stage_block_volume(
                    &w.volume_id,
                    &w.device,
                    &w.staging,
                    w.read_only,
                    w.passphrase.as_ref(),
                    &mut w.timings,
                )?;
                (a, m, true)
            }
        };
        let mut binding = self.bindings.get(&w.volume_id)?.unwrap_or_else(|| Binding {
            volume_id: w.volume_id.clone(),
            staging_path: w.staging.path.clone(),
            block,
            majmin: majmin.clone(),
            targets: Vec::new(),
        });
        binding.staging_path = w.staging.path.clone();
        binding.majmin = majmin.clone();
        self.bindings.put(&binding)?;
        Ok(pb::StageResponse {
            actions,
            size_bytes: blockdev::name_of(&majmin)
                .and_then(|n| blockdev::size_of(&n))
                .unwrap_or(0),
            timings_ms: w.timings,
        })
    }

    /// Returns the actions taken and `major:minor` of what is mounted.
    #[allow(clippy::too_many_arguments)]
    fn stage_filesystem(
        &self,
        volume_id: &str,
        device: &Path,
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
        let table = mounts::table()?;
        // What gets the filesystem: the disk, or its LUKS mapping.
        let mapping = crypt.as_ref().map(|(name, _)| luks::mapper_path(name));
        let fs_device = mapping.as_deref().unwrap_or(device);
        if let Some(m) = table.iter().rev().find(|m| m.mount_point == staging.path) {
            let mm = device::majmin(fs_device).ok();
            if mm.as_deref() == Some(m.majmin.as_str()) && m.fs_type == fs_type.name() {
                // This volume's mapping, on this very disk.
                if let Some((name, _)) = &crypt
                    && let Err(elsewhere) = mapping_on(name, device)
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
        if let Some(closed) = close_idle_go_mapping(device, &table)? {
            actions.push(closed);
        }
        device::verify_unused(device, &table, crypt.as_ref().map(|(n, _)| n.as_str()))?;
        let disk = DiskId::of(device)?;
        // The id's mark counts only where the disk's serial proves the id.
        let mut claim = if self.resolver.proves_volume_id(device, volume_id) {
            Claim::of(volume_id, device)?
        } else {
            Claim::Unmarked
        };
        // Proxmox's lvcreate wipes the signatures a removed volume left;
        // one found now was made since: by this node's own first stage that
        // did not finish (its note says so; nothing was mounted, so it is
        // made again), or by another node's, or by the Go node plugin during
        // a switch of drivers: then the general rules decide.
        if claim == Claim::FirstStage
            && !self.bindings.format_begun(volume_id, &disk)
            && formatted_since_allocation(device)?
        {
            tracing::info!(%volume_id, device = %device.display(), "a volume created blank holds a signature made since: staged by the general rules");
            claim = Claim::MadeSince;
        }
        if claim == Claim::FirstStage {
            self.first_stage(
                volume_id,
                device,
                &disk,
                read_only,
                crypt.as_ref(),
                &mut actions,
            )?;
        }
        let mut made_luks = false;
        if let Some((name, pass)) = &crypt {
            made_luks = self.open_luks(
                volume_id,
                device,
                (name, pass),
                claim,
                read_only,
                &table,
                &mut actions,
                timings,
            )?;
        }
        let started = Instant::now();
        let found = probe::probe(fs_device)?;
        match found {
            _ if claim.held_filesystem().is_some()
                && !matches!(&found, Contents::Filesystem(t) if t == fs_type.name()) =>
            {
                return Err(HostdError::HoldsData {
                    device: fs_device.to_path_buf(),
                    found: format!(
                        "{found}, and the volume's claim at byte {} says it has held its filesystem: \
                         its header is damaged or was overwritten, and it is never formatted again",
                        claim.held_filesystem().unwrap_or_default()
                    ),
                });
            }
            Contents::Blank => {
                // Data hostd's own interrupted format left is not someone's.
                let resumed = self.bindings.format_begun(volume_id, &disk);
                if read_only {
                    return Err(read_only_blank(fs_device));
                }
                if crypt.is_none() && !resumed {
                    refuse_data(device)?;
                }
                // A mapping's plaintext reads as noise whatever it holds: a
                // LUKS volume without a filesystem signature is formatted
                // only when this stage, or one whose note proves hostd began
                // it, wrote its header.
                if crypt.is_some() && !made_luks && !resumed {
                    return Err(HostdError::HoldsData {
                        device: fs_device.to_path_buf(),
                        found: "an existing LUKS volume whose contents carry no filesystem signature (raw data, or a damaged superblock)".into(),
                    });
                }
                self.bindings.begin_format(volume_id, &disk)?;
                mkfs::run(fs_type, fs_device, claim.sized(opts, device, fs_device)?)?;
                timings.insert("mkfs".into(), ms(started));
                actions.push(if resumed && claim != Claim::FirstStage {
                    format!("mkfs {} (an earlier mkfs was interrupted)", fs_type.name())
                } else {
                    format!("mkfs {}", fs_type.name())
                });
                // Claimed before the first mount: no data is ever in the
                // volume without its claim.
                claim.write(volume_id, device, &mut actions)?;
                self.bindings.end_format(volume_id)?;
            }
            Contents::Unfinished(t) if t == fs_type.name() => {
                // One byte says mkfs never finished: made again only when
                // hostd's own note, or this stage's LUKS header, proves the
                // interrupted mkfs was hostd's.
                if read_only {
                    return Err(read_only_blank(fs_device));
                }
                if !made_luks && !self.bindings.format_begun(volume_id, &disk) {
                    return Err(HostdError::HoldsData {
                        device: fs_device.to_path_buf(),
                        found: format!("an unfinished {t} that hostd did not begin"),
                    });
                }
                let opts = MkfsOptions {
                    replace_unfinished: true,
                    ..opts
                };
                mkfs::run(fs_type, fs_device, claim.sized(opts, device, fs_device)?)?;
                timings.insert("mkfs".into(), ms(started));
                actions.push(format!(
                    "mkfs {} (an earlier mkfs was interrupted)",
                    fs_type.name()
                ));
                claim.write(volume_id, device, &mut actions)?;
                self.bindings.end_format(volume_id)?;
            }
            Contents::Filesystem(t) if t == fs_type.name() => {
                // Made by a first stage whose claim a crash kept from being
                // written: exactly its size, so the tail is free. A
                // filesystem over the whole disk stays unclaimed.
                if claim == Claim::MadeSince
                    && probe::fs_bytes(fs_device)?
                        == Some(claim::first_stage_size(device, fs_device)?)
                {
                    claim.write(volume_id, device, &mut actions)?;
                }
                self.bindings.end_format(volume_id)?;
            }
            found => {
                return Err(HostdError::HoldsData {
                    device: fs_device.to_path_buf(),
                    found: found.to_string(),
                });
            }
        }
        staging.ensure_dir()?;
        let t = Instant::now();
        let target = staging.open()?;
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
            && luks::active(name).is_some()
        {
            luks::close(name, false)?;
            actions.push(format!(
                "closed {name}, left by a first stage that did not finish"
            ));
        }
        // The disk under this name is still the volume's, right before
        // the one write hostd makes over bytes it did not write.
        if !self.resolver.proves_volume_id(device, volume_id) || DiskId::of(device)? != *disk {
            return Err(HostdError::DeviceRefused {
                device: device.to_path_buf(),
                reason: "the disk changed since it was verified (detached, or another attached under its name); the stage is retried".into(),
            });
        }
        claim::wipe(device)?;
        self.bindings.begin_format(volume_id, disk)?;
        actions.push(
            "wiped the head and tail its storage left (first stage of a volume created blank)"
                .into(),
        );
        Ok(())
    }

    /// Opens the volume's LUKS mapping `name` on `device`, formatting a
    /// blank disk first; an open mapping is reused only on this very disk.
    /// Whether this call wrote the LUKS header.
    #[allow(clippy::too_many_arguments)]
    fn open_luks(
        &self,
        volume_id: &str,
        device: &Path,
        (name, pass): (&str, &Secret<Vec<u8>>),
        claim: Claim,
        read_only: bool,
        table: &[mounts::MountEntry],
        actions: &mut Vec<String>,
        timings: &mut HashMap<String, u64>,
    ) -> Result<bool, HostdError> {
        let mut made = false;
        // A mapping left by a hostd that died between activation and
        // its node (or before the mount) is torn down and made again;
        // nothing can be using it: the staging path is not mounted.
        if let Some(dm) = luks::active(name)
            && !luks::is_open(name)
            && !device_has_mount(table, &dm)
        {
            tracing::warn!(mapping = %name, dm, "closing a half-made mapping left by an earlier attempt");
            luks::close(name, true)?;
        }
        if luks::is_open(name) {
            // An open mapping is used only if it sits on the disk just verified.
            if let Err(reason) = mapping_on(name, device) {
                return Err(HostdError::DeviceRefused {
                    device: device.to_path_buf(),
                    reason,
                });
            }
        } else {
            let found = probe::probe(device)?;
            let keyslot = matches!(&found, Contents::Filesystem(t) if t == "crypto_LUKS")
                && luks::has_keyslot(device)?;
            if let Some(at) = claim.held_filesystem()
                && !keyslot
            {
                return Err(HostdError::HoldsData {
                    device: device.to_path_buf(),
                    found: format!(
                        "{found} where its LUKS header with a key slot was, and the volume's claim at byte {at} \
                         says it has held its filesystem: the header is damaged or was overwritten (restore a \
                         header backup), and it is never formatted again"
                    ),
                });
            }
            match found {
                Contents::Blank => {
                    if read_only {
                        return Err(read_only_blank(device));
                    }
                    let disk = DiskId::of(device)?;
                    if !self.bindings.format_begun(volume_id, &disk) {
                        refuse_data(device)?;
                        // luksFormat writes the header area whole: every
                        // byte of it is read, not sampled.
                        refuse_data_in(device, luks::HEADER_BYTES)?;
                    }
                    self.bindings.begin_format(volume_id, &disk)?;
                    let t = Instant::now();
                    kdf::format(device, pass, self.pbkdf)?;
                    timings.insert("luks_format".into(), ms(t));
                    actions.push("luksFormat".to_string());
                    made = true;
                }
                Contents::Filesystem(t) if t == "crypto_LUKS" => {
                    if !keyslot {
                        // Only hostd's own interrupted luksFormat: a header
                        // whose slots someone removed may have a backup
                        // that opens the data still.
                        let disk = DiskId::of(device)?;
                        if read_only || !self.bindings.format_begun(volume_id, &disk) {
                            return Err(HostdError::HoldsData {
                                device: device.to_path_buf(),
                                found: "a LUKS header without a key slot that hostd did not begin"
                                    .into(),
                            });
                        }
                        tracing::warn!(device = %device.display(), "LUKS header without a key slot: hostd's earlier luksFormat was interrupted; formatting again");
                        kdf::format(device, pass, self.pbkdf)?;
                        actions.push("luksFormat (an earlier one was interrupted)".to_string());
                        made = true;
                    }
                    luks::check_header_costs(device, self.kdf_bounds)?;
                }
                found => {
                    return Err(HostdError::HoldsData {
                        device: device.to_path_buf(),
                        found: format!("{found} and encryption was asked for"),
                    });
                }
            }
            let t = Instant::now();
            kdf::open(device, name, pass)?;
            timings.insert("luks_open".into(), ms(t));
            actions.push(format!("luksOpen {name}"));
        }
        Ok(made)
    }

    /// A raw block volume: the disk, or with a passphrase its LUKS mapping
    /// (the disk formatted when blank), bound into the staging directory.
    /// A disk of an encrypted class that holds data but no LUKS header was
    /// written by the Go driver, which stages block volumes without their
    /// class's encryption (pkg/csi/node.go NodeStageVolume returns for block
    /// before it reads the secrets): it stays usable, unencrypted, as there.
    fn stage_block_volume(
        &self,
        volume_id: &str,
        device: &Path,
        staging: &Place,
        read_only: bool,
        passphrase: Option<&Secret<Vec<u8>>>,
        timings: &mut HashMap<String, u64>,
    ) -> Result<(Vec<String>, String), HostdError> {
        let Some(pass) = passphrase else {
            refuse_luks_as_plain(device)?;
            return self.stage_block(device, staging);
        };
        let name = luks::mapping_name(volume_id);
        let mut actions = Vec::new();
        if !luks::is_open(&name) {
            // What a raw block volume holds rarely has a signature: bytes
            // where a blank disk has none are data too.
            let found = match probe::probe(device)? {
                Contents::Blank => probe::first_data(device)?
                    .map(|at| format!("no signature, but data at byte {at}")),
                Contents::Filesystem(t) if t == "crypto_LUKS" => None,
                other => Some(other.to_string()),
            };
            if let Some(found) = found {
                if !self.go_takeover {
                    return Err(HostdError::DeviceRefused {
                        device: device.to_path_buf(),
                        reason: format!(
                            "the volume's class asks for encryption, but the disk holds {found} and no LUKS header; \
                             staging it unencrypted (a raw block volume the Go driver wrote) needs hostd's --go-takeover"
                        ),
                    });
                }
                tracing::warn!(
                    %volume_id,
                    device = %device.display(),
                    %found,
                    "raw block volume of an encrypted class holds unencrypted data (written by the Go driver, \
                     which does not encrypt block volumes): staged as it is; copy it to a new volume to encrypt it"
                );
                let (mut a, m) = self.stage_block(device, staging)?;
                a.insert(
                    0,
                    format!("not encrypted: the disk holds {found}, no LUKS header"),
                );
                return Ok((a, m));
            }
        }
        // Opened, or checked to be open on this very disk.
        let table = mounts::table()?;
        device::verify_unused(device, &table, Some(&name))?;
        // A raw volume's every byte may be data: no claim decides here.
        self.open_luks(
            volume_id,
            device,
            (&name, pass),
            Claim::Unmarked,
            read_only,
            &table,
            &mut actions,
            timings,
        )?;
        // No filesystem follows: the format, if there was one, is done.
        self.bindings.end_format(volume_id)?;
        // The kernel's own node (`/dev/dm-N`, found in sysfs), so that the
        // mount table names the device sysfs knows; `/dev/mapper/<name>` is
        // a node of its own when libdevmapper runs without udev.
        let dm = luks::active(&name).ok_or_else(|| {
            HostdError::failed(
                "finding",
                luks::mapper_path(&name).display(),
                "no such device-mapper device in sysfs",
            )
        })?;
        let (a, m) = self.stage_block(&Path::new("/dev").join(dm), staging)?;
        actions.extend(a);
        Ok((actions, m))
    }

    fn stage_block(
        &self,
        device: &Path,
        staging: &Place,
    ) -> Result<(Vec<String>, String), HostdError> {
        self.stage_block_over(device, staging, mounts::table()?)
    }

    /// `stage_block` against `table`, the mounts that count.
    fn stage_block_over(
        &self,
        device: &Path,
        staging: &Place,
        table: Vec<mounts::MountEntry>,
    ) -> Result<(Vec<String>, String), HostdError> {
        let mm = device::majmin(device)?;
        // kubelet makes the block staging directory before it calls
        // (csi_block.go stageVolumeForBlock): hostd makes none of its own.
        if staging.kind() != Kind::Dir {
            return Err(HostdError::invalid(
                "staging_path",
                format!(
                    "{} is not a directory; kubelet makes it before NodeStageVolume",
                    staging.path.display()
                ),
            ));
        }
        let file = staging.child(BLOCK_FILE)?;
        if table.iter().any(|m| m.mount_point == file.path) {
            // A bound device node: the file now stats as that device.
            let bound = device::majmin(&file.open()?.proc_path())?;
            if bound == mm {
                return Ok((vec!["already staged".into()], mm));
            }
            return Err(HostdError::StagedDifferently {
                path: file.path.clone(),
                what: "a bound device",
                detail: format!(
                    "device {bound} is bound there, the request is {} ({mm})",
                    device.display()
                ),
            });
        }
        device::verify_unused(device, &table, None)?;
        file.ensure_file()?;
        mounts::bind(device, &file, false, &mountopts::Checked::default())?;
        Ok((
            vec![format!(
                "bound {} at {}",
                device.display(),
                file.path.display()
            )],
            mm,
        ))
    }

    /// Whether `majmin`, found at `place`, is `volume_id`'s: by hostd's
    /// record, by kubelet's own structure, or by the device itself.
    fn owns(&self, volume_id: &str, place: &Place, majmin: &str, record: Option<&Binding>) -> bool {
        if let Some(b) = record {
            let listed = b.staging_path == place.path || b.targets.contains(&place.path);
            if listed && b.majmin == majmin {
                return true;
            }
        }
        (bindings::kubelet_says(&place.path, place.layout, volume_id, self.paths.driver())
            && self.bindings_free(place, volume_id))
            || bindings::device_is_volumes(majmin, volume_id)
    }

    /// No other volume's record names `place`.
    fn bindings_free(&self, place: &Place, volume_id: &str) -> bool {
        self.bindings
            .staged_at(&place.path)
            .ok()
            .flatten()
            .is_none_or(|b| b.volume_id == volume_id)
    }

    /// `major:minor` of what is mounted at `place` (for a bound device node,
    /// the device's own), if anything is.
    fn mounted_at(
        &self,
        place: &Place,
        table: &[mounts::MountEntry],
    ) -> Result<Option<String>, HostdError> {
        let Some(m) = table.iter().rev().find(|m| m.mount_point == place.path) else {
            return Ok(None);
        };
        if place.layout.is_block() && place.kind() != Kind::Dir {
            return device::majmin(&place.open()?.proc_path()).map(Some);
        }
        Ok(Some(m.majmin.clone()))
    }

    fn not_this_volume(
        field: &'static str,
        place: &Place,
        volume_id: &str,
        majmin: &str,
    ) -> HostdError {
        HostdError::NotThisVolume {
            field,
            path: place.path.clone(),
            volume_id: volume_id.to_string(),
            reason: format!("device {majmin} is mounted there, and nothing ties it to this volume"),
        }
    }

    /// Refuses a path that kubelet's own files give to another volume or
    /// driver. A path kubelet left no record at is accepted (see [`Tie`]).
    fn require_tie(
        &self,
        field: &'static str,
        place: &Place,
        volume_id: &str,
    ) -> Result<(), HostdError> {
        match bindings::kubelet_tie(&place.path, place.layout, volume_id, self.paths.driver()) {
            Tie::Other(reason) => Err(HostdError::NotThisVolume {
                field,
                path: place.path.clone(),
                volume_id: volume_id.to_string(),
                reason,
            }),
            Tie::Ours | Tie::Unrecorded => Ok(()),
        }
    }

    /// A SCSI disk is tied to its volume by the serial the controller
    /// derives from the volume id (checked in `verify_identity`). A disk
    /// without one (attached by the Go driver, which sets none; its WWN is
    /// one of a few LUN-derived values) is used only where kubelet's records
    /// already tie it to the volume (`tied`: it is in use there already), or
    /// with the operator's `--go-takeover`.
    fn require_serial(
        &self,
        device: &Path,
        volume_id: &str,
        tied: impl FnOnce() -> Result<bool, HostdError>,
    ) -> Result<(), HostdError> {
        if !matches!(self.resolver, Resolver::Sysfs { .. }) {
            return Ok(());
        }
        let disk = blockdev::kernel_name(device).unwrap_or_default();
        if device::serial_of(&disk)
            .is_some_and(|s| s.starts_with(proxmox_csi_common::contract::SERIAL_PREFIX))
        {
            return Ok(());
        }
        if self.go_takeover {
            tracing::warn!(%volume_id, device = %device.display(), "disk without this driver's serial taken over (--go-takeover)");
            return Ok(());
        }
        if tied()? {
            return Ok(());
        }
        Err(HostdError::DeviceRefused {
            device: device.to_path_buf(),
            reason: format!(
                "it carries no serial of this driver's, so nothing ties it to volume {volume_id}; \
                 a disk the Go driver attached is used only with hostd's --go-takeover (docs/security.md), \
                 or after the controller attaches it again"
            ),
        })
    }

    /// Whether `device`, or its Go mapping, is mounted at `staging`, which
    /// kubelet names for `volume_id`: a volume the Go driver staged.
    fn staged_here(
        &self,
        device: &Path,
        volume_id: &str,
        staging: &Place,
    ) -> Result<bool, HostdError> {
        let disk = blockdev::kernel_name(device).unwrap_or_default();
        let table = mounts::table()?;
        let mut own = vec![device::majmin(device)?];
        if let Some(mm) = luks::go_mapping_on(&disk).and_then(|(_, dm)| blockdev::majmin_of(&dm)) {
            own.push(mm);
        }
        Ok(bindings::kubelet_says(
            &staging.path,
            staging.layout,
            volume_id,
            self.paths.driver(),
        ) && table
            .iter()
            .any(|m| m.mount_point == staging.path && own.contains(&m.majmin)))
    }

    /// Where the devices `majmins` are mounted or bound, other than at
    /// `except` (the staging path itself): the volume's publications.
    fn publications(
        table: &[mounts::MountEntry],
        majmins: &[String],
        except: &[&Path],
    ) -> Vec<PathBuf> {
        table
            .iter()
            .filter(|m| !except.contains(&m.mount_point.as_path()))
            .filter(|m| {
                if m.fs_type == "devtmpfs" {
                    // A bound device node: what the node itself is.
                    device::majmin(&m.mount_point).is_ok_and(|mm| majmins.contains(&mm))
                } else {
                    majmins.contains(&m.majmin)
                }
            })
            .map(|m| m.mount_point.clone())
            .collect()
    }

    pub fn unstage(&self, req: &pb::UnstageRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let staging = self
            .paths
            .place("staging_path", &req.staging_path, Layout::STAGING)?;
        let record = self.bindings.get(&req.volume_id)?;
        if let Some(b) = record.as_ref().filter(|b| b.staging_path != staging.path) {
            return Err(HostdError::NotThisVolume {
                field: "staging_path",
                path: staging.path.clone(),
                volume_id: req.volume_id.clone(),
                reason: format!("the volume is staged at {}", b.staging_path.display()),
            });
        }
        self.require_tie("staging_path", &staging, &req.volume_id)?;
        let table = mounts::table()?;
        // Nothing is unmounted or closed while a pod still has the volume:
        // a closed mapping's device number goes to the next mapping made,
        // which the pod's bound node would then reach.
        let block_file = if staging.layout == Layout::BlockStaging && staging.kind() == Kind::Dir {
            Some(staging.child(BLOCK_FILE)?)
        } else {
            None
        };
        let here = block_file.as_ref().unwrap_or(&staging);
        let mounted = self.mounted_at(here, &table)?;
        if let Some(mm) = &mounted
            && !self.owns(&req.volume_id, &staging, mm, record.as_ref())
        {
            return Err(Self::not_this_volume(
                "staging_path",
                here,
                &req.volume_id,
                mm,
            ));
        }
        let mut staged_devices: Vec<String> = mounted.iter().cloned().collect();
        if let Some(mm) = luks::active(&luks::mapping_name(&req.volume_id))
            .and_then(|dm| blockdev::majmin_of(&dm))
        {
            staged_devices.push(mm);
        }
        let published = Self::publications(&table, &staged_devices, &[&staging.path, &here.path]);
        if !published.is_empty() {
            return Err(HostdError::StillPublished {
                volume_id: req.volume_id.clone(),
                targets: published,
            });
        }
        let mut flushed = None;
        let mut go_mapping = None;
        if let Some(file) = &block_file {
            if mounted.is_some() {
                unmount_all(file)?;
                flushed = mounted;
            }
            file.remove_only(Kind::File)?;
        } else if let Some(mm) = mounted {
            // A volume the Go driver staged sits on its mapping
            // `<disk>-encrypted` or `wwn-0x…-encrypted`, which is closed
            // below with the mount gone.
            go_mapping = staged_at(&staging)?
                .and_then(|s| s.mapping)
                .filter(|(dm, disk)| {
                    luks::go_mapping_on(disk).is_some_and(|(name, _)| name == *dm)
                });
            unmount_all(&staging)?;
            flushed = Some(mm);
        }
        if let Some(mm) = flushed {
            blockdev::flush(&mm);
        }
        if let Some((name, disk)) = go_mapping {
            let table = mounts::table()?;
            if luks::active(&name).is_some_and(|dm| !device_has_mount(&table, &dm) && !held(&dm)) {
                tracing::info!(mapping = %name, disk, "closing the Go driver's mapping of the volume");
                luks::close(&name, !blockdev::backing_present(&name))?;
            }
        }
        // Close the volume's mapping even if nothing was mounted (a crash
        // between unmount and close, or a surprise unplug).
        let name = luks::mapping_name(&req.volume_id);
        if luks::active(&name).is_some() {
            // A vanished disk leaves a mapping that only a forced close removes.
            luks::close(&name, !blockdev::backing_present(&name))?;
        }
        // A format note outlives no unstage: the next stage starts afresh.
        self.bindings.end_format(&req.volume_id)?;
        self.bindings.remove(&req.volume_id)
    }

    pub fn publish(&self, req: &pb::PublishRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let (staging_layout, target_layout) = if req.block {
            (Layout::BlockStaging, Layout::BlockTarget)
        } else {
            (Layout::FsStaging, Layout::FsTarget)
        };
        let staging = self
            .paths
            .place("staging_path", &req.staging_path, &[staging_layout])?;
        let target = self
            .paths
            .place("target_path", &req.target_path, &[target_layout])?;
        self.require_tie("staging_path", &staging, &req.volume_id)?;
        self.require_tie("target_path", &target, &req.volume_id)?;
        let opts = mountopts::check("mount_flags", None, &req.mount_flags)?;
        if req.block {
            self.adopt_go_block(req, &staging)?;
        }
        let record = self.bindings.get(&req.volume_id)?;
        let table = mounts::table()?;
        // What is bound: the device file in a block staging directory, or
        // (a second handle on) the filesystem staging directory itself.
        let source = if req.block {
            staging.child(BLOCK_FILE)?
        } else {
            self.paths
                .place("staging_path", &req.staging_path, &[staging_layout])?
        };
        let staged = self.mounted_at(&source, &table)?.ok_or_else(|| {
            HostdError::NotStaged(format!(
                "{} (nothing mounted at {})",
                req.volume_id,
                source.path.display()
            ))
        })?;
        if !self.owns(&req.volume_id, &staging, &staged, record.as_ref()) {
            return Err(Self::not_this_volume(
                "staging_path",
                &staging,
                &req.volume_id,
                &staged,
            ));
        }
        if let Some(m) = table.iter().rev().find(|m| m.mount_point == target.path) {
            let there = self.mounted_at(&target, &table)?.unwrap_or_default();
            if there == staged && m.read_only == req.read_only {
                return self.record_target(
                    &req.volume_id,
                    &staging,
                    &target,
                    &staged,
                    req.block,
                    record,
                );
            }
            return Err(HostdError::StagedDifferently {
                path: target.path.clone(),
                what: "published",
                detail: format!(
                    "device {there} mounted {} is there, the request is device {staged} {}",
                    if m.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    if req.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                ),
            });
        }
        // One read-write publication at a time (the spec's answer for a
        // second one is FAILED_PRECONDITION): another read-write mount of
        // the staged filesystem in a pod's directory is that publication.
        if req.single_writer && !req.read_only && !req.block {
            let pods = self.paths.root().join("pods");
            if let Some(other) = table.iter().find(|m| {
                m.majmin == staged
                    && !m.read_only
                    && m.mount_point != source.path
                    && m.mount_point.starts_with(&pods)
            }) {
                return Err(HostdError::PublishedElsewhere {
                    volume_id: req.volume_id.clone(),
                    other: other.mount_point.clone(),
                });
            }
        }
        if req.block {
            target.ensure_file()?;
        } else {
            target.ensure_dir()?;
        }
        mounts::bind(&source.open()?.proc_path(), &target, req.read_only, &opts)?;
        self.record_target(
            &req.volume_id,
            &staging,
            &target,
            &staged,
            req.block,
            record,
        )
    }

    /// A raw block volume the Go driver staged: it stages nothing (its
    /// NodeStageVolume returns at once for block, pkg/csi/node.go), so
    /// kubelet's staging directory is empty. The disk the publish context
    /// names, verified as Stage verifies it, is bound there as Stage would.
    fn adopt_go_block(&self, req: &pb::PublishRequest, staging: &Place) -> Result<(), HostdError> {
        let Some(dev) = req.device.as_ref() else {
            return Ok(());
        };
        if staging.kind() != Kind::Dir || self.bindings.get(&req.volume_id)?.is_some() {
            return Ok(());
        }
        let file = staging.child(BLOCK_FILE)?;
        let table = mounts::table()?;
        if self.mounted_at(&file, &table)?.is_some() {
            return Ok(());
        }
        let wwn = Wwn::parse(&dev.wwn)?;
        let key = self.resolver.key(&wwn);
        let device = self
            .index
            .get(&key)
            .ok_or_else(|| HostdError::DeviceNotFound {
                wwn: wwn.to_string(),
                reason: format!("no block device with {key}"),
            })?;
        check_request_serial(&dev.serial, &req.volume_id)?;
        self.resolver
            .verify_identity(&device, &wwn, &dev.serial, &req.volume_id)?;
        // The Go driver's own publications of this volume bind the disk at
        // pods' block targets, which kubelet's vol_data.json names as this
        // volume's; any other use of the disk still refuses it.
        let name = blockdev::kernel_name(&device).unwrap_or_default();
        // A disk with this driver's serial was attached by this driver's
        // controller, and is staged by Stage, never adopted here.
        if device::serial_of(&name)
            .is_some_and(|s| s.starts_with(proxmox_csi_common::contract::SERIAL_PREFIX))
        {
            return Ok(());
        }
        refuse_luks_as_plain(&device)?;
        // kubelet's binds of a published block volume: the publish path
        // (a file) and the map path `volumeDevices/<pv>/dev/<pod>`.
        let go_publication = |m: &mounts::MountEntry| {
            m.fs_type == "devtmpfs"
                && m.root.trim_start_matches('/') == name
                && self
                    .paths
                    .classify(&m.mount_point)
                    .filter(|l| matches!(l, Layout::BlockTarget | Layout::BlockMap))
                    .is_some_and(|l| {
                        bindings::kubelet_says(
                            &m.mount_point,
                            l,
                            &req.volume_id,
                            self.paths.driver(),
                        )
                    })
        };
        // A disk without this driver's serial is adopted only where the Go
        // driver's publication of this very volume ties it.
        self.require_serial(&device, &req.volume_id, || {
            Ok(table.iter().any(go_publication))
        })?;
        let table: Vec<mounts::MountEntry> = table
            .iter()
            .filter(|m| !go_publication(m))
            .cloned()
            .collect();
        let (_, majmin) = self.stage_block_over(&device, staging, table)?;
        tracing::info!(volume_id = %req.volume_id, device = %device.display(), "raw block volume staged by the Go driver: disk bound into its staging directory");
        self.bindings.put(&Binding {
            volume_id: req.volume_id.clone(),
            staging_path: staging.path.clone(),
            block: true,
            majmin,
            targets: Vec::new(),
        })
    }

    fn record_target(
        &self,
        volume_id: &str,
        staging: &Place,
        target: &Place,
        majmin: &str,
        block: bool,
        record: Option<Binding>,
    ) -> Result<(), HostdError> {
        let mut b = record.unwrap_or_else(|| Binding {
            volume_id: volume_id.to_string(),
            staging_path: staging.path.clone(),
            block,
            majmin: majmin.to_string(),
            targets: Vec::new(),
        });
        if !b.targets.contains(&target.path) {
            b.targets.push(target.path.clone());
        }
        self.bindings.put(&b)
    }

    pub fn unpublish(&self, req: &pb::UnpublishRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let target = self
            .paths
            .place("target_path", &req.target_path, Layout::TARGET)?;
        self.require_tie("target_path", &target, &req.volume_id)?;
        let record = self.bindings.get(&req.volume_id)?;
        let table = mounts::table()?;
        if let Some(mm) = self.mounted_at(&target, &table)? {
            let listed = record
                .as_ref()
                .is_some_and(|b| b.targets.contains(&target.path));
            if !listed && !self.owns(&req.volume_id, &target, &mm, record.as_ref()) {
                return Err(Self::not_this_volume(
                    "target_path",
                    &target,
                    &req.volume_id,
                    &mm,
                ));
            }
            unmount_all(&target)?;
        }
        // What publish made: a filesystem target is a directory, a block
        // target a file; nothing else at such a path is removed.
        target.remove_only(if target.layout.is_block() {
            Kind::File
        } else {
            Kind::Dir
        })?;
        if let Some(mut b) = record.filter(|b| b.targets.contains(&target.path)) {
            b.targets.retain(|t| *t != target.path);
            self.bindings.put(&b)?;
        }
        Ok(())
    }
}

/// A disk holding a LUKS volume is never handed to a pod as a plain disk:
/// its first writes would destroy the header. Only a stage with the
/// volume's passphrase opens it.
fn refuse_luks_as_plain(device: &Path) -> Result<(), HostdError> {
    if probe::probe(device)? == Contents::Filesystem("crypto_LUKS".into()) {
        return Err(HostdError::HoldsData {
            device: device.to_path_buf(),
            found: "a LUKS volume, and no encryption passphrase was given".into(),
        });
    }
    Ok(())
}

/// A request's serial, when it names one, must be the one the controller
/// derives from the volume id.
fn check_request_serial(serial: &str, volume_id: &str) -> Result<(), HostdError> {
    let own = proxmox_csi_common::contract::serial_for(volume_id);
    if !serial.is_empty() && serial != own {
        return Err(HostdError::invalid(
            "device.serial",
            format!("{serial:?} is not volume {volume_id}'s serial; the controller sets {own:?}"),
        ));
    }
    Ok(())
}

/// Whether a disk created blank holds what was made on it since its
/// allocation: a signature other than an unfinished xfs or a LUKS header
/// without a key slot, which a first stage that did not finish leaves.
fn formatted_since_allocation(device: &Path) -> Result<bool, HostdError> {
    Ok(match probe::probe(device)? {
        Contents::Blank | Contents::Unfinished(_) => false,
        Contents::Filesystem(t) if t == "crypto_LUKS" => luks::has_keyslot(device)?,
        _ => true,
    })
}

/// Refuses `device` if any of its first `len` bytes is not zero.
fn refuse_data_in(device: &Path, len: u64) -> Result<(), HostdError> {
    if let Some(at) = probe::first_data_in(device, len)? {
        return Err(HostdError::HoldsData {
            device: device.to_path_buf(),
            found: format!("no signature, but data at byte {at}"),
        });
    }
    Ok(())
}

/// A blank disk is formatted only if none of the bytes hostd samples holds data.
fn refuse_data(device: &Path) -> Result<(), HostdError> {
    if let Some(at) = probe::first_data(device)? {
        return Err(HostdError::HoldsData {
            device: device.to_path_buf(),
            found: format!("no signature, but data at byte {at}"),
        });
    }
    Ok(())
}

/// Never formatting for a read-only stage (mount-utils refuses that too:
/// `formatAndMountSensitive`).
fn read_only_blank(device: &Path) -> HostdError {
    HostdError::DeviceRefused {
        device: device.to_path_buf(),
        reason: "it holds no filesystem and the stage is read-only: there is nothing to mount, and formatting is a write"
            .into(),
    }
}

/// A mapping the Go driver left on `device` (`<disk>-encrypted`,
/// `wwn-0x…-encrypted`) that
/// nothing mounts or holds: what a switch of drivers leaves when the Go
/// driver's unstage never ran to its close. It is only a view of this very
/// disk, just verified as the volume's, so it is closed for the stage.
fn close_idle_go_mapping(
    device: &Path,
    table: &[mounts::MountEntry],
) -> Result<Option<String>, HostdError> {
    let Some(disk) = blockdev::kernel_name(device) else {
        return Ok(None);
    };
    let Some((name, dm)) = luks::go_mapping_on(&disk) else {
        return Ok(None);
    };
    if device_has_mount(table, &dm) || held(&dm) {
        return Ok(None);
    }
    tracing::warn!(mapping = %name, dm, disk, "closing the Go driver's idle mapping of the disk");
    luks::close(&name, false)?;
    Ok(Some(format!("closed the Go driver's mapping {name}")))
}

/// Whether another device sits on the block device `name` (`holders/`).
fn held(name: &str) -> bool {
    std::fs::read_dir(Path::new("/sys/block").join(name).join("holders"))
        .map(|d| d.flatten().next().is_some())
        .unwrap_or(false)
}

/// Whether the block device `name` (e.g. `dm-0`) is mounted anywhere, or
/// its node bound anywhere (a raw block publication shows as devtmpfs).
fn device_has_mount(table: &[mounts::MountEntry], name: &str) -> bool {
    let majmins: Vec<String> = blockdev::majmin_of(name).into_iter().collect();
    !Volumes::publications(table, &majmins, &[]).is_empty()
}

/// Unmounts every mount stacked at `place`, through its parent's descriptor.
fn unmount_all(place: &Place) -> Result<(), HostdError> {
    while mounts::at(&place.path)?.is_some() {
        mounts::unmount(&place.via_parent())
            .map_err(|e| HostdError::failed("unmounting", place.path.display(), e))?;
    }
    Ok(())
}

/// What is mounted or bound at a volume path, resolved to block devices.
#[derive(Debug)]
struct Staged {
    entry: mounts::MountEntry,
    /// Kernel name of the device the filesystem (or bind) sits on.
    name: String,
    /// For a dm-crypt mapping, its name and the disk underneath.
    mapping: Option<(String, String)>,
    majmin: String,
}

fn staged_at(place: &Place) -> Result<Option<Staged>, HostdError> {
    let Some(entry) = mounts::at(&place.path)? else {
        return Ok(None);
    };
    // A bound device node shows devtmpfs in the mount table: the node's own
    // device is what it stats as.
    let majmin = if place.layout.is_block() {
        device::majmin(&place.open()?.proc_path())?
    } else {
        entry.majmin.clone()
    };
    let Some(name) = blockdev::name_of(&majmin) else {
        return Ok(Some(Staged {
            entry,
            name: String::new(),
            mapping: None,
            majmin,
        }));
    };
    let mapping =
        std::fs::read_to_string(Path::new("/sys/class/block").join(&name).join("dm/name"))
            .ok()
            .map(|n| n.trim().to_string())
            .and_then(|dm| {
                blockdev::slaves(&name)
                    .into_iter()
                    .next()
                    .map(|disk| (dm, disk))
            });
    Ok(Some(Staged {
        entry,
        name,
        mapping,
        majmin,
    }))
}

impl Volumes {
    /// The place a Stats or Expand request names, and what is staged there,
    /// which must be the volume's.
    fn volume_at(&self, volume_id: &str, raw: &str) -> Result<(Place, Staged), HostdError> {
        check_volume_id(volume_id)?;
        // A path that does not exist holds no volume: the spec's NOT_FOUND
        // for NodeGetVolumeStats and NodeExpandVolume.
        let place = match self.paths.place("volume_path", raw, Layout::VOLUME) {
            Err(HostdError::ParentMissing { path, .. }) => {
                return Err(HostdError::NothingAt(format!(
                    "{volume_id} (no such path {})",
                    path.display()
                )));
            }
            other => other?,
        };
        self.require_tie("volume_path", &place, volume_id)?;
        if place.kind() == Kind::Missing {
            return Err(HostdError::NothingAt(format!(
                "{volume_id} (no such path {})",
                place.path.display()
            )));
        }
        let staged = staged_at(&place)?.ok_or_else(|| {
            HostdError::NothingAt(format!(
                "{volume_id} (nothing mounted at {})",
                place.path.display()
            ))
        })?;
        let record = self.bindings.get(volume_id)?;
        if !self.owns(volume_id, &place, &staged.majmin, record.as_ref()) {
            return Err(Self::not_this_volume(
                "volume_path",
                &place,
                volume_id,
                &staged.majmin,
            ));
        }
        Ok((place, staged))
    }

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
            .map_err(|e| HostdError::failed("opening", place.path.display(), e))?;
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

    pub fn stats(&self, req: &pb::StatsRequest) -> Result<pb::StatsResponse, HostdError> {
        let (place, staged) = self.volume_at(&req.volume_id, &req.volume_path)?;
        let block = place.layout.is_block();
        let mut resp = pb::StatsResponse {
            block,
            ..Default::default()
        };
        let mut problems = Vec::new();
        if staged.name.is_empty() || !Path::new("/sys/class/block").join(&staged.name).exists() {
            problems.push("the device is gone".to_string());
        }
        if let Some((mapping, disk)) = &staged.mapping
            && !Path::new("/sys/class/block").join(disk).exists()
        {
            problems.push(format!("the disk under mapping {mapping} is gone"));
        }
        if block {
            resp.total_bytes = blockdev::size_of(&staged.name).unwrap_or(0);
        } else {
            match nix::sys::statvfs::fstatvfs(&place.open()?) {
                Ok(v) => {
                    let frag = v.fragment_size();
                    resp.total_bytes = v.blocks().saturating_mul(frag);
                    resp.available_bytes = v.blocks_available().saturating_mul(frag);
                    resp.used_bytes = v
                        .blocks()
                        .saturating_sub(v.blocks_free())
                        .saturating_mul(frag);
                    resp.total_inodes = v.files();
                    resp.available_inodes = v.files_available();
                    resp.used_inodes = v.files().saturating_sub(v.files_free());
                }
                Err(e) => problems.push(format!(
                    "the filesystem does not answer ({e}); it may have shut down"
                )),
            }
            if staged.entry.super_read_only && !staged.entry.read_only {
                problems.push("the filesystem was remounted read-only after errors".into());
            }
        }
        resp.condition = Some(pb::VolumeCondition {
            abnormal: !problems.is_empty(),
            message: if problems.is_empty() {
                "volume is healthy".into()
            } else {
                problems.join("; ")
            },
        });
        Ok(resp)
    }
}

/// Whether the LUKS mapping `name` sits on `device` alone; if not, where.
fn mapping_on(name: &str, device: &Path) -> Result<(), String> {
    let disk = blockdev::kernel_name(device).unwrap_or_default();
    let under = luks::active(name)
        .map(|dm| blockdev::slaves(&dm))
        .unwrap_or_default();
    if under == [disk.clone()] {
        Ok(())
    } else {
        Err(format!(
            "mapping {name} is open on {under:?}, not on this disk ({disk})"
        ))
    }
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
        .map_err(|e| HostdError::failed("opening", staging.path.display(), e))?;
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
