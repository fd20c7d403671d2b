//! The hostd gRPC service. Handlers stay thin: validate, then delegate.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use proxmox_csi_common::rpc::{in_span, traced};
use proxmox_csi_proto::hostd::v1 as pb;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::error::HostdError;
use crate::health::Health;
use crate::identity;
use crate::volume::Volumes;

/// One async lock per volume id: calls on a volume run one at a time, calls
/// on different volumes run concurrently.
#[derive(Debug, Default)]
struct VolumeLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl VolumeLocks {
    async fn lock(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            // Drop locks nobody holds, so the map does not grow without bound.
            map.retain(|_, l| Arc::strong_count(l) > 1);
            map.entry(id.to_string()).or_default().clone()
        };
        m.lock_owned().await
    }
}

#[derive(Debug)]
pub struct HostdService {
    health: Arc<Health>,
    dmi_dir: PathBuf,
    volumes: Arc<Volumes>,
    locks: VolumeLocks,
}

impl HostdService {
    pub fn new(health: Arc<Health>, dmi_dir: PathBuf, volumes: Arc<Volumes>) -> Self {
        Self {
            health,
            dmi_dir,
            volumes,
            locks: VolumeLocks::default(),
        }
    }

    /// Writes the one audit line of a mutating call and records failures.
    fn audit<T>(
        &self,
        call: &'static str,
        peer: Option<u32>,
        volume_id: &str,
        path: &str,
        result: &Result<T, HostdError>,
    ) {
        match result {
            Ok(_) => {
                tracing::info!(target: "audit", call, volume_id, path, peer_uid = peer, outcome = "ok")
            }
            Err(e) => {
                self.health
                    .record_error(&format!("{call} {volume_id}: {e}"));
                tracing::warn!(target: "audit", call, volume_id, path, peer_uid = peer, outcome = "error", code = ?e.code(), error = %e)
            }
        }
    }
}

/// Runs blocking work (mount(2), libcryptsetup, mkfs) on tokio's blocking
/// threads: the runtime's few workers keep answering Health and the other
/// volumes' calls meanwhile.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, HostdError> + Send + 'static,
) -> Result<T, HostdError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(HostdError::failed("running", "a blocking task", e)))
}

fn peer_uid<T>(req: &Request<T>) -> Option<u32> {
    req.extensions()
        .get::<UdsConnectInfo>()
        .and_then(|i| i.peer_cred)
        .map(|c| c.uid())
}

#[tonic::async_trait]
impl pb::hostd_server::Hostd for HostdService {
    async fn stage(
        &self,
        req: Request<pb::StageRequest>,
    ) -> Result<Response<pb::StageResponse>, Status> {
        let peer = peer_uid(&req);
        let mut req = req.into_inner();
        let id = req.volume_id.clone();
        in_span("Stage", &id, async move {
            let _guard = self.locks.lock(&req.volume_id).await;
            let volumes = self.volumes.clone();
            let result = match self.volumes.prepare_stage(&mut req).await {
                Ok(work) => blocking(move || volumes.stage(work)).await,
                Err(e) => Err(e),
            };
            self.audit("Stage", peer, &req.volume_id, &req.staging_path, &result);
            let staged = result?;
            crate::metrics::observe_stage(&staged.timings_ms);
            Ok(Response::new(staged))
        })
        .await
    }

    async fn unstage(
        &self,
        req: Request<pb::UnstageRequest>,
    ) -> Result<Response<pb::UnstageResponse>, Status> {
        let peer = peer_uid(&req);
        let req = req.into_inner();
        let id = req.volume_id.clone();
        in_span("Unstage", &id, async move {
            let _guard = self.locks.lock(&req.volume_id).await;
            let volumes = self.volumes.clone();
            let r = req.clone();
            let result = blocking(move || volumes.unstage(&r)).await;
            self.audit("Unstage", peer, &req.volume_id, &req.staging_path, &result);
            result?;
            Ok(Response::new(pb::UnstageResponse {}))
        })
        .await
    }

    async fn publish(
        &self,
        req: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishResponse>, Status> {
        let peer = peer_uid(&req);
        let req = req.into_inner();
        let id = req.volume_id.clone();
        in_span("Publish", &id, async move {
            let _guard = self.locks.lock(&req.volume_id).await;
            let volumes = self.volumes.clone();
            let r = req.clone();
            let result = blocking(move || volumes.publish(&r)).await;
            self.audit("Publish", peer, &req.volume_id, &req.target_path, &result);
            result?;
            Ok(Response::new(pb::PublishResponse {}))
        })
        .await
    }

    async fn unpublish(
        &self,
        req: Request<pb::UnpublishRequest>,
    ) -> Result<Response<pb::UnpublishResponse>, Status> {
        let peer = peer_uid(&req);
        let req = req.into_inner();
        let id = req.volume_id.clone();
        in_span("Unpublish", &id, async move {
            let _guard = self.locks.lock(&req.volume_id).await;
            let volumes = self.volumes.clone();
            let r = req.clone();
            let result = blocking(move || volumes.unpublish(&r)).await;
            self.audit("Unpublish", peer, &req.volume_id, &req.target_path, &result);
            result?;
            Ok(Response::new(pb::UnpublishResponse {}))
        })
        .await
    }

    async fn expand(
        &self,
        req: Request<pb::ExpandRequest>,
    ) -> Result<Response<pb::ExpandResponse>, Status> {
        let peer = peer_uid(&req);
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let path = req.volume_path.clone();
        in_span("Expand", &id.clone(), async move {
            let _guard = self.locks.lock(&id).await;
            let volumes = self.volumes.clone();
            // Moved, not copied: the request may carry the passphrase.
            let result = blocking(move || volumes.expand(&req)).await;
            self.audit("Expand", peer, &id, &path, &result);
            Ok(Response::new(result?))
        })
        .await
    }

    async fn stats(
        &self,
        req: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let volumes = self.volumes.clone();
        traced("Stats", &id, async move {
            Ok(Response::new(blocking(move || volumes.stats(&req)).await?))
        })
        .await
    }

    async fn node_identity(
        &self,
        _: Request<pb::NodeIdentityRequest>,
    ) -> Result<Response<pb::NodeIdentityResponse>, Status> {
        traced("NodeIdentity", "", async move {
            let id = identity::read(&self.dmi_dir)
                .map_err(|e| Status::internal(format!("NodeIdentity: {e}")))?;
            Ok(Response::new(pb::NodeIdentityResponse {
                system_uuid: id.system_uuid,
                system_serial: id.system_serial,
                vmid: id.vmid.unwrap_or_default(),
                product_name: id.product_name,
                other_scsi_disks: u32::try_from(self.volumes.other_scsi_disks())
                    .unwrap_or(u32::MAX),
            }))
        })
        .await
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        self.volumes.refresh_health(&self.health);
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
