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
//!
//! One file per operation (`stage`, with `block`, `filesystem` and
//! `encrypted`; `unstage`, `publish`, `expand`, `stats`), `inventory` for
//! Health, `gocompat` for the Go driver's volumes. The decisions (what to
//! refuse, format, close) read the host through `host::Host`, so that
//! `tests` runs them on a `fake` host, without root.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxmox_csi_common::Secret;
use proxmox_csi_common::contract::{self, BlankFor};
use proxmox_csi_proto::hostd::v1 as pb;

use crate::bindings::{self, Binding, Bindings, DiskId, Tie};
use crate::blockdev::{self, BlockDevices};
use crate::claim::{self, Claim};
use crate::device::{self, Resolver, Wwn};
use crate::discovery::{self, DeviceIndex};
use crate::error::HostdError;
use crate::grow;
use crate::host::{Host, System};
use crate::kdf;
use crate::luks::{self, Crypt};
use crate::mkfs::{self, FsType, MkfsOptions};
use crate::mountopts;
use crate::mounts;
use crate::paths::{Kind, KubeletPaths, Layout, Place};
use crate::probe::{self, Contents, Probe};

mod block;
mod encrypted;
mod expand;
#[cfg(test)]
mod fake;
mod filesystem;
mod gocompat;
mod inventory;
mod publish;
mod stage;
mod stats;
#[cfg(test)]
mod swapped;
#[cfg(test)]
mod tests;
mod unstage;

pub use stage::StageWork;

/// File inside a raw block volume's staging directory onto which the device
/// node is bound, so publish can bind it again without naming a device. It
/// lives in kubelet's block staging directory, never in a filesystem.
const BLOCK_FILE: &str = "device";

/// The host the operations act on; unit tests give the decisions a fake.
const HOST: System = System;

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

/// Milliseconds since `since`, rounded to the nearest: phases are summed
/// against the whole call, and truncating each would lose half a
/// millisecond per phase to the untimed rest.
fn ms(since: Instant) -> u64 {
    u64::try_from((since.elapsed().as_micros() + 500) / 1000).unwrap_or(u64::MAX)
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
            Tie::Other(source) => Err(HostdError::KubeletSaysOther {
                field,
                path: place.path.clone(),
                volume_id: volume_id.to_string(),
                source,
            }),
            Tie::Ours | Tie::Unrecorded => Ok(()),
        }
    }

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
}

/// A disk holding a LUKS volume is never handed to a pod as a plain disk:
/// its first writes would destroy the header. Only a stage with the
/// volume's passphrase opens it.
fn refuse_luks_as_plain(host: &impl Probe, device: &Path) -> Result<(), HostdError> {
    if host.probe(device)? == Contents::Filesystem("crypto_LUKS".into()) {
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

/// Refuses `device` if any of its first `len` bytes is not zero.
fn refuse_data_in(host: &impl Probe, device: &Path, len: u64) -> Result<(), HostdError> {
    if let Some(at) = host.first_data_in(device, len)? {
        return Err(HostdError::HoldsData {
            device: device.to_path_buf(),
            found: format!("no signature, but data at byte {at}"),
        });
    }
    Ok(())
}

/// A blank disk is formatted only if none of the bytes hostd samples holds data.
fn refuse_data(host: &impl Probe, device: &Path) -> Result<(), HostdError> {
    if let Some(at) = host.first_data(device)? {
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

/// Where the devices `majmins` are mounted or bound, other than at
/// `except` (the staging path itself): the volume's publications.
fn publications(
    host: &impl BlockDevices,
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
                host.majmin(&m.mount_point)
                    .is_ok_and(|mm| majmins.contains(&mm))
            } else {
                majmins.contains(&m.majmin)
            }
        })
        .map(|m| m.mount_point.clone())
        .collect()
}

/// Whether the block device `name` (e.g. `dm-0`) is mounted anywhere, or
/// its node bound anywhere (a raw block publication shows as devtmpfs).
fn device_has_mount(host: &impl BlockDevices, table: &[mounts::MountEntry], name: &str) -> bool {
    let majmins: Vec<String> = host.majmin_of(name).into_iter().collect();
    !publications(host, table, &majmins, &[]).is_empty()
}

/// Unmounts every mount stacked at `place`, through its parent's descriptor.
fn unmount_all(place: &Place) -> Result<(), HostdError> {
    while mounts::at(&place.path)?.is_some() {
        mounts::unmount(&place.via_parent())
            .map_err(|e| HostdError::lib("unmounting", place.path.display(), e))?;
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
