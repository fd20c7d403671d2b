//! kubelet's CSI volume plugin (kubernetes/kubernetes pkg/volume/csi:
//! csi_attacher.go MountDevice/UnmountDevice and makeDeviceMountPath,
//! csi_mounter.go SetUpAt/TearDownAt and GetPath, csi_block.go
//! GetStagingPath/getPublishPath, csi_client.go for each request's fields,
//! expander.go, csi_metrics.go). Only the requests are built here; the
//! directories kubelet makes before a call are named by `*_dirs`, for the
//! test to create as kubelet would.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::{AccessMode, PersistentVolume, VolumeMode, capability, csi, csi_access_mode};

/// kubelet's root directory on the node (`--root-dir`, /var/lib/kubelet).
#[derive(Debug, Clone)]
pub struct Kubelet {
    pub root: String,
}

/// A pod using a volume.
#[derive(Debug, Clone)]
pub struct Pod {
    pub uid: String,
    /// `spec.volumes[].persistentVolumeClaim.readOnly`.
    pub read_only: bool,
}

impl Pod {
    pub fn new(uid: &str) -> Self {
        Self {
            uid: uid.into(),
            read_only: false,
        }
    }
}

impl Kubelet {
    pub fn new(root: &str) -> Self {
        Self {
            root: root.trim_end_matches('/').to_string(),
        }
    }

    /// Filesystem staging: `plugins/kubernetes.io/csi/<driver>/<sha256 hex
    /// of the volume handle>/globalmount` (makeDeviceMountPath). Block:
    /// `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>` (GetStagingPath).
    pub fn staging_path(&self, pv: &PersistentVolume) -> String {
        match pv.volume_mode {
            VolumeMode::Filesystem => {
                let hash = Sha256::digest(pv.handle.as_bytes())
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>();
                format!(
                    "{}/plugins/kubernetes.io/csi/{}/{hash}/globalmount",
                    self.root, pv.driver
                )
            }
            VolumeMode::Block => format!(
                "{}/plugins/kubernetes.io/csi/volumeDevices/staging/{}",
                self.root, pv.name
            ),
        }
    }

    /// Filesystem: `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`
    /// (GetPath). Block: `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>`
    /// (getPublishPath), a file the driver makes.
    pub fn target_path(&self, pod: &Pod, pv: &PersistentVolume) -> String {
        match pv.volume_mode {
            VolumeMode::Filesystem => format!(
                "{}/pods/{}/volumes/kubernetes.io~csi/{}/mount",
                self.root, pod.uid, pv.name
            ),
            VolumeMode::Block => format!(
                "{}/plugins/kubernetes.io/csi/volumeDevices/publish/{}/{}",
                self.root, pv.name, pod.uid
            ),
        }
    }

