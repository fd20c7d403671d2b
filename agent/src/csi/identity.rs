//! CSI Identity of the node plugin; Probe is ready only when hostd answers.

use std::time::Duration;

use proxmox_csi_common::hostd_api::Offer;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::hostd::v1::HealthRequest;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::offer::HostdOffer;

#[derive(Debug)]
pub struct Identity {
    driver_name: String,
    hostd: HostdClient<Channel>,
    probe_timeout: Duration,
    offer: HostdOffer,
}

impl Identity {
    pub fn new(driver_name: String, hostd: HostdClient<Channel>, probe_timeout: Duration) -> Self {
        Self {
            driver_name,
            hostd,
            probe_timeout,
            offer: HostdOffer::default(),
        }
    }

    /// Shares what the probe learns of hostd with the node service.
    pub fn with_offer(mut self, offer: HostdOffer) -> Self {
        self.offer = offer;
        self
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
        let mut hostd = self.hostd.clone();
        let mut req = Request::new(HealthRequest {});
        req.set_timeout(self.probe_timeout);
        let ready = match hostd.health(req).await {
            Ok(h) => {
                let h = h.into_inner();
                if !h.udev_monitor_alive {
                    tracing::debug!("probe: hostd answers but its udev monitor is not running");
                }
                let offer = Offer {
                    version: h.version,
                    api_version: h.api_version,
                    capabilities: h.capabilities,
                };
                // Not ready with a hostd it cannot speak to; one lacking a
                // capability serves the rest, and the calls that need it
                // say what is missing.
                let ok = offer.compatible();
                if !ok {
                    tracing::warn!(
                        hostd = offer.version,
                        api = offer.api_version,
                        "probe: hostd serves another API version than this node plugin"
                    );
                }
                self.offer.record(offer).await;
                ok
            }
            Err(e) => {
                tracing::warn!(
                    code = ?e.code(),
                    message = e.message(),
                    "probe: not ready: hostd did not answer Health; is the proxmox-csi-hostd service running on this node (the Talos extension, or deploy/hostd)?"
                );
                false
            }
        };
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}
