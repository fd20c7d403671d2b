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
use crate::paths::Layout;

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
                .map_err(|e| HostdError::failed("reading the record", path.display(), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HostdError::failed("reading the record", path.display(), e)),
        }
    }

    /// The record of the volume staged at `staging`, whichever it is.
    pub fn staged_at(&self, staging: &Path) -> Result<Option<Binding>, HostdError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| HostdError::failed("listing", self.dir.display(), e))?;
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
            .map_err(|e| HostdError::failed("writing the record", path.display(), e))?;
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| HostdError::failed("writing the record", path.display(), e))
    }

    fn intent(&self, volume_id: &str) -> PathBuf {
        self.dir
            .join(format!("{}.mkfs", crate::luks::mapping_name(volume_id)))
    }

    /// Notes, before mkfs starts, that hostd is formatting `majmin` for
    /// `volume_id`. mkfs writes its superblock last (e2fsprogs misc/mke2fs.c
    /// `main`: the superblock goes out in `ext2fs_close_free`): killed before that, it
    /// leaves data without a signature, which a stage must otherwise never
    /// format. The note tells the retry that this data is hostd's own.
    pub fn begin_mkfs(&self, volume_id: &str, majmin: &str) -> Result<(), HostdError> {
        let path = self.intent(volume_id);
        std::fs::write(&path, majmin)
            .map_err(|e| HostdError::failed("writing the record", path.display(), e))
    }

    /// Whether an earlier stage of `volume_id` began a mkfs on `majmin` that
    /// never finished.
    pub fn mkfs_begun(&self, volume_id: &str, majmin: &str) -> bool {
        std::fs::read_to_string(self.intent(volume_id)).is_ok_and(|m| m == majmin)
    }

    pub fn end_mkfs(&self, volume_id: &str) -> Result<(), HostdError> {
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
        Err(e) => Err(HostdError::failed("removing the record", path.display(), e)),
    }
}

/// Whether kubelet's own structure ties `path` (of `layout`) to `volume_id`
/// of `driver`: the staging directory's hash, or `vol_data.json`.
pub fn kubelet_says(path: &Path, layout: Layout, volume_id: &str, driver: &str) -> bool {
    let hex = |s: &str| {
        Sha256::digest(s.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let vol_data = match layout {
        Layout::FsStaging => {
            return path
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                == Some(hex(volume_id).as_str());
        }
        // pods/<uid>/volumes/kubernetes.io~csi/<pv>/vol_data.json
        Layout::FsTarget => path.parent().map(|p| p.join("vol_data.json")),
        // plugins/kubernetes.io/csi/volumeDevices/<pv>/data/vol_data.json
        Layout::BlockStaging | Layout::BlockTarget | Layout::BlockMap => {
            block_pv_dir(path, layout).map(|d| d.join("data/vol_data.json"))
        }
    };
    #[derive(Deserialize)]
    struct VolData {
        #[serde(rename = "volumeHandle")]
        volume_handle: String,
        #[serde(rename = "driverName")]
        driver_name: String,
    }
    vol_data
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<VolData>(&b).ok())
        .is_some_and(|d| d.volume_handle == volume_id && d.driver_name == driver)
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
        // An mkfs begun and never ended is found again, for its device only.
        again.begin_mkfs("v1", "7:3").unwrap();
        assert!(
            again.mkfs_begun("v1", "7:3")
                && !again.mkfs_begun("v1", "7:4")
                && !again.mkfs_begun("v2", "7:3")
        );
        again.end_mkfs("v1").unwrap();
        assert!(!again.mkfs_begun("v1", "7:3"));
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
}
