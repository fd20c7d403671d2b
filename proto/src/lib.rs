//! Wire definitions: CSI v1.12 (`csi::v1`) and the hostd local API (`hostd::v1`).

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

pub mod hostd {
    pub mod v1 {
        tonic::include_proto!("hostd.v1");
    }
}

/// Debug for the messages that carry secrets (build.rs `REDACTED`): the
/// message's name only, so a `{:?}` anywhere can never print a secret.
mod redacted {
    macro_rules! redacted {
        ($($t:path),* $(,)?) => {$(
            impl std::fmt::Debug for $t {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(concat!(stringify!($t), " { <redacted: carries secrets> }"))
                }
            }
        )*};
    }
    use crate::csi::v1::*;
    redacted!(
        CreateVolumeRequest,
        DeleteVolumeRequest,
        ControllerPublishVolumeRequest,
        ControllerUnpublishVolumeRequest,
        ValidateVolumeCapabilitiesRequest,
        ControllerModifyVolumeRequest,
        CreateSnapshotRequest,
        DeleteSnapshotRequest,
        ListSnapshotsRequest,
        GetSnapshotRequest,
        ControllerExpandVolumeRequest,
        NodeStageVolumeRequest,
        NodePublishVolumeRequest,
        NodeExpandVolumeRequest,
        CreateVolumeGroupSnapshotRequest,
        DeleteVolumeGroupSnapshotRequest,
        GetVolumeGroupSnapshotRequest,
        GetMetadataAllocatedRequest,
        GetMetadataDeltaRequest,
        crate::hostd::v1::Encryption,
    );
}

/// Path of our own `csi.proto`, for tests that inspect the source.
pub const CSI_PROTO_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto/csi.proto");

/// What the driver as a whole offers. The controller and the node plugin
/// are one CSI plugin deployed in two parts, and both report this list
/// (as the Go driver does), so a CO or a conformance suite asking either
/// part (kubernetes-csi/csi-test pkg/sanity asks both) sees the same plugin.
pub mod plugin {
    use crate::csi::v1 as csi;
    use csi::plugin_capability::{self, service, volume_expansion};

    pub fn capabilities() -> Vec<csi::PluginCapability> {
        let service = |t: service::Type| csi::PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        vec![
            service(service::Type::ControllerService),
            service(service::Type::VolumeAccessibilityConstraints),
            csi::PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(
                    plugin_capability::VolumeExpansion {
                        r#type: volume_expansion::Type::Online as i32,
                    },
                )),
            },
        ]
    }
}