    /// The `vol_data.json` kubelet saves for teardown before it publishes
    /// (pkg/volume/csi/csi_plugin.go NewMounter, NewBlockVolumeMapper:
    /// saveVolumeData): its path (the pod's volume directory; for block
    /// `plugins/kubernetes.io/csi/volumeDevices/<pv>/data`) and contents.
    /// `attachmentID` is getAttachmentName: `csi-` and the sha256 of handle,
    /// driver and node name.
    pub fn vol_data(&self, pod: &Pod, pv: &PersistentVolume, node: &str) -> (String, String) {
        let dir = match pv.volume_mode {
            VolumeMode::Filesystem => format!(
                "{}/pods/{}/volumes/kubernetes.io~csi/{}",
                self.root, pod.uid, pv.name
            ),
            VolumeMode::Block => format!(
                "{}/plugins/kubernetes.io/csi/volumeDevices/{}/data",
                self.root, pv.name
            ),
        };
        let attachment = Sha256::digest(format!("{}{}{node}", pv.handle, pv.driver).as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        let mut data = serde_json::json!({
            "specVolumeID": pv.name,
            "volumeHandle": pv.handle,
            "driverName": pv.driver,
            "nodeName": node,
            "attachmentID": format!("csi-{attachment}"),
        });
        if pv.volume_mode == VolumeMode::Filesystem {
            data["volumeLifecycleMode"] = "Persistent".into();
        }
        (format!("{dir}/vol_data.json"), data.to_string())
    }

    /// What kubelet makes before NodeStageVolume: the staging directory
    /// itself (MkdirAllWithPathCheck of globalmount; MkdirAll of the block
    /// staging path).
    pub fn stage_dirs(&self, pv: &PersistentVolume) -> Vec<String> {
        vec![self.staging_path(pv)]
    }

    /// What kubelet makes before NodePublishVolume: only the target's parent
    /// (the driver makes `mount`, or the block target file).
    pub fn publish_dirs(&self, pod: &Pod, pv: &PersistentVolume) -> Vec<String> {
        let target = self.target_path(pod, pv);
        vec![
            target
                .rsplit_once('/')
                .map(|(parent, _)| parent.to_string())
                .unwrap_or(target),
        ]
    }

    /// The capability kubelet sends: only the PV's first access mode,
    /// mapped with the node's SINGLE_NODE_MULTI_WRITER capability; fsType
    /// and mount options from the PV, no default.
    fn capability(pv: &PersistentVolume) -> csi::VolumeCapability {
        let first = pv
            .access_modes
            .first()
            .copied()
            .unwrap_or(AccessMode::ReadWriteOnce);
        capability(
            csi_access_mode(&[first], crate::SNMW),
            pv.volume_mode,
            &pv.fs_type,
            &pv.mount_options,
        )
    }

    /// NodeStageVolumeRequest: the VolumeAttachment's attachmentMetadata
    /// (the publish context), the PV's volumeAttributes, no pod info.
    pub fn node_stage(
        &self,
        pv: &PersistentVolume,
        publish_context: &HashMap<String, String>,
        secrets: HashMap<String, String>,
    ) -> csi::NodeStageVolumeRequest {
        csi::NodeStageVolumeRequest {
            volume_id: pv.handle.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: self.staging_path(pv),
            volume_capability: Some(Self::capability(pv)),
            secrets,
            volume_context: pv.attributes.clone(),
        }
    }

    /// NodePublishVolumeRequest: `readonly` from the pod's claim reference
    /// (not the PV's `readOnly`), the staging path (always for block),
    /// the PV's volumeAttributes (the CSIDriver has no podInfoOnMount).
    pub fn node_publish(
        &self,
        pv: &PersistentVolume,
        pod: &Pod,
        publish_context: &HashMap<String, String>,
    ) -> csi::NodePublishVolumeRequest {
        csi::NodePublishVolumeRequest {
            volume_id: pv.handle.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: self.staging_path(pv),
            target_path: self.target_path(pod, pv),
            volume_capability: Some(Self::capability(pv)),
            readonly: pod.read_only,
            secrets: HashMap::new(),
            volume_context: pv.attributes.clone(),
        }
    }

    /// NodeUnpublishVolumeRequest (TearDownAt; UnmapPodDevice for block),
    /// sent before NodeUnstageVolume.
    pub fn node_unpublish(
        &self,
        pv: &PersistentVolume,
        pod: &Pod,
    ) -> csi::NodeUnpublishVolumeRequest {
        csi::NodeUnpublishVolumeRequest {
            volume_id: pv.handle.clone(),
            target_path: self.target_path(pod, pv),
        }
    }

    /// NodeUnstageVolumeRequest (UnmountDevice; TearDownDevice for block).
    pub fn node_unstage(&self, pv: &PersistentVolume) -> csi::NodeUnstageVolumeRequest {
        csi::NodeUnstageVolumeRequest {
            volume_id: pv.handle.clone(),
            staging_target_path: self.staging_path(pv),
        }
    }

    /// NodeExpandVolumeRequest after the controller grew the disk: the pod's
    /// target as `volume_path`, the staging path beside it, the new size as
    /// `required_bytes`, a capability built as for NodeStage, and the
    /// Secret the StorageClass names in `csi.storage.k8s.io/node-expand-secret-name`
    /// (empty without one; a LUKS volume needs its passphrase here).
    pub fn node_expand(
        &self,
        pv: &PersistentVolume,
        pod: &Pod,
        new_bytes: i64,
        secrets: HashMap<String, String>,
    ) -> csi::NodeExpandVolumeRequest {
        csi::NodeExpandVolumeRequest {
            volume_id: pv.handle.clone(),
            volume_path: self.target_path(pod, pv),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: new_bytes,
                limit_bytes: 0,
            }),
            staging_target_path: self.staging_path(pv),
            volume_capability: Some(Self::capability(pv)),
            secrets,
        }
    }

    /// NodeGetVolumeStatsRequest: the pod's target path, no staging path.
    pub fn node_stats(&self, pv: &PersistentVolume, pod: &Pod) -> csi::NodeGetVolumeStatsRequest {
        csi::NodeGetVolumeStatsRequest {
            volume_id: pv.handle.clone(),
            volume_path: self.target_path(pod, pv),
            staging_target_path: String::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_kubelets_layouts() {
        let pv = PersistentVolume {
            name: "pvc-1".into(),
            driver: crate::DRIVER.into(),
            handle: "region-1/pve2/local-lvm/vm-9999-pvc-1".into(),
            fs_type: "ext4".into(),
            attributes: HashMap::new(),
            read_only: false,
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: vec![],
            volume_mode: VolumeMode::Filesystem,
            capacity_bytes: 1 << 30,
        };
        let k = Kubelet::new("/var/lib/kubelet/");
        let staging = k.staging_path(&pv);
        let hash = staging.split('/').nth(8).unwrap();
        assert_eq!(hash.len(), 64);
        assert_eq!(
            staging,
            format!(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/{hash}/globalmount"
            )
        );
        let pod = Pod::new("uid-1");
        assert_eq!(
            k.target_path(&pod, &pv),
            "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount"
        );
        assert_eq!(
            k.publish_dirs(&pod, &pv),
            ["/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1"]
        );
        let block = PersistentVolume {
            volume_mode: VolumeMode::Block,
            ..pv
        };
        assert_eq!(
            k.staging_path(&block),
            "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1"
        );
        assert_eq!(
            k.target_path(&pod, &block),
            "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/uid-1"
        );
    }
}
