//! The hostd gRPC service. Handlers stay thin: validate, then delegate.

use std::path::PathBuf;
use std::sync::Arc;

use proxmox_csi_proto::hostd::v1 as pb;
use tonic::{Request, Response, Status};

use crate::health::Health;
use crate::identity;

#[derive(Debug)]
pub struct HostdService {
    health: Arc<Health>,
    dmi_dir: PathBuf,
}

impl HostdService {
    pub fn new(health: Arc<Health>, dmi_dir: PathBuf) -> Self {
        Self { health, dmi_dir }
    }
}

fn not_yet(call: &str) -> Status {
    Status::unimplemented(format!("hostd {call}: not available in this build"))
}

#[tonic::async_trait]
impl pb::hostd_server::Hostd for HostdService {
    async fn stage(&self, _: Request<pb::StageRequest>) -> Result<Response<pb::StageResponse>, Status> {
        Err(not_yet("Stage"))
    }

    async fn unstage(
        &self,
        _: Request<pb::UnstageRequest>,
    ) -> Result<Response<pb::UnstageResponse>, Status> {
        Err(not_yet("Unstage"))
    }

    async fn publish(
        &self,
        _: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishResponse>, Status> {
        Err(not_yet("Publish"))
    }

    async fn unpublish(
        &self,
        _: Request<pb::UnpublishRequest>,
    ) -> Result<Response<pb::UnpublishResponse>, Status> {
        Err(not_yet("Unpublish"))
    }

    async fn expand(
        &self,
        _: Request<pb::ExpandRequest>,
    ) -> Result<Response<pb::ExpandResponse>, Status> {
        Err(not_yet("Expand"))
    }

    async fn stats(&self, _: Request<pb::StatsRequest>) -> Result<Response<pb::StatsResponse>, Status> {
        Err(not_yet("Stats"))
    }

    async fn node_identity(
        &self,
        _: Request<pb::NodeIdentityRequest>,
    ) -> Result<Response<pb::NodeIdentityResponse>, Status> {
        let id = identity::read(&self.dmi_dir)
            .map_err(|e| Status::internal(format!("NodeIdentity: {e}")))?;
        Ok(Response::new(pb::NodeIdentityResponse {
            system_uuid: id.system_uuid,
            system_serial: id.system_serial,
            vmid: id.vmid.unwrap_or_default(),
            product_name: id.product_name,
        }))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        let s = self.health.snapshot();
        Ok(Response::new(pb::HealthResponse {
            version: s.version,
            uptime_seconds: s.uptime_seconds,
            udev_monitor_alive: s.udev_monitor_alive,
            devices_indexed: s.devices_indexed,
            volumes_staged: s.volumes_staged,
            last_error: s.last_error,
        }))
    }
}
