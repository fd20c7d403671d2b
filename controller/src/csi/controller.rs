//! CSI Controller service: thin handlers over `ctl::Controller`.

use std::sync::Arc;

use proxmox_csi_common::rpc::traced;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_service_capability::{self, rpc};
use tonic::{Request, Response, Status};

use crate::ctl::{Controller, SnapshotId, deadline};

#[derive(Debug, Clone)]
pub struct ControllerService(pub Arc<Controller>);

impl ControllerService {
    /// The caller's deadline, held to the operation limit: the
    /// provisioner's long timeout (for waiting on copies) also bounds its
    /// DeleteVolume and GetCapacity, which must report an unreachable
    /// Proxmox as soon as any other call.
    fn deadline<T>(&self, r: &Request<T>) -> crate::pve::Deadline {
        deadline(r, self.0.default_timeout).capped(self.0.operation_limit)
    }
}

fn capability(t: rpc::Type) -> csi::ControllerServiceCapability {
    csi::ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

/// What this controller implements, and nothing more.
pub const CAPABILITIES: &[rpc::Type] = &[
    rpc::Type::CreateDeleteVolume,
    rpc::Type::PublishUnpublishVolume,
    rpc::Type::ListVolumes,
    rpc::Type::ListVolumesPublishedNodes,
    rpc::Type::GetCapacity,
    rpc::Type::ExpandVolume,
    rpc::Type::GetVolume,
    rpc::Type::VolumeCondition,
    rpc::Type::SingleNodeMultiWriter,
    rpc::Type::ModifyVolume,
    rpc::Type::CreateDeleteSnapshot,
    rpc::Type::ListSnapshots,
    rpc::Type::GetSnapshot,
    rpc::Type::CloneVolume,
];

#[tonic::async_trait]
impl csi::controller_server::Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let id = req.get_ref().name.clone();
        traced("CreateVolume", &id, async move {
            // The whole deadline: a copy is waited for within it, every
            // other step is held to the operation limit (`ctl::create`).
            let d = deadline(&req, self.0.default_timeout);
            let volume = self.0.create_volume(req.get_ref(), d).await?;
            tracing::info!(
                name = req.get_ref().name,
                volume_id = volume.volume_id,
                bytes = volume.capacity_bytes,
                "volume created"
            );
            Ok(Response::new(csi::CreateVolumeResponse {
                volume: Some(volume),
            }))
        })
        .await
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("DeleteVolume", &id, async move {
            let d = self.deadline(&req);
            self.0.delete_volume(&req.get_ref().volume_id, d).await?;
            tracing::info!(volume_id = req.get_ref().volume_id, "volume deleted");
            Ok(Response::new(csi::DeleteVolumeResponse {}))
        })
        .await
    }

    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("ControllerPublishVolume", &id, async move {
            let d = self.deadline(&req);
            let publish_context = self.0.publish(req.get_ref(), d).await?;
            tracing::info!(
                volume_id = req.get_ref().volume_id,
                node_id = req.get_ref().node_id,
                ?publish_context,
                "volume published"
            );
            Ok(Response::new(csi::ControllerPublishVolumeResponse {
                publish_context,
            }))
        })
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("ControllerUnpublishVolume", &id, async move {
            let d = self.deadline(&req);
            self.0.unpublish(req.get_ref(), d).await?;
            tracing::info!(
                volume_id = req.get_ref().volume_id,
                node_id = req.get_ref().node_id,
                "volume unpublished"
            );
            Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
        })
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("ValidateVolumeCapabilities", &id, async move {
            let d = self.deadline(&req);
            Ok(Response::new(self.0.validate(req.get_ref(), d).await?))
        })
        .await
    }

    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        traced("ListVolumes", "", async move {
            let d = self.deadline(&req);
            Ok(Response::new(self.0.list(req.get_ref(), d).await?))
        })
        .await
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        traced("GetCapacity", "", async move {
            let d = self.deadline(&req);
            let (available, max) = self.0.capacity(req.get_ref(), d).await?;
            Ok(Response::new(csi::GetCapacityResponse {
                available_capacity: available as i64,
                maximum_volume_size: Some(max as i64),
                minimum_volume_size: None,
            }))
        })
        .await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: CAPABILITIES.iter().map(|t| capability(*t)).collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let id = req.get_ref().source_volume_id.clone();
        traced("CreateSnapshot", &id, async move {
            let d = self.deadline(&req);
            let snapshot = self.0.create_snapshot(req.get_ref(), d).await?;
            tracing::info!(
                name = req.get_ref().name,
                snapshot_id = snapshot.snapshot_id,
                ready = snapshot.ready_to_use,
                "snapshot"
            );
            Ok(Response::new(csi::CreateSnapshotResponse {
                snapshot: Some(snapshot),
            }))
        })
        .await
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let id = req.get_ref().snapshot_id.clone();
        traced("DeleteSnapshot", &id, async move {
            let d = self.deadline(&req);
            self.0
                .delete_snapshot(&req.get_ref().snapshot_id, d)
                .await?;
            tracing::info!(snapshot_id = req.get_ref().snapshot_id, "snapshot deleted");
            Ok(Response::new(csi::DeleteSnapshotResponse {}))
        })
        .await
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        traced("ListSnapshots", "", async move {
            let d = self.deadline(&req);
            Ok(Response::new(
                self.0.list_snapshots(req.get_ref(), d).await?,
            ))
        })
        .await
    }

    async fn get_snapshot(
        &self,
        req: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        let id = req.get_ref().snapshot_id.clone();
        traced("GetSnapshot", &id, async move {
            let d = self.deadline(&req);
            let raw = &req.get_ref().snapshot_id;
            if raw.is_empty() {
                return Err(crate::error::CtlError::invalid("snapshot_id", "is required").into());
            }
            let id =
                SnapshotId::parse(raw).map_err(|source| crate::error::CtlError::InvalidHandle {
                    field: "snapshot_id".into(),
                    source,
                })?;
            let snapshot = self.0.snapshot(&id, d).await?.ok_or_else(|| {
                crate::error::CtlError::NotFound(format!("snapshot {raw} does not exist"))
            })?;
            Ok(Response::new(csi::GetSnapshotResponse {
                snapshot: Some(snapshot),
            }))
        })
        .await
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("ControllerExpandVolume", &id, async move {
            let d = self.deadline(&req);
            let (bytes, node_expansion_required) = self.0.expand(req.get_ref(), d).await?;
            tracing::info!(
                volume_id = req.get_ref().volume_id,
                bytes,
                "volume expanded"
            );
            Ok(Response::new(csi::ControllerExpandVolumeResponse {
                capacity_bytes: bytes as i64,
                node_expansion_required,
            }))
        })
        .await
    }

    async fn controller_get_volume(
        &self,
        req: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("ControllerGetVolume", &id, async move {
            let d = self.deadline(&req);
            Ok(Response::new(
                self.0.get_volume(&req.get_ref().volume_id, d).await?,
            ))
        })
        .await
    }

    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("ControllerModifyVolume", &id, async move {
            let d = self.deadline(&req);
            self.0.modify(req.get_ref(), d).await?;
            tracing::info!(volume_id = req.get_ref().volume_id, parameters = ?req.get_ref().mutable_parameters, "volume modified");
            Ok(Response::new(csi::ControllerModifyVolumeResponse {}))
        })
        .await
    }
}
