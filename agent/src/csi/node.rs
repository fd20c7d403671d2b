//! CSI Node service: validate (see `request`), then ask hostd.

use proxmox_csi_common::rpc::traced;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::node_service_capability::{self, rpc};
use proxmox_csi_proto::csi::v1::volume_usage::Unit;
use proxmox_csi_proto::hostd::v1 as hostd;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use proxmox_csi_common::hostd_api::Capability;

use crate::error::{AgentError, hostd_status};
use crate::offer::HostdOffer;
use crate::request::Rules;
use crate::topology::{self, Topology};

/// Where NodeGetInfo's topology comes from.
#[derive(Clone)]
pub enum TopologySource {
    /// The Node object's labels, through the Kubernetes API.
    Kubernetes(kube::Client),
    /// Given on the command line (hosts outside Kubernetes, tests).
    Fixed(Topology),
}

impl std::fmt::Debug for TopologySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kubernetes(_) => f.write_str("Kubernetes"),
            Self::Fixed(t) => f.debug_tuple("Fixed").field(t).finish(),
        }
    }
}

#[derive(Debug)]
pub struct Node {
    pub rules: Rules,
    pub hostd: HostdClient<Channel>,
    pub node_name: String,
    /// VM id from the command line; otherwise hostd reads it from SMBIOS.
    pub vmid: Option<u32>,
    pub topology: TopologySource,
    pub max_volumes: i64,
    /// What hostd offers, shared with the probe.
    pub offer: HostdOffer,
}

impl Node {
    fn hostd(&self) -> HostdClient<Channel> {
        self.hostd.clone()
    }

    async fn require(&self, cap: Capability) -> Result<(), AgentError> {
        self.offer.require(&mut self.hostd(), cap).await
    }
}

/// What the node plugin implements, and nothing more.
pub const CAPABILITIES: &[rpc::Type] = &[
    rpc::Type::StageUnstageVolume,
    rpc::Type::ExpandVolume,
    rpc::Type::GetVolumeStats,
    rpc::Type::VolumeCondition,
    rpc::Type::SingleNodeMultiWriter,
];

fn capability(t: rpc::Type) -> csi::NodeServiceCapability {
    csi::NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Node {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("NodeStageVolume", &id, async move {
            let h = self.rules.stage(req.get_ref())?;
            self.require(match h.access {
                Some(hostd::stage_request::Access::Block(_)) => Capability::Block,
                _ => Capability::Filesystem,
            })
            .await?;
            if h.encryption.is_some() {
                self.require(Capability::Luks).await?;
            }
            let volume_id = h.volume_id.clone();
            let done = self.hostd().stage(h).await.map_err(hostd_status)?.into_inner();
            let mut timings: Vec<_> = done.timings_ms.iter().collect();
            timings.sort();
            tracing::info!(volume_id, actions = ?done.actions, size_bytes = done.size_bytes, timings_ms = ?timings, "volume staged");
            Ok(Response::new(csi::NodeStageVolumeResponse {}))
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("NodeUnstageVolume", &id, async move {
            let h = self.rules.unstage(req.get_ref())?;
            let volume_id = h.volume_id.clone();
            self.hostd().unstage(h).await.map_err(hostd_status)?;
            tracing::info!(volume_id, "volume unstaged");
            Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("NodePublishVolume", &id, async move {
            let h = self.rules.publish(req.get_ref())?;
            let (volume_id, target) = (h.volume_id.clone(), h.target_path.clone());
            self.hostd().publish(h).await.map_err(hostd_status)?;
            tracing::info!(volume_id, target, "volume published");
            Ok(Response::new(csi::NodePublishVolumeResponse {}))
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("NodeUnpublishVolume", &id, async move {
            let h = self.rules.unpublish(req.get_ref())?;
            let (volume_id, target) = (h.volume_id.clone(), h.target_path.clone());
            self.hostd().unpublish(h).await.map_err(hostd_status)?;
            tracing::info!(volume_id, target, "volume unpublished");
            Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("NodeGetVolumeStats", &id, async move {
            let h = self.rules.stats(req.get_ref())?;
            self.require(Capability::Stats).await?;
            let path = h.volume_path.clone();
            let s = match self.hostd().stats(h).await {
                Ok(s) => s.into_inner(),
                // The spec's answer for a path that holds no volume.
                Err(source) if source.code() == Code::FailedPrecondition => {
                    return Err(AgentError::NothingAt { path, source }.into());
                }
                Err(e) => return Err(hostd_status(e).into()),
            };
            let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            let mut usage = vec![csi::VolumeUsage {
                available: as_i64(s.available_bytes),
                total: as_i64(s.total_bytes),
                used: as_i64(s.used_bytes),
                unit: Unit::Bytes as i32,
            }];
            if !s.block {
                usage.push(csi::VolumeUsage {
                    available: as_i64(s.available_inodes),
                    total: as_i64(s.total_inodes),
                    used: as_i64(s.used_inodes),
                    unit: Unit::Inodes as i32,
                });
            }
            Ok(Response::new(csi::NodeGetVolumeStatsResponse {
                usage,
                volume_condition: s.condition.map(|c| csi::VolumeCondition {
                    abnormal: c.abnormal,
                    message: c.message,
                }),
            }))
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let id = req.get_ref().volume_id.clone();
        traced("NodeExpandVolume", &id, async move {
            let h = self.rules.expand(req.get_ref())?;
            self.require(Capability::Expand).await?;
            let volume_id = h.volume_id.clone();
            let r = self
                .hostd()
                .expand(h)
                .await
                .map_err(hostd_status)?
                .into_inner();
            tracing::info!(volume_id, size_bytes = r.size_bytes, "volume expanded");
            Ok(Response::new(csi::NodeExpandVolumeResponse {
                capacity_bytes: i64::try_from(r.size_bytes).unwrap_or(i64::MAX),
            }))
        })
        .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: CAPABILITIES.iter().copied().map(capability).collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        traced("NodeGetInfo", "", async move {
            let identity = self
                .hostd()
                .node_identity(hostd::NodeIdentityRequest {})
                .await
                .map_err(hostd_status)?
                .into_inner();
            let vmid = self.vmid.or((identity.vmid >= 100).then_some(identity.vmid));
            if vmid.is_none() {
                tracing::warn!(
                    serial = identity.system_serial,
                    "no VM id: neither --vmid nor an SMBIOS serial with i=<vmid>; the controller will match the VM by name"
                );
            }
            let topo = match &self.topology {
                TopologySource::Fixed(t) => t.clone(),
                TopologySource::Kubernetes(client) => topology::lookup(client.clone(), &self.node_name).await?,
            };
            let node_id = proxmox_csi_common::NodeId {
                name: self.node_name.clone(),
                vmid,
            };
            let mut segments = std::collections::HashMap::from([(topology::REGION.to_string(), topo.region)]);
            match topo.zone {
                Some(zone) => {
                    segments.insert(topology::ZONE.to_string(), zone);
                }
                None => tracing::warn!(
                    node = %self.node_name,
                    "the Node has no {} label: it reaches volumes on shared storage only (their topology names the region alone); label it with its Proxmox node for local storage",
                    topology::ZONE
                ),
            }
            Ok(Response::new(csi::NodeGetInfoResponse {
                node_id: node_id.to_string(),
                max_volumes_per_node: topology::max_volumes(topo.max_volumes, self.max_volumes, identity.other_scsi_disks),
                accessible_topology: Some(csi::Topology { segments }),
            }))
        })
        .await
    }
}
