//! The hostd gRPC service. Handlers stay thin: validate, then delegate.
//!
//! A mutating call's lock on its volume, its permit of the calls in flight
//! and its audit line all live inside the blocking work, not in the
//! handler's future: a caller that cancels (a deadline, a dropped
//! connection) drops the future, but the work it began runs on, and until
//! it ends no other call on that volume starts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use proxmox_csi_common::hostd_api::{self, Capability};
use proxmox_csi_common::rpc::{in_span, traced};
use proxmox_csi_proto::hostd::v1 as pb;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::error::HostdError;
use crate::health::Health;
use crate::identity;
use crate::volume::Volumes;

/// Calls hostd works on at once: far above what kubelet asks of one node
/// (an operation per volume at a time). The runtime's blocking threads are
/// bounded to this and a few more (see `main`), so no caller can make hostd
/// start threads without bound.
pub const MAX_CALLS_IN_FLIGHT: usize = 64;

/// One async lock per volume id: calls on a volume run one at a time, calls
/// on different volumes run concurrently.
#[derive(Debug, Default)]
struct VolumeLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl VolumeLocks {
    async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
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
    in_flight: Arc<Semaphore>,
    /// Capabilities withheld: a test build playing an older hostd.
    without: Vec<Capability>,
}

/// What a mutating call carries into its blocking work: the volume's lock,
/// the permit, and what its audit line names.
struct Held {
    _guard: OwnedMutexGuard<()>,
    _permit: Option<OwnedSemaphorePermit>,
    health: Arc<Health>,
    call: &'static str,
    peer: Option<u32>,
    volume_id: String,
    path: String,
}

impl Held {
    /// Writes the one audit line of a mutating call and records failures.
    fn audit<T>(&self, result: &Result<T, HostdError>) {
        self.audit_outcome(result.as_ref().err());
    }

    fn audit_outcome(&self, error: Option<&HostdError>) {
        let (call, peer, volume_id, path) = (
            self.call,
            self.peer,
            self.volume_id.as_str(),
            self.path.as_str(),
        );
        match error {
            None => {
                tracing::info!(target: "audit", call, volume_id, path, peer_uid = peer, outcome = "ok")
            }
            Some(e) => {
                let error = e.message();
                self.health
                    .record_error(&format!("{call} {volume_id}: {error}"));
                tracing::warn!(target: "audit", call, volume_id, path, peer_uid = peer, outcome = "error", code = ?e.code(), error)
            }
        }
    }
}

