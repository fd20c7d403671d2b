//! Stage, unstage, publish and unpublish: the operations on one volume.
//!
//! Every operation is idempotent: it first looks at what is already there
//! and answers OK when that is what was asked, or an error naming the
//! difference.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proxmox_csi_proto::hostd::v1 as pb;

use crate::device::{self, Resolver, Wwn};
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

fn device_size(device: &Path) -> u64 {
    let Some(name) = device.file_name() else { return 0 };
    std::fs::read_to_string(Path::new("/sys/class/block").join(name).join("size"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|sectors| sectors * 512)
        .unwrap_or(0)
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
        if req.encryption.is_some() {
            return Err(HostdError::Unsupported(
                "encryption: LUKS staging is not available in this build of hostd".into(),
            ));
        }
        let access = req
            .access
            .as_ref()
            .ok_or_else(|| HostdError::invalid("access", "filesystem or block is required"))?;
        let key = self.resolver.key(&wwn);
        let index = &self.index;
        let device = index
            .wait_for(&key, self.device_wait, RESCAN_GRACE, || discovery::rescan_scsi(index))
            .await
            .ok_or_else(|| HostdError::DeviceNotFound {
                wwn: wwn.to_string(),
                reason: format!("no block device with {key} within {:?}", self.device_wait),
            })?;
        self.resolver.verify_identity(&device, &wwn, &dev.serial)?;
        match access {
            pb::stage_request::Access::Filesystem(fs) => {
                self.stage_filesystem(&device, &staging, fs, req.read_only).await
            }
            pb::stage_request::Access::Block(_) => self.stage_block(&device, &staging),
        }
        .map(|actions| pb::StageResponse {
            actions,
            size_bytes: device_size(&device),
        })
    }

    async fn stage_filesystem(
        &self,
        device: &Path,
        staging: &Path,
        fs: &pb::Filesystem,
        read_only: bool,
    ) -> Result<Vec<String>, HostdError> {
        let fs_type = FsType::parse(&fs.fs_type)?;
        let opts = MkfsOptions {
            block_size: fs.block_size,
            inode_size: fs.inode_size,
        };
        mkfs::validate(opts)?;
        let table = mounts::table()?;
        if let Some(m) = table.iter().rev().find(|m| m.mount_point == staging) {
            let mm = device::majmin(device)?;
            if m.majmin == mm && m.fs_type == fs_type.name() {
                return Ok(vec!["already staged".into()]);
            }
            return Err(HostdError::StagedDifferently {
                path: staging.to_path_buf(),
                what: "a mount point",
                detail: format!(
                    "{} ({}) is mounted there, the request is {} ({})",
                    m.source,
                    m.fs_type,
                    device.display(),
                    fs_type.name()
                ),
            });
        }
        device::verify_unused(device, &table, &[])?;
        let mut actions = Vec::new();
        match probe::probe(device)? {
            Contents::Blank => {
                mkfs::run(fs_type, device, opts).await?;
                actions.push(format!("mkfs {}", fs_type.name()));
            }
            Contents::Filesystem(t) if t == fs_type.name() => {}
            found => {
                return Err(HostdError::HoldsData {
                    device: device.to_path_buf(),
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
        mounts::mount_fs(device, staging, fs_type.name(), &flags, read_only)?;
        actions.push(format!("mounted {} at {}", device.display(), staging.display()));
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
        device::verify_unused(device, &table, &[])?;
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
        unmount_all(&staging)
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
