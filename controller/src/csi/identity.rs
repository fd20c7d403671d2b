//! CSI Identity: who we are, what we can do, and whether every configured
//! Proxmox cluster answers.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use proxmox_csi_proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use crate::pve;

#[derive(Debug)]
pub struct Identity {
    driver_name: String,
    clusters: Vec<Arc<pve::Client>>,
    probe_timeout: Duration,
}

impl Identity {
    pub fn new(
        driver_name: String,
        clusters: Vec<Arc<pve::Client>>,
        probe_timeout: Duration,
    ) -> Self {
        Self {
            driver_name,
            clusters,
            probe_timeout,
        }
    }

    /// Checks every cluster's `/version`; returns the failures, one line each.
    async fn unreachable_clusters(&self) -> Vec<String> {
        let checks = self.clusters.iter().map(|c| async move {
            match tokio::time::timeout(self.probe_timeout, c.version()).await {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!(
                    "Proxmox cluster {}: GET /version: no answer within {:?}",
                    c.region(),
                    self.probe_timeout
                )),
            }
        });
        join_all(checks).await.into_iter().flatten().collect()
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: proxmox_csi_proto::plugin::capabilities(),
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let failures = self.unreachable_clusters().await;
        for f in &failures {
            tracing::warn!(reason = %f, "probe: Proxmox cluster not reachable");
        }
        Ok(Response::new(csi::ProbeResponse {
            ready: Some(failures.is_empty()),
        }))
    }
}
