//! The node plugin's validation of NodeStage: no panic; an accepted request
//! has absolute paths under kubelet's root without `..`.
#![no_main]

use std::collections::HashMap;
use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use proxmox_csi_node::request::Rules;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::volume_capability::access_mode::Mode;
use proxmox_csi_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};

fuzz_target!(|input: (&str, &str, &str, &str, Vec<String>)| {
    let (volume_id, staging, fs_type, wwn, flags) = input;
    let rules = Rules {
        kubelet_root: PathBuf::from("/var/lib/kubelet"),
    };
    let req = csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        publish_context: HashMap::from([("wwn".to_string(), wwn.to_string())]),
        staging_target_path: staging.into(),
        volume_capability: Some(csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs_type.into(),
                mount_flags: flags,
                ..Default::default()
            })),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }),
        ..Default::default()
    };
    if let Ok(h) = rules.stage(&req) {
        let p = std::path::Path::new(&h.staging_path);
        assert!(
            p.is_absolute() && p.starts_with("/var/lib/kubelet"),
            "{staging:?}"
        );
        assert!(
            !p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir)),
            "{staging:?}"
        );
    }
});
