//! The controller's operations, one module per concern; `csi/controller.rs`
//! only adapts them to the gRPC service.

mod capability;
mod clone;
mod copy;
mod create;
mod delete;
mod expand;
mod holder;
mod modify;
mod publish;
mod query;
mod replicate;
mod snapshot;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::attach::Attacher;
use crate::error::CtlError;
use crate::pve::api::StorageResource;
use crate::pve::{Client, Deadline};
use crate::vms::VmIndex;

pub use capability::check_capabilities;
pub use clone::VOLUME_TAG;
pub use copy::vm_name;
pub use holder::{NewVm, TAG as CSI_TAG};
pub use replicate::REPLICATED_TAG;
pub use snapshot::{SNAPSHOT_TAG, SnapshotId};

/// Shared state of the controller.
#[derive(Debug)]
pub struct Controller {
    pub clients: HashMap<String, Arc<Client>>,
    pub controller_vmid: u32,
    pub vms: VmIndex,
    pub attacher: Arc<Attacher>,
    imports: copy::Imports,
    storages: Mutex<HashMap<String, (std::time::Instant, Vec<StorageResource>)>>,
    /// Deadline of a call when the caller set none.
    pub default_timeout: Duration,
    /// The Kubernetes API, when reachable: node → VM by providerID,
    /// `lifecycle: keep`, VolumeAttributesClasses.
    pub kube: Option<crate::kube::Kube>,
    pub driver_name: String,
}

/// 512 MiB: the Go driver's size step.
pub const CHUNK: u64 = 512 << 20;
pub const DEFAULT_SIZE: u64 = 10 << 30;
const STORAGE_CACHE: Duration = Duration::from_secs(30);

impl Controller {
    pub fn new(clients: Vec<Arc<Client>>, controller_vmid: u32, default_timeout: Duration) -> Self {
        Self {
            clients: clients.into_iter().map(|c| (c.region().to_string(), c)).collect(),
            controller_vmid,
            vms: VmIndex::default(),
            attacher: Arc::new(Attacher::default()),
            imports: copy::Imports::default(),
            storages: Mutex::new(HashMap::new()),
            default_timeout,
            kube: None,
            driver_name: "csi.proxmox.sinextra.dev".into(),
        }
    }

    pub fn with_kube(mut self, kube: crate::kube::Kube, driver_name: &str) -> Self {
        self.kube = Some(kube);
        self.driver_name = driver_name.to_string();
        self
    }

    pub fn client(&self, region: &str) -> Result<Arc<Client>, CtlError> {
        self.clients.get(region).cloned().ok_or_else(|| {
            let mut known: Vec<&String> = self.clients.keys().collect();
            known.sort();
            CtlError::invalid(
                "region",
                format!("{region:?} is not a cluster of the cloud config; configured: {known:?}"),
            )
        })
    }

    /// Rows of `/cluster/resources?type=storage` for `storage`, cached briefly.
    pub async fn storage_rows(&self, client: &Client, storage: &str, d: Deadline) -> Result<Vec<StorageResource>, CtlError> {
        let mut cache = self.storages.lock().await;
        let fresh = cache
            .get(client.region())
            .is_some_and(|(at, _)| at.elapsed() < STORAGE_CACHE);
        if !fresh {
            let rows = client.storages(d).await?;
            cache.insert(client.region().to_string(), (std::time::Instant::now(), rows));
        }
        Ok(cache
            .get(client.region())
            .map(|(_, rows)| rows.iter().filter(|r| r.storage == storage).cloned().collect())
            .unwrap_or_default())
    }
}

/// The deadline of a call: the caller's `grpc-timeout`, else the default.
pub fn deadline<T>(req: &tonic::Request<T>, default: Duration) -> Deadline {
    let t = req
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .unwrap_or(default);
    Deadline::after(t)
}

fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("14999m"), Some(Duration::from_millis(14999)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("x"), None);
    }
}
