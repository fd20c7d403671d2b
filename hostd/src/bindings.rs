//! Which volume is staged where, and where it is published: hostd's own
//! record, so that Publish, Unpublish, Unstage and Expand act only on what
//! that same volume staged or published.
//!
//! One JSON file per volume under the state directory (a tmpfs under /run:
//! it lives as long as the mounts it describes, through hostd restarts, and
//! is gone after a reboot together with them). Written with a rename, so a
//! crash leaves the old record or the new one.
//!
//! A path without a record still belongs to a volume when kubelet's own
//! structure says so: the staging directory's name is the SHA-256 of the
//! volume id (csi_attacher.go `makeDeviceMountPath`), and kubelet writes the
//! volume id into `vol_data.json` beside targets and block volumes
//! (csi_mounter.go `SetUpAt`, csi_plugin.go `NewBlockVolumeMapper`); or when
//! the device says so (see [`device_is_volumes`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::HostdError;
pub use crate::error::NotOurs;
use crate::paths::{Layout, VOL_DATA};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub volume_id: String,
    pub staging_path: PathBuf,
    pub block: bool,
    /// `major:minor` of what Stage mounted or bound (the disk, or its mapping).
    pub majmin: String,
    pub targets: Vec<PathBuf>,
}

#[derive(Debug)]
pub struct Bindings {
    dir: PathBuf,
}

impl Bindings {
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn file(&self, volume_id: &str) -> PathBuf {
        self.dir
            .join(format!("{}.json", crate::luks::mapping_name(volume_id)))
    }

    pub fn get(&self, volume_id: &str) -> Result<Option<Binding>, HostdError> {
        let path = self.file(volume_id);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice::<Binding>(&b)
                .map(Some)
                .map_err(|e| HostdError::lib("reading the record", path.display(), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HostdError::io("reading the record", path.display(), e)),
        }
    }

    /// The record of the volume staged at `staging`, whichever it is.
    pub fn staged_at(&self, staging: &Path) -> Result<Option<Binding>, HostdError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| HostdError::io("listing", self.dir.display(), e))?;
        for e in entries.flatten() {
            if let Ok(b) = std::fs::read(e.path())
                && let Ok(b) = serde_json::from_slice::<Binding>(&b)
                && b.staging_path == staging
            {
                return Ok(Some(b));
            }
        }
        Ok(None)
    }

    pub fn put(&self, b: &Binding) -> Result<(), HostdError> {
        let path = self.file(&b.volume_id);
        let tmp = path.with_extension("tmp");
        let bytes = serde_json::to_vec(b)
            .map_err(|e| HostdError::lib("writing the record", path.display(), e))?;
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| HostdError::io("writing the record", path.display(), e))
    }

    fn intent(&self, volume_id: &str) -> PathBuf {
        self.dir
            .join(format!("{}.mkfs", crate::luks::mapping_name(volume_id)))
    }

    /// Notes, before hostd writes the first byte of a new volume (its LUKS
    /// header, or its filesystem), that it is formatting `disk` for
    /// `volume_id`. mkfs writes its superblock last (e2fsprogs misc/mke2fs.c
    /// `main`: the superblock goes out in `ext2fs_close_free`), and a
    /// luksFormat is followed by the open and the mkfs: killed in between,
    /// they leave data without a signature, which a stage must otherwise
    /// never format. The note tells the retry that this data is hostd's own.
    /// It names the disk by [`DiskId`], which no later disk can share.
    pub fn begin_format(&self, volume_id: &str, disk: &DiskId) -> Result<(), HostdError> {
        let path = self.intent(volume_id);
        std::fs::write(&path, disk.0.as_bytes())
            .map_err(|e| HostdError::io("writing the record", path.display(), e))
    }

    /// Whether an earlier stage of `volume_id` began formatting this very
    /// `disk` and never finished.
    pub fn format_begun(&self, volume_id: &str, disk: &DiskId) -> bool {
        std::fs::read_to_string(self.intent(volume_id)).is_ok_and(|m| m == disk.0)
    }

    pub fn end_format(&self, volume_id: &str) -> Result<(), HostdError> {
        remove_file(&self.intent(volume_id))
    }

    pub fn remove(&self, volume_id: &str) -> Result<(), HostdError> {
        remove_file(&self.file(volume_id))
    }
}

