//! Generates the CSI and hostd bindings with protox, so no `protoc` binary is needed.

/// Messages that carry secrets (CSI `secrets` maps, hostd's passphrase).
const REDACTED: &[&str] = &[
    ".csi.v1.CreateVolumeRequest",
    ".csi.v1.DeleteVolumeRequest",
    ".csi.v1.ControllerPublishVolumeRequest",
    ".csi.v1.ControllerUnpublishVolumeRequest",
    ".csi.v1.ValidateVolumeCapabilitiesRequest",
    ".csi.v1.ControllerModifyVolumeRequest",
    ".csi.v1.CreateSnapshotRequest",
    ".csi.v1.DeleteSnapshotRequest",
    ".csi.v1.ListSnapshotsRequest",
    ".csi.v1.GetSnapshotRequest",
    ".csi.v1.ControllerExpandVolumeRequest",
    ".csi.v1.NodeStageVolumeRequest",
    ".csi.v1.NodePublishVolumeRequest",
    ".csi.v1.NodeExpandVolumeRequest",
    ".csi.v1.CreateVolumeGroupSnapshotRequest",
    ".csi.v1.DeleteVolumeGroupSnapshotRequest",
    ".csi.v1.GetVolumeGroupSnapshotRequest",
    ".csi.v1.GetMetadataAllocatedRequest",
    ".csi.v1.GetMetadataDeltaRequest",
    ".hostd.v1.Encryption",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/hostd.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        // Their derived Debug would print secrets: see `redacted` in lib.rs.
        .skip_debug(REDACTED)
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
