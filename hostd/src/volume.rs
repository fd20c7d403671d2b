//! Stage, unstage, publish and unpublish: the operations on one volume.
//!
//! Every operation is idempotent: it first looks at what is already there
//! and answers OK when that is what was asked, or an error naming the
//! difference.

use std::path::{Path, PathBuf};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxmox_csi_proto::hostd::v1 as pb;

use proxmox_csi_common::Secret;

use crate::blockdev;
use crate::device::{self, Resolver, Wwn};
use crate::luks;
use crate::discovery::{self, DeviceIndex};
use crate::error::HostdError;
use crate::mkfs::{self, FsType, MkfsOptions};
use crate::mounts;
use crate::paths::KubeletPaths;
use crate::probe::{self, Contents};

/// File inside a raw block volume's staging directory onto which the device
/// node is bound, so publish can bind it again without naming a device.
const BLOCK_FILE: &str = "device";

/// How long a request waits for its device before a SCSI rescan is asked for.
const RESCAN_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug)]
pub struct Volumes {
    pub paths: KubeletPaths,
    pub resolver: Resolver,
    pub index: Arc<DeviceIndex>,
    /// How long Stage waits for the device to appear.
    pub device_wait: Duration,
    /// Key derivation for new LUKS key slots.
    pub pbkdf: luks::Pbkdf,
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
        let Ok(disks) = std::fs::read_dir("/sys/block") else { return 0 };
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

    pub async fn stage(&self, req: &pb::StageRequest) -> Result<pb::StageResponse, HostdError> {
        check_volume_id(&req.volume_id)?;
        let staging = self.paths.check("staging_path", &req.staging_path)?;
        let dev = req
            .device
            .as_ref()
            .ok_or_else(|| HostdError::invalid("device", "is required"))?;
        let wwn = Wwn::parse(&dev.wwn)?;
        let passphrase = match &req.encryption {
            Some(e) if e.passphrase.is_empty() => {
                return Err(HostdError::invalid("encryption.passphrase", "is empty"));
            }
            Some(e) => Some(Secret::new(e.passphrase.clone())),
            None => None,
        };
        let access = req
            .access
            .as_ref()
            .ok_or_else(|| HostdError::invalid("access", "filesystem or block is required"))?;
        let key = self.resolver.key(&wwn);
        let index = &self.index;
        let waiting = Instant::now();
        let device = index
            .wait_for(&key, self.device_wait, RESCAN_GRACE, || discovery::rescan_scsi(index))
            .await
            .ok_or_else(|| HostdError::DeviceNotFound {
                wwn: wwn.to_string(),
                reason: format!("no block device with {key} within {:?}", self.device_wait),
            })?;
        self.resolver.verify_identity(&device, &wwn, &dev.serial)?;
        let mut timings = HashMap::from([("wait".to_string(), ms(waiting))]);
        match access {
            pb::stage_request::Access::Filesystem(fs) => {
                let crypt = passphrase.as_ref().map(|p| (luks::mapping_name(&req.volume_id), p));
                self.stage_filesystem(&device, &staging, fs, req.read_only, crypt, &mut timings).await
            }
            pb::stage_request::Access::Block(_) if passphrase.is_some() => Err(HostdError::invalid(
                "encryption",
                "is supported for filesystem volumes only, not raw block",
            )),
            pb::stage_request::Access::Block(_) => self.stage_block(&device, &staging),
        }
        .map(|actions| {
            // The filesystem sees the mapping, which is smaller by the LUKS header.
            let sized = match (&passphrase, access) {
                (Some(_), pb::stage_request::Access::Filesystem(_)) => {
                    luks::mapper_path(&luks::mapping_name(&req.volume_id))
                }
                _ => device.clone(),
            };
            pb::StageResponse {
                actions,
                size_bytes: blockdev::kernel_name(&sized)
                    .and_then(|n| blockdev::size_of(&n))
                    .unwrap_or(0),
                timings_ms: timings,
            }
        })
    }