/// Removes one of hostd's own files; one already gone is fine.
fn remove_file(path: &Path) -> Result<(), HostdError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HostdError::io("removing the record", path.display(), e)),
    }
}

/// One disk attachment, as the kernel numbers it: `major:minor` and the
/// disk sequence number (`/sys/block/<name>/diskseq`, Linux 5.15), which
/// the kernel never gives twice until a reboot, whereas a device number is
/// reused by the next disk. Where the kernel has no diskseq, the device
/// number alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskId(String);

impl DiskId {
    pub fn of(device: &Path) -> Result<Self, HostdError> {
        let majmin = crate::device::majmin(device)?;
        let seq = crate::blockdev::name_of(&majmin)
            .and_then(|n| {
                std::fs::read_to_string(Path::new("/sys/block").join(n).join("diskseq")).ok()
            })
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Ok(Self(format!("{majmin} {seq}")))
    }
}

/// What kubelet's own files say of a path.
#[derive(Debug)]
pub enum Tie {
    /// kubelet's record names this volume of this driver.
    Ours,
    /// No record where kubelet writes one: a caller that is not kubelet
    /// (kubernetes-csi/csi-test's sanity suite makes bare directories).
    /// Nothing then ties the path to another volume either.
    Unrecorded,
    /// The record names another volume or driver, or cannot be read: the
    /// path is not this volume's.
    Other(NotOurs),
}

/// What kubelet's own structure says of `path` (of `layout`) and
/// `volume_id` of `driver`: the filesystem staging directory is named by
/// the SHA-256 of the volume handle (csi_attacher.go
/// `makeDeviceMountPath`); kubelet writes `vol_data.json` with the handle
/// and the driver beside a pod's target (csi_plugin.go `NewMounter`) and
/// under `volumeDevices/<pv>/data` for block volumes (`NewBlockVolumeMapper`)
/// before it calls the driver.
pub fn kubelet_tie(path: &Path, layout: Layout, volume_id: &str, driver: &str) -> Tie {
    let vol_data = match layout {
        Layout::FsStaging => {
            let named = path
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str());
            return if named == Some(sha256_hex(volume_id).as_str()) {
                Tie::Ours
            } else {
                Tie::Other(NotOurs::StagingName {
                    volume_id: volume_id.to_string(),
                    sha256: sha256_hex(volume_id),
                })
            };
        }
        // pods/<uid>/volumes/kubernetes.io~csi/<pv>/vol_data.json
        Layout::FsTarget => path.parent().map(|p| p.join(VOL_DATA)),
        // plugins/kubernetes.io/csi/volumeDevices/<pv>/data/vol_data.json
        Layout::BlockStaging | Layout::BlockTarget | Layout::BlockMap => {
            block_pv_dir(path, layout).map(|d| d.join("data").join(VOL_DATA))
        }
    };
    let Some(file) = vol_data else {
        return Tie::Other(NotOurs::NoKubeletDir);
    };
    #[derive(Deserialize)]
    struct VolData {
        #[serde(rename = "volumeHandle")]
        volume_handle: String,
        #[serde(rename = "driverName")]
        driver_name: String,
    }
    let bytes = match std::fs::read(&file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Tie::Unrecorded,
        Err(source) => return Tie::Other(NotOurs::Unreadable { file, source }),
    };
    match serde_json::from_slice::<VolData>(&bytes) {
        Ok(d) if d.volume_handle == volume_id && d.driver_name == driver => Tie::Ours,
        Ok(d) => Tie::Other(NotOurs::Named {
            file,
            volume_id: d.volume_handle.into(),
            driver: d.driver_name.into(),
        }),
        Err(source) => Tie::Other(NotOurs::NotARecord { file, source }),
    }
}

