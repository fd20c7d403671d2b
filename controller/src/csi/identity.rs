//! CSI Identity: who we are, what we can do, and whether this process
//! serves. Each configured Proxmox cluster's health is watched apart from
//! Probe (`ClusterHealth`): one region's outage must not make the
//! controller unready, which the liveness probe's 1 s timeout would turn
//! into restarts and the sidecars' `ProbeForever` into a stall. The Go
//! driver's Probe always answers ready too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use proxmox_csi_common::support;
use proxmox_csi_proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use crate::pve;

#[derive(Debug)]
pub struct Identity {
    driver_name: String,
}

impl Identity {
    pub fn new(driver_name: String) -> Self {
        Self { driver_name }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegionLabel {
    region: String,
}

/// Every configured cluster's answer to `GET /version`, asked every
/// `interval`: exported as `proxmox_cluster_up{region}` (1 or 0) and
/// logged when it changes, with the cause.
#[derive(Clone, Debug, Default)]
pub struct ClusterHealth {
    up: Family<RegionLabel, Gauge>,
}

impl ClusterHealth {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxmox_cluster_up",
            "Whether the Proxmox cluster of a region answered GET /version at the last check",
            self.up.clone(),
        );
    }

    /// Checks every cluster once; `last` holds each region's last failure
    /// (`None` while it answers) and `releases` the Proxmox release it last
    /// reported, so that only changes are logged.
    async fn check(
        &self,
        clusters: &[Arc<pve::Client>],
        timeout: Duration,
        last: &mut HashMap<String, Option<String>>,
        releases: &mut HashMap<String, String>,
    ) {
        let checks = clusters.iter().map(|c| async move {
            let (failure, release) = match tokio::time::timeout(timeout, c.version()).await {
                Ok(Ok(v)) => (None, Some(v.version)),
                Ok(Err(e)) => (Some(e.to_string()), None),
                Err(_) => (
                    Some(format!(
                        "Proxmox cluster {}: GET /version: no answer within {timeout:?}",
                        c.region()
                    )),
                    None,
                ),
            };
            (c.region().to_string(), failure, release)
        });
        for (region, failure, release) in join_all(checks).await {
            if let Some(release) = release
                && releases.get(&region) != Some(&release)
            {
                // Served all the same: an unlisted release usually works,
                // but nothing here was tested against it.
                if support::proxmox_supported(&release) == Some(false) {
                    tracing::warn!(
                        %region,
                        %release,
                        supported = %support::proxmox_supported_text(),
                        "Proxmox VE release outside this driver's support (docs/support.md)"
                    );
                }
                releases.insert(region.clone(), release);
            }
            let labels = RegionLabel {
                region: region.clone(),
            };
            self.up
                .get_or_create(&labels)
                .set(i64::from(failure.is_none()));
            let before = last.insert(region.clone(), failure.clone());
            match (before.flatten(), failure) {
                (Some(_), None) => tracing::info!(%region, "Proxmox cluster answers again"),
                (None, Some(cause)) => {
                    tracing::warn!(%region, %cause, "Proxmox cluster not reachable")
                }
                _ => {}
            }
        }
    }

    /// Checks every `interval` until the process ends; the first check at once.
    pub async fn watch(
        self,
        clusters: Vec<Arc<pve::Client>>,
        timeout: Duration,
        interval: Duration,
    ) {
        let (mut last, mut releases) = (HashMap::new(), HashMap::new());
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.check(&clusters, timeout, &mut last, &mut releases)
                .await;
        }
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

    /// Ready while this process serves: the clusters' health is
    /// `proxmox_cluster_up` and the log, never a restart.
    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