    async fn stage_filesystem(
        &self,
        device: &Path,
        staging: &Path,
        fs: &pb::Filesystem,
        read_only: bool,
        crypt: Option<(String, &Secret<Vec<u8>>)>,
        timings: &mut HashMap<String, u64>,
    ) -> Result<Vec<String>, HostdError> {
        let fs_type = FsType::parse(&fs.fs_type)?;
        let opts = MkfsOptions {
            block_size: fs.block_size,
            inode_size: fs.inode_size,
            replace_unfinished: false,
        };
        mkfs::validate(opts)?;
        let table = mounts::table()?;
        // What gets the filesystem: the disk, or its LUKS mapping.
        let mapping = crypt.as_ref().map(|(name, _)| luks::mapper_path(name));
        let fs_device = mapping.as_deref().unwrap_or(device);
        if let Some(m) = table.iter().rev().find(|m| m.mount_point == staging) {
            let mm = device::majmin(fs_device).ok();
            if mm.as_deref() == Some(m.majmin.as_str()) && m.fs_type == fs_type.name() {
                return Ok(vec!["already staged".into()]);
            }
            return Err(HostdError::StagedDifferently {
                path: staging.to_path_buf(),
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
        device::verify_unused(device, &table, crypt.as_ref().map(|(n, _)| n.as_str()))?;
        let mut actions = Vec::new();
        if let Some((name, pass)) = &crypt {
            // A mapping left by a hostd that died between activation and
            // udev's node (or before the mount) is torn down and made again;
            // nothing can be using it: the staging path is not mounted.
            if let Some(dm) = luks::active(name)
                && !luks::is_open(name)
                && !device_has_mount(&table, &dm)
            {
                tracing::warn!(mapping = %name, dm, "closing a half-made mapping left by an earlier attempt");
                luks::close(name, true)?;
            }
            if !luks::is_open(name) {
                match probe::probe(device)? {
                    Contents::Blank => {
                        let t = Instant::now();
                        luks::format(device, pass, self.pbkdf)?;
                        timings.insert("luks_format".into(), ms(t));
                        actions.push("luksFormat".to_string());
                    }
                    Contents::Filesystem(t) if t == "crypto_LUKS" => {
                        if !luks::has_keyslot(device)? {
                            tracing::warn!(device = %device.display(), "LUKS header without a key slot: an earlier luksFormat was interrupted; formatting again");
                            luks::format(device, pass, self.pbkdf)?;
                            actions.push("luksFormat (an earlier one was interrupted)".to_string());
                        }
                    }
                    found => {
                        return Err(HostdError::HoldsData {
                            device: device.to_path_buf(),
                            found: format!("{found} and encryption was asked for"),
                        });
                    }
                }
                let t = Instant::now();
                luks::open(device, name, pass)?;
                timings.insert("luks_open".into(), ms(t));
                actions.push(format!("luksOpen {name}"));
            }
        }
        let started = Instant::now();
        match probe::probe(fs_device)? {
            Contents::Blank => {
                mkfs::run(fs_type, fs_device, opts).await?;
                timings.insert("mkfs".into(), ms(started));
                actions.push(format!("mkfs {}", fs_type.name()));
            }
            Contents::Unfinished(t) if t == fs_type.name() => {
                let opts = MkfsOptions { replace_unfinished: true, ..opts };
                mkfs::run(fs_type, fs_device, opts).await?;
                timings.insert("mkfs".into(), ms(started));
                actions.push(format!("mkfs {} (an earlier mkfs was interrupted)", fs_type.name()));
            }
            Contents::Filesystem(t) if t == fs_type.name() => {}
            found => {
                return Err(HostdError::HoldsData {
                    device: fs_device.to_path_buf(),
                    found: found.to_string(),
                });
            }
        }
        ensure_dir(staging)?;
        let mut flags = fs.mount_flags.clone();
        if fs_type == FsType::Xfs && !flags.iter().any(|f| f == "nouuid") {
            // Clones and snapshots share the XFS UUID; the Go driver mounts with nouuid too.
            flags.push("nouuid".into());
        }
        let t = Instant::now();
        mounts::mount_fs(fs_device, staging, fs_type.name(), &flags, read_only)?;
        timings.insert("mount".into(), ms(t));
        actions.push(format!("mounted {} at {}", fs_device.display(), staging.display()));
        Ok(actions)
    }

    fn stage_block(&self, device: &Path, staging: &Path) -> Result<Vec<String>, HostdError> {
        let file = staging.join(BLOCK_FILE);
        let table = mounts::table()?;
        let mm = device::majmin(device)?;
        if table.iter().any(|m| m.mount_point == file) {
            // A bound device node: the file now stats as that device.
            let bound = device::majmin(&file)?;
            if bound == mm {
                return Ok(vec!["already staged".into()]);
            }
            return Err(HostdError::StagedDifferently {
                path: file,
                what: "a bound device",
                detail: format!("device {bound} is bound there, the request is {} ({mm})", device.display()),
            });
        }
        device::verify_unused(device, &table, None)?;
        ensure_dir(staging)?;
        ensure_file(&file)?;
        mounts::bind(device, &file, false, &[])?;
        Ok(vec![format!("bound {} at {}", device.display(), file.display())])
    }

    pub fn unstage(&self, req: &pb::UnstageRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let staging = self.paths.check("staging_path", &req.staging_path)?;
        let file = staging.join(BLOCK_FILE);
        unmount_all(&file)?;
        if file.exists() {
            std::fs::remove_file(&file)
                .map_err(|e| HostdError::failed("removing", file.display(), e))?;
        }
        let source = mounts::at(&staging)?.map(|m| m.majmin);
        unmount_all(&staging)?;
        if let Some(mm) = source {
            blockdev::flush(&mm);
        }
        // Close the volume's mapping even if nothing was mounted (a crash
        // between unmount and close, or a surprise unplug).
        let name = luks::mapping_name(&req.volume_id);
        if luks::is_open(&name) {
            // A vanished disk leaves a mapping that only a forced close removes.
            let gone = !blockdev::backing_present(&name);
            luks::close(&name, gone)?;
        }
        Ok(())
    }

    pub fn publish(&self, req: &pb::PublishRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let staging = self.paths.check("staging_path", &req.staging_path)?;
        let target = self.paths.check("target_path", &req.target_path)?;
        let source = if req.block { staging.join(BLOCK_FILE) } else { staging.clone() };
        let table = mounts::table()?;
        let staged = table
            .iter()
            .rev()
            .find(|m| m.mount_point == source)
            .ok_or_else(|| HostdError::NotStaged(format!("{} (nothing mounted at {})", req.volume_id, source.display())))?;
        if let Some(m) = table.iter().rev().find(|m| m.mount_point == target) {
            // A bound device node is identified by what it stats as; a
            // filesystem by the device it is mounted from.
            let same = if req.block {
                device::majmin(&target).ok() == device::majmin(&source).ok()
            } else {
                m.majmin == staged.majmin
            };
            if same && m.read_only == req.read_only {
                return Ok(());
            }
            return Err(HostdError::StagedDifferently {
                path: target,
                what: "published",
                detail: format!(
                    "device {} mounted {} is there, the request is device {} {}",
                    m.majmin,
                    if m.read_only { "read-only" } else { "read-write" },
                    staged.majmin,
                    if req.read_only { "read-only" } else { "read-write" },
                ),
            });
        }
        // One read-write publication at a time (the spec's answer for a
        // second one is FAILED_PRECONDITION): another read-write mount of
        // the staged filesystem in a pod's directory is that publication.
        if req.single_writer && !req.read_only && !req.block {
            let pods = self.paths.root().join("pods");
            if let Some(other) = table
                .iter()
                .find(|m| m.majmin == staged.majmin && !m.read_only && m.mount_point != source && m.mount_point.starts_with(&pods))
            {
                return Err(HostdError::PublishedElsewhere { volume_id: req.volume_id.clone(), other: other.mount_point.clone() });
            }
        }
        if req.block {
            ensure_file(&target)?;
        } else {
            ensure_dir(&target)?;
        }
        mounts::bind(&source, &target, req.read_only, &req.mount_flags)
    }

    pub fn unpublish(&self, req: &pb::UnpublishRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let target = self.paths.check("target_path", &req.target_path)?;
        unmount_all(&target)?;
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => std::fs::remove_dir(&target),
            Ok(_) => std::fs::remove_file(&target),
            Err(_) => Ok(()),
        }
        .map_err(|e| HostdError::failed("removing", target.display(), e))
    }
}

/// Whether the block device `name` (e.g. `dm-0`) is mounted anywhere.
fn device_has_mount(table: &[mounts::MountEntry], name: &str) -> bool {
    let dev = std::fs::read_to_string(Path::new("/sys/class/block").join(name).join("dev")).unwrap_or_default();
    table.iter().any(|m| m.majmin == dev.trim())
}

/// Unmounts every mount stacked at `path`.
fn unmount_all(path: &PathBuf) -> Result<(), HostdError> {
    while mounts::at(path)?.is_some() {
        mounts::unmount(path)?;
    }
    Ok(())
}

fn ensure_dir(p: &Path) -> Result<(), HostdError> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
        Err(e) => Err(HostdError::failed("creating directory", p.display(), e)),
    }
}