/// Whether kubelet's own structure ties `path` to `volume_id` of `driver`.
pub fn kubelet_says(path: &Path, layout: Layout, volume_id: &str, driver: &str) -> bool {
    matches!(kubelet_tie(path, layout, volume_id, driver), Tie::Ours)
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `plugins/kubernetes.io/csi/volumeDevices/<pv>` for a block path.
fn block_pv_dir(path: &Path, layout: Layout) -> Option<PathBuf> {
    let (devices, pv) = match layout {
        // volumeDevices/staging/<pv>
        Layout::BlockStaging => (path.parent()?.parent()?, path.file_name()?),
        // volumeDevices/publish/<pv>/<pod>
        Layout::BlockTarget => (
            path.parent()?.parent()?.parent()?,
            path.parent()?.file_name()?,
        ),
        // volumeDevices/<pv>/dev/<pod>
        Layout::BlockMap => return path.parent()?.parent().map(Path::to_path_buf),
        _ => return None,
    };
    Some(devices.join(pv))
}

/// Whether the block device `majmin` provably is `volume_id`'s: its
/// dm-crypt mapping (named from the volume id), or a disk whose SCSI serial
/// is the one the controller derives from the volume id.
pub fn device_is_volumes(majmin: &str, volume_id: &str) -> bool {
    let Some(name) = crate::blockdev::name_of(majmin) else {
        return false;
    };
    let sys = Path::new("/sys/class/block").join(&name);
    if let Ok(dm) = std::fs::read_to_string(sys.join("dm/name")) {
        return dm.trim() == crate::luks::mapping_name(volume_id);
    }
    crate::device::serial_of(&name)
        .is_some_and(|s| s == proxmox_csi_common::contract::serial_for(volume_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_and_are_found_by_staging_path() {
        let dir = tempfile::tempdir().unwrap();
        let b = Bindings::open(&dir.path().join("volumes")).unwrap();
        assert_eq!(b.get("v1").unwrap(), None);
        let rec = Binding {
            volume_id: "v1".into(),
            staging_path: "/k/plugins/x/globalmount".into(),
            block: false,
            majmin: "7:3".into(),
            targets: vec![],
        };
        b.put(&rec).unwrap();
        let again = Bindings::open(&dir.path().join("volumes")).unwrap();
        assert_eq!(again.get("v1").unwrap(), Some(rec.clone()));
        assert_eq!(
            again
                .staged_at(Path::new("/k/plugins/x/globalmount"))
                .unwrap(),
            Some(rec)
        );
        assert_eq!(
            again
                .staged_at(Path::new("/k/plugins/y/globalmount"))
                .unwrap(),
            None
        );
        again.remove("v1").unwrap();
        again.remove("v1").unwrap();
        // A format begun and never ended is found again, for its disk only:
        // the same device number with another disk sequence is another disk.
        let (d1, d1_later, d2) = (
            DiskId("7:3 41".into()),
            DiskId("7:3 42".into()),
            DiskId("7:4 43".into()),
        );
        again.begin_format("v1", &d1).unwrap();
        assert!(
            again.format_begun("v1", &d1)
                && !again.format_begun("v1", &d1_later)
                && !again.format_begun("v1", &d2)
                && !again.format_begun("v2", &d1)
        );
        again.end_format("v1").unwrap();
        assert!(!again.format_begun("v1", &d1));
        assert_eq!(
            again
                .staged_at(Path::new("/k/plugins/x/globalmount"))
                .unwrap(),
            None
        );
        assert_eq!(again.get("v1").unwrap(), None);
    }

    #[test]
    fn kubelets_structure_names_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let id = "region-1/pve2/local-lvm/vm-9999-pvc-1";
        let hash: String = Sha256::digest(id.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let staging = dir.path().join(format!("csi/drv/{hash}/globalmount"));
        assert!(kubelet_says(&staging, Layout::FsStaging, id, "drv"));
        assert!(!kubelet_says(&staging, Layout::FsStaging, "another", "drv"));
        let pv = dir.path().join("pods/u/volumes/kubernetes.io~csi/pv1");
        std::fs::create_dir_all(&pv).unwrap();
        let target = pv.join("mount");
        assert!(!kubelet_says(&target, Layout::FsTarget, id, "drv"));
        std::fs::write(
            pv.join("vol_data.json"),
            format!(r#"{{"volumeHandle":"{id}","driverName":"drv","specVolID":"pv1"}}"#),
        )
        .unwrap();
        assert!(kubelet_says(&target, Layout::FsTarget, id, "drv"));
        assert!(!kubelet_says(&target, Layout::FsTarget, id, "other.driver"));
        let devices = dir.path().join("volumeDevices");
        std::fs::create_dir_all(devices.join("pv1/data")).unwrap();
        std::fs::write(
            devices.join("pv1/data/vol_data.json"),
            format!(r#"{{"volumeHandle":"{id}","driverName":"drv"}}"#),
        )
        .unwrap();
        for (p, l) in [
            (devices.join("staging/pv1"), Layout::BlockStaging),
            (devices.join("publish/pv1/pod1"), Layout::BlockTarget),
            (devices.join("pv1/dev/pod1"), Layout::BlockMap),
        ] {
            assert!(kubelet_says(&p, l, id, "drv"), "{}", p.display());
            assert!(!kubelet_says(&p, l, "another", "drv"), "{}", p.display());
        }
    }

    /// A record that cannot be read or parsed keeps the error it failed on,
    /// and reads as it did when the reason was a string.
    #[test]
    fn a_record_that_fails_keeps_its_error() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let pv = dir.path().join("pods/u/volumes/kubernetes.io~csi/pv1");
        let file = pv.join("vol_data.json");
        let target = pv.join("mount");
        // A directory where the record goes: reading it is EISDIR.
        std::fs::create_dir_all(&file).unwrap();
        let io = std::fs::read(&file).unwrap_err();
        let Tie::Other(why) = kubelet_tie(&target, Layout::FsTarget, "v1", "drv") else {
            panic!("the record was read");
        };
        assert!(matches!(why, NotOurs::Unreadable { .. }), "{why:?}");
        let source = why
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(source.map(|e| e.kind()), Some(io.kind()));
        assert_eq!(
            crate::error::message(&why),
            format!("kubelet's {} cannot be read: {io}", file.display())
        );
        // Through HostdError, as a caller reads it, each level once.
        let e = HostdError::KubeletSaysOther {
            field: "target_path",
            path: target.clone(),
            volume_id: "v1".into(),
            source: why,
        };
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.source().is_some_and(|s| s.is::<NotOurs>()));
        assert_eq!(
            e.message(),
            format!(
                "target_path: {} is not volume v1's: kubelet's {} cannot be read: {io}",
                target.display(),
                file.display()
            )
        );

        std::fs::remove_dir(&file).unwrap();
        std::fs::write(&file, "{").unwrap();
        let json = serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
        let Tie::Other(why) = kubelet_tie(&target, Layout::FsTarget, "v1", "drv") else {
            panic!("the record was read");
        };
        assert!(
            why.source().is_some_and(|s| s.is::<serde_json::Error>()),
            "{why:?}"
        );
        assert_eq!(
            crate::error::message(&why),
            format!(
                "kubelet's {} is not a volume record: {json}",
                file.display()
            )
        );

        std::fs::write(&file, r#"{"volumeHandle":"v2","driverName":"drv"}"#).unwrap();
        let Tie::Other(why) = kubelet_tie(&target, Layout::FsTarget, "v1", "drv") else {
            panic!("the record was read");
        };
        assert!(why.source().is_none());
        assert_eq!(
            crate::error::message(&why),
            format!("kubelet's {} names volume v2 of driver drv", file.display())
        );
    }
}
