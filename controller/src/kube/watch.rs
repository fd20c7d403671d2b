//! Watch caches (kube-rs reflectors) of the objects the controller looks up
//! on every publish, delete and ListVolumes: PersistentVolumes (by volume
//! handle), Nodes and CSINodes. A lookup costs no API call, whatever the
//! cluster's size; the list-and-watch costs one list per resource at start
//! and after a watch breaks.
//!
//! Each use states the freshness it needs (see `Kube`'s methods):
//! - what may be a moment old (a publish's class, a node's VM and label,
//!   the registered node ids) is read from the cache;
//! - what a decision that cannot be undone rests on (a delete's `lifecycle:
//!   keep`, a copy VM's PersistentVolume phase) is found through the cache
//!   and read again by name;
//! - until a cache has listed once (the API unreachable, a resource not
//!   served), every lookup reads the API as it would without a cache.

use std::fmt::Debug;
use std::hash::Hash;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::Resource;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// The caches, each filled by a task of its own.
#[derive(Clone)]
pub struct Watched {
    pvs: Store<PersistentVolume>,
    nodes: Store<Node>,
    csinodes: Store<CSINode>,
}

impl Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched").finish_non_exhaustive()
    }
}

impl Watched {
    /// Starts watching (needs a Tokio runtime).
    pub fn start(client: &kube::Client) -> Self {
        Self {
            pvs: reflect(Api::all(client.clone()), trim_pv),
            nodes: reflect(Api::all(client.clone()), trim_node),
            csinodes: reflect(Api::all(client.clone()), |n: &mut CSINode| {
                n.metadata.managed_fields = None;
            }),
        }
    }

    /// The PersistentVolumes, once listed.
    pub fn pvs(&self) -> Option<Vec<std::sync::Arc<PersistentVolume>>> {
        synced(&self.pvs).then(|| self.pvs.state())
    }

    /// The CSINodes, once listed.
    pub fn csinodes(&self) -> Option<Vec<std::sync::Arc<CSINode>>> {
        synced(&self.csinodes).then(|| self.csinodes.state())
    }

    /// Node `name` as last seen; `None` when the cache has not listed yet
    /// or has not seen it (a node that just joined is read from the API).
    pub fn node(&self, name: &str) -> Option<std::sync::Arc<Node>> {
        synced(&self.nodes)
            .then(|| self.nodes.get(&ObjectRef::new(name)))
            .flatten()
    }

    /// Waits until every cache has listed once (benchmarks and tests).
    pub async fn ready(&self) {
        let _ = self.pvs.wait_until_ready().await;
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.csinodes.wait_until_ready().await;
    }
}

/// Whether a cache has listed once.
fn synced<K>(store: &Store<K>) -> bool
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// What a cached PersistentVolume keeps: its name, annotations (`lifecycle:
/// keep`), CSI driver and handle, and class; a cluster of thousands of
/// volumes is held in the controller's memory.
fn trim_pv(pv: &mut PersistentVolume) {
    pv.metadata.managed_fields = None;
    pv.status = None;
    if let Some(spec) = pv.spec.as_mut() {
        spec.node_affinity = None;
        spec.claim_ref = None;
        spec.mount_options = None;
        if let Some(csi) = spec.csi.as_mut() {
            csi.volume_attributes = None;
        }
    }
}

/// What a cached Node keeps: its name, labels, annotations, providerID and
/// system UUID (`node_facts`).
fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.conditions = None;
        status.addresses = None;
        status.capacity = None;
        status.allocatable = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}

/// A store kept current by a reflector on `api`, retried with backoff;
/// `trim` drops what no lookup reads before an object is stored.
fn reflect<K>(api: Api<K>, trim: fn(&mut K)) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(trim),
    )
    .default_backoff();
    tokio::spawn(async move {
        stream
            .for_each(|event| {
                if let Err(e) = event {
                    tracing::debug!(kind, error = %e, "watch interrupted; listing again after a backoff");
                }
                futures::future::ready(())
            })
            .await;
    });
    reader
}