fn ensure_file(p: &Path) -> Result<(), HostdError> {
    if p.is_file() {
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p)
        .map(drop)
        .map_err(|e| HostdError::failed("creating file", p.display(), e))
}

/// What is mounted or bound at a volume path, resolved to block devices.
#[derive(Debug)]
struct Staged {
    entry: mounts::MountEntry,
    /// Kernel name of the device the filesystem (or bind) sits on.
    name: String,
    /// For a dm-crypt mapping, its name and the disk underneath.
    mapping: Option<(String, String)>,
}

fn staged_at(path: &Path, block: bool) -> Result<Option<Staged>, HostdError> {
    let Some(entry) = mounts::at(path)? else { return Ok(None) };
    let majmin = if block { device::majmin(path)? } else { entry.majmin.clone() };
    let Some(name) = blockdev::name_of(&majmin) else {
        return Ok(Some(Staged { entry, name: String::new(), mapping: None }));
    };
    let mapping = std::fs::read_to_string(Path::new("/sys/class/block").join(&name).join("dm/name"))
        .ok()
        .map(|n| n.trim().to_string())
        .and_then(|dm| blockdev::slaves(&name).into_iter().next().map(|disk| (dm, disk)));
    Ok(Some(Staged { entry, name, mapping }))
}

impl Volumes {
    /// Grows the volume to its disk's size: rescans the disk if it is still
    /// smaller than asked, resizes the LUKS mapping, then the filesystem.
    pub async fn expand(&self, req: &pb::ExpandRequest) -> Result<pb::ExpandResponse, HostdError> {
        check_volume_id(&req.volume_id)?;
        // A path that does not exist holds no volume (the spec's NOT_FOUND,
        // which the node plugin makes of NotStaged).
        if !req.volume_path.is_empty() && std::fs::symlink_metadata(&req.volume_path).is_err() {
            return Err(HostdError::NotStaged(format!("{} (no such path {})", req.volume_id, req.volume_path)));
        }
        let path = self.paths.check("volume_path", &req.volume_path)?;
        let block = path.is_file();
        let staged = staged_at(&path, block)?
            .ok_or_else(|| HostdError::NotStaged(format!("{} (nothing mounted at {})", req.volume_id, path.display())))?;
        let disk = staged.mapping.as_ref().map(|(_, d)| d.clone()).unwrap_or_else(|| staged.name.clone());
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
        if let Some((mapping, _)) = &staged.mapping {
            let pass = req
                .encryption
                .as_ref()
                .filter(|e| !e.passphrase.is_empty())
                .map(|e| Secret::new(e.passphrase.clone()));
            luks::resize(mapping, pass.as_ref())?;
        }
        if !block {
            grow_filesystem(&staged.entry).await?;
        }
        Ok(pb::ExpandResponse {
            size_bytes: blockdev::size_of(&staged.name).unwrap_or(disk_size),
        })
    }

