//! What hostd offers (its Health answer), asked before a call relies on a
//! capability: hostd is upgraded with the node's OS image, the node plugin
//! with the chart, so either may be a release ahead (docs/versioning.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxmox_csi_common::hostd_api::{Capability, Offer};
use proxmox_csi_proto::hostd::v1::HealthRequest;
use proxmox_csi_proto::hostd::v1::hostd_client::HostdClient;
use tokio::sync::Mutex;
use tonic::transport::Channel;

use crate::error::AgentError;

/// An answer is trusted this long: hostd restarts with a new release only
/// when its node is upgraded, which restarts this pod too on most hosts.
const FRESH: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default)]
pub struct HostdOffer(Arc<Mutex<Option<(Instant, Offer)>>>);

impl HostdOffer {
    /// Records a Health answer (the probe's, or one asked here).
    pub async fn record(&self, offer: Offer) {
        *self.0.lock().await = Some((Instant::now(), offer));
    }

    /// Hostd's offer, asked again when old. `None` while hostd does not
    /// answer: the call itself then says hostd is unreachable.
    async fn current(&self, hostd: &mut HostdClient<Channel>) -> Option<Offer> {
        if let Some((at, o)) = &*self.0.lock().await
            && at.elapsed() < FRESH
        {
            return Some(o.clone());
        }
        let mut req = tonic::Request::new(HealthRequest {});
        req.set_timeout(Duration::from_secs(5));
        let h = hostd.health(req).await.ok()?.into_inner();
        let offer = Offer {
            version: h.version,
            api_version: h.api_version,
            capabilities: h.capabilities,
        };
        self.record(offer.clone()).await;
        Some(offer)
    }

    /// Ok when hostd offers `cap` (or cannot be asked); the error names the
    /// hostd release, what it lacks and what to upgrade.
    pub async fn require(
        &self,
        hostd: &mut HostdClient<Channel>,
        cap: Capability,
    ) -> Result<(), AgentError> {
        let Some(offer) = self.current(hostd).await else {
            return Ok(());
        };
        if !offer.compatible() {
            return Err(AgentError::HostdApi {
                hostd: offer.version,
                api: offer.api_version,
            });
        }
        if !offer.has(cap) {
            return Err(AgentError::HostdLacks {
                hostd: offer.version,
                what: format!("{} ({})", cap.purpose(), cap.name()),
            });
        }
        Ok(())
    }
}
