//! What the host holds, for Health and metrics: staged volumes and the
//! SCSI disks that are not CSI volumes.

use super::*;

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
}