impl HostdService {
    pub fn new(health: Arc<Health>, dmi_dir: PathBuf, volumes: Arc<Volumes>) -> Self {
        Self {
            health,
            dmi_dir,
            volumes,
            locks: VolumeLocks::default(),
            in_flight: Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT)),
            without: Vec::new(),
        }
    }

    /// Withholds `caps`, as a hostd of a release without them would: Health
    /// does not offer them and their calls are Unimplemented (tests of the
    /// node plugin against an older hostd).
    pub fn without(mut self, caps: Vec<Capability>) -> Self {
        self.without = caps;
        self
    }

    /// Unimplemented when `cap` is withheld, as a hostd without it answers.
    fn offers(&self, cap: Capability) -> Result<(), Status> {
        if self.without.contains(&cap) {
            return Err(Status::unimplemented(format!(
                "hostd {} cannot {} ({})",
                env!("CARGO_PKG_VERSION"),
                cap.purpose(),
                cap.name()
            )));
        }
        Ok(())
    }

    /// Takes the volume's lock; the permit comes in `run_held`, right before
    /// the work (calls queued on one volume, and a Stage waiting for its
    /// disk, hold no permit while they wait).
    async fn hold(
        &self,
        call: &'static str,
        peer: Option<u32>,
        volume_id: &str,
        path: &str,
    ) -> Result<Held, HostdError> {
        let guard = self.locks.lock(volume_id).await;
        Ok(Held {
            _guard: guard,
            _permit: None,
            health: self.health.clone(),
            call,
            peer,
            volume_id: volume_id.to_string(),
            path: path.to_string(),
        })
    }

    /// Runs `work` on a blocking thread with `held`; the audit line is
    /// written there, when the work ends, whether or not anyone still waits
    /// for its answer.
    async fn run_held<T: Send + 'static>(
        &self,
        mut held: Held,
        work: impl FnOnce(&Volumes) -> Result<T, HostdError> + Send + 'static,
    ) -> Result<T, HostdError> {
        match self.in_flight.clone().acquire_owned().await {
            Ok(p) => held._permit = Some(p),
            Err(e) => {
                let e = HostdError::lib("waiting for", "a call slot", e);
                held.audit_outcome(Some(&e));
                return Err(e);
            }
        }
        let volumes = self.volumes.clone();
        let span = tracing::Span::current();
        blocking(move || {
            let _entered = span.enter();
            let result = work(&volumes);
            held.audit(&result);
            result
        })
        .await
    }

    /// A mutating call from start to end: lock, permit, work, audit.
    async fn mutate<T: Send + 'static>(
        &self,
        call: &'static str,
        peer: Option<u32>,
        volume_id: &str,
        path: &str,
        work: impl FnOnce(&Volumes) -> Result<T, HostdError> + Send + 'static,
    ) -> Result<T, HostdError> {
        let held = self.hold(call, peer, volume_id, path).await?;
        self.run_held(held, work).await
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
        .unwrap_or_else(|e| Err(HostdError::lib("running", "a blocking task", e)))
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
        self.offers(match req.access {
            Some(pb::stage_request::Access::Block(_)) => Capability::Block,
            _ => Capability::Filesystem,
        })?;
        if req.encryption.is_some() {
            self.offers(Capability::Luks)?;
        }
        let id = req.volume_id.clone();
        in_span("Stage", &id, async move {
            let held = self
                .hold("Stage", peer, &req.volume_id, &req.staging_path)
                .await?;
            // The checks and the wait for the device touch nothing and hold
            // no permit: a cancel meanwhile drops the lock with nothing begun.
            let work = match self.volumes.prepare_stage(&mut req).await {
                Ok(work) => work,
                Err(e) => {
                    held.audit_outcome(Some(&e));
                    return Err(e.into());
                }
            };
            let staged = self.run_held(held, move |v| v.stage(work)).await?;
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
        let path = req.staging_path.clone();
        in_span("Unstage", &id.clone(), async move {
            self.mutate("Unstage", peer, &id, &path, move |v| v.unstage(&req))
                .await?;
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
        let path = req.target_path.clone();
        in_span("Publish", &id.clone(), async move {
            self.mutate("Publish", peer, &id, &path, move |v| v.publish(&req))
                .await?;
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
        let path = req.target_path.clone();
        in_span("Unpublish", &id.clone(), async move {
            self.mutate("Unpublish", peer, &id, &path, move |v| v.unpublish(&req))
                .await?;
            Ok(Response::new(pb::UnpublishResponse {}))
        })
        .await
    }

    async fn expand(
        &self,
        req: Request<pb::ExpandRequest>,
    ) -> Result<Response<pb::ExpandResponse>, Status> {
        self.offers(Capability::Expand)?;
        let peer = peer_uid(&req);
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let path = req.volume_path.clone();
        in_span("Expand", &id.clone(), async move {
            // Moved, not copied: the request may carry the passphrase.
            let grown = self
                .mutate("Expand", peer, &id, &path, move |v| {
                    let mut req = req;
                    v.expand(&mut req)
                })
                .await?;
            Ok(Response::new(grown))
        })
        .await
    }

    async fn stats(
        &self,
        req: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        self.offers(Capability::Stats)?;
        let req = req.into_inner();
        let id = req.volume_id.clone();
        let volumes = self.volumes.clone();
        traced("Stats", &id, async move {
            // Reads only, but it still holds a permit while it runs: a flood
            // of Stats cannot start threads beyond the bound either.
            let permit = self
                .in_flight
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| HostdError::lib("waiting for", "a call slot", e))?;
            let stats = blocking(move || {
                let _permit = permit;
                volumes.stats(&req)
            })
            .await?;
            Ok(Response::new(stats))
        })
        .await
    }

    async fn node_identity(
        &self,
        _: Request<pb::NodeIdentityRequest>,
    ) -> Result<Response<pb::NodeIdentityResponse>, Status> {
        traced("NodeIdentity", "", async move {
            let id = identity::read(&self.dmi_dir)?;
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
            api_version: hostd_api::API_VERSION,
            capabilities: Capability::ALL
                .into_iter()
                .filter(|c| !self.without.contains(c))
                .map(|c| c.name().to_string())
                .collect(),
        }))
    }
}