    pub fn stats(&self, req: &pb::StatsRequest) -> Result<pb::StatsResponse, HostdError> {
        check_volume_id(&req.volume_id)?;
        // A path that does not exist holds no volume (the spec's NOT_FOUND,
        // which the node plugin makes of NotStaged).
        if !req.volume_path.is_empty() && std::fs::symlink_metadata(&req.volume_path).is_err() {
            return Err(HostdError::NotStaged(format!("{} (no such path {})", req.volume_id, req.volume_path)));
        }
        let path = self.paths.check("volume_path", &req.volume_path)?;
        let block = path.is_file();
        let Some(staged) = staged_at(&path, block)? else {
            return Err(HostdError::NotStaged(format!("{} (nothing mounted at {})", req.volume_id, path.display())));
        };
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
            match nix::sys::statvfs::statvfs(&path) {
                Ok(v) => {
                    let frag = v.fragment_size();
                    resp.total_bytes = v.blocks() * frag;
                    resp.available_bytes = v.blocks_available() * frag;
                    resp.used_bytes = (v.blocks() - v.blocks_free()) * frag;
                    resp.total_inodes = v.files();
                    resp.available_inodes = v.files_available();
                    resp.used_inodes = v.files() - v.files_free();
                }
                Err(e) => problems.push(format!("the filesystem does not answer ({e}); it may have shut down")),
            }
            if staged.entry.super_read_only && !staged.entry.read_only {
                problems.push("the filesystem was remounted read-only after errors".into());
            }
        }
        resp.condition = Some(pb::VolumeCondition {
            abnormal: !problems.is_empty(),
            message: if problems.is_empty() { "volume is healthy".into() } else { problems.join("; ") },
        });
        Ok(resp)
    }
}

async fn grow_filesystem(m: &mounts::MountEntry) -> Result<(), HostdError> {
    let (tool, arg) = match m.fs_type.as_str() {
        "ext4" | "ext3" | "ext2" => ("resize2fs", m.source.clone()),
        "xfs" => ("xfs_growfs", m.mount_point.display().to_string()),
        other => {
            return Err(HostdError::Unsupported(format!("growing a {other} filesystem is not supported")));
        }
    };
    let mut cmd = std::process::Command::new(tool);
    cmd.arg(&arg);
    let out = crate::tool::run(cmd, tool).await?;
    if !out.status.success() {
        return Err(HostdError::failed(
            "growing the filesystem on",
            &arg,
            format!("{tool}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        ));
    }
    Ok(())
}
