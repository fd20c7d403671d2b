//! Per-call metrics of the Proxmox API: count and latency by region,
//! method, path (its template) and status; retries by reason. The path's
//! label is `path`, not `endpoint`: prometheus-operator labels every
//! target with `endpoint` (the scraped port's name), and Prometheus would
//! rename ours to `exported_endpoint`.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use reqwest::Method;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    region: String,
    method: String,
    path: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryLabels {
    region: String,
    method: String,
    path: String,
    reason: &'static str,
}

/// Why a call was sent again.
#[derive(Debug, Clone, Copy)]
pub enum Retry {
    /// The connection failed or its answer was lost.
    Transport,
    /// Proxmox answered with an error worth retrying (a lock, a 5xx).
    Transient,
}

#[derive(Clone, Debug)]
pub struct ApiMetrics {
    calls: Family<Labels, Counter>,
    seconds: Family<Labels, Histogram>,
    retries: Family<RetryLabels, Counter>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 3.0, 9))
            }),
            retries: Family::default(),
        }
    }
}

impl ApiMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxmox_api_requests",
            "Proxmox API calls",
            self.calls.clone(),
        );
        registry.register(
            "proxmox_api_request_duration_seconds",
            "Proxmox API call latency",
            self.seconds.clone(),
        );
        registry.register(
            "proxmox_api_retries",
            "Proxmox API calls sent again, by reason",
            self.retries.clone(),
        );
    }

    pub fn retried(&self, region: &str, method: &Method, path: &str, why: Retry) {
        let labels = RetryLabels {
            region: region.to_string(),
            method: method.to_string(),
            path: template(path),
            reason: match why {
                Retry::Transport => "transport",
                Retry::Transient => "transient",
            },
        };
        self.retries.get_or_create(&labels).inc();
    }

    pub fn observe(&self, region: &str, method: &Method, path: &str, code: &str, started: Instant) {
        let labels = Labels {
            region: region.to_string(),
            method: method.to_string(),
            path: template(path),
            code: code.to_string(),
        };
        self.calls.get_or_create(&labels).inc();
        self.seconds
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
}

/// `/nodes/pve1/qemu/112/config` → `/nodes/{node}/qemu/{vmid}/config`, so
/// that label values stay few.
pub fn template(path: &str) -> String {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut out = Vec::with_capacity(segs.len());
    let mut i = 0;
    while i < segs.len() {
        let s = segs[i];
        out.push(s.to_string());
        let next = match (segs.get(i.wrapping_sub(1)).copied(), s) {
            (_, "nodes") => Some("{node}"),
            (Some(_), "qemu") => Some("{vmid}"),
            (_, "storage") => Some("{storage}"),
            (_, "tasks") => Some("{upid}"),
            (_, "replication") if i == 1 => Some("{id}"),
            _ => None,
        };
        if let Some(t) = next
            && i + 1 < segs.len()
        {
            out.push(t.to_string());
            i += 2;
            continue;
        }
        if s == "content" && i + 1 < segs.len() {
            out.push("{volume}".to_string());
            break;
        }
        i += 1;
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::template;

    #[test]
    fn paths_become_templates() {
        assert_eq!(
            template("/nodes/pve1/qemu/112/config"),
            "/nodes/{node}/qemu/{vmid}/config"
        );
        assert_eq!(
            template("/nodes/pve1/storage/local/content/local:9999/vm-9999-a.raw"),
            "/nodes/{node}/storage/{storage}/content/{volume}"
        );
        assert_eq!(
            template("/nodes/pve1/tasks/UPID:x/status"),
            "/nodes/{node}/tasks/{upid}/status"
        );
        assert_eq!(template("/version"), "/version");
        assert_eq!(
            template("/cluster/replication/100-0"),
            "/cluster/replication/{id}"
        );
    }
}
