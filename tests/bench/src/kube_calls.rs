//! Kubernetes API calls per operation as the cluster grows: the controller
//! on pvesim and kubesim, with `n` PersistentVolumes of the driver, one
//! volume published, unpublished, listed and deleted; with its watch caches
//! and as it read before them (every lookup from the API), side by side.
//!
//! Cost model: an API server answers a list of n objects in time and memory
//! proportional to n (kube-apiserver serializes every object it returns), a
//! get by name in constant time; a watch costs one list when it starts and
//! one event per change after. So the table counts requests and the objects
//! they returned (kubesim's `requests`, `objects_served`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use callers::{attacher, provisioner};
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::kube::Kube;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use serde_json::json;
use tonic::Request;

use crate::sim::Sim;

const DRIVER: &str = "csi.proxmox.sinextra.dev";
const NODE: &str = "worker-200";
const NODE_ID: &str = "worker-200/200";

/// Requests and objects one operation cost the API server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    pub requests: u64,
    pub objects: u64,
}

/// One cluster size and mode.
#[derive(Debug, Clone)]
pub struct Row {
    pub pvs: usize,
    pub watched: bool,
    /// Until the caches had listed once (none without them).
    pub sync: Cost,
    pub sync_ms: u128,
    pub publish: Cost,
    pub unpublish: Cost,
    pub list_volumes: Cost,
    pub delete: Cost,
}

fn cluster() -> String {
    format!(
        "cluster: bench\nnodes: [{{ name: pve1 }}]\nstorages:\n  - {{ id: local-lvm, type: lvmthin, total: 109951162777600 }}\n\
         vms:\n  - {{ vmid: 200, node: pve1, name: {NODE}, config: {{ scsihw: virtio-scsi-pci }} }}\n\
         users:\n  - userid: kubernetes-csi@pve\n    tokens: [{{ name: csi, secret: {} }}]\n\
         roles:\n  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]\n\
         acl:\n  - {{ path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: [\"{}\"] }}\n",
        crate::sim::SECRET,
        crate::sim::TOKEN
    )
}

/// A PersistentVolume of the driver as the provisioner writes it.
fn pv(name: &str, handle: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "ext4"},
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
        },
    })
}

/// What `run` cost kubesim.
async fn cost<T>(
    kube: &kubesim::Running,
    run: impl std::future::Future<Output = Result<T>>,
) -> Result<Cost> {
    let (r, o) = (kube.requests(), kube.objects_served());
    run.await?;
    Ok(Cost {
        requests: kube.requests() - r,
        objects: kube.objects_served() - o,
    })
}

/// One volume's publish, unpublish, listing and delete among `n` others.
pub async fn measure(n: usize, watched: bool) -> Result<Row> {
    let sim = Sim::start(&cluster()).await?;
    let kube = kubesim::start().await?;
    kube.put(
        "nodes",
        json!({"metadata": {"name": NODE}, "spec": {"providerID": "proxmox://region-1/200"}}),
    );
    kube.put(
        "csinodes",
        json!({"metadata": {"name": NODE}, "spec": {"drivers": [{"name": DRIVER, "nodeID": NODE_ID, "topologyKeys": ["topology.kubernetes.io/region", "topology.kubernetes.io/zone"]}]}}),
    );
    kube.put_all(
        "persistentvolumes",
        (0..n).map(|i| {
            pv(
                &format!("pvc-other-{i}"),
                &format!("region-1/pve1/local-lvm/vm-9999-pvc-other-{i}"),
            )
        }),
    );

    let client = kube::Client::try_from(kube::Config::new(kube.url.parse()?))?;
    let started = Instant::now();
    let (r0, o0) = (kube.requests(), kube.objects_served());
    let k = if watched {
        Kube::new(client)
    } else {
        Kube::unwatched(client)
    };
    if let Some(w) = k.watched() {
        tokio::time::timeout(Duration::from_secs(120), w.ready())
            .await
            .context("the watch caches did not list in 2 minutes")?;
    }
    let sync = Cost {
        requests: kube.requests() - r0,
        objects: kube.objects_served() - o0,
    };
    let sync_ms = started.elapsed().as_millis();
    let cfg = CloudConfig::parse(&sim.cloud_config())?;
    let ctl = Controller::from_config(
        &cfg,
        Duration::from_secs(30),
        Default::default(),
        Duration::from_secs(120),
    )?
    .with_kube(k, DRIVER);
    let svc = ControllerService(Arc::new(ctl));

    let sc = provisioner::StorageClass::new(&[("storage", "local-lvm")]);
    let claim =
        provisioner::Claim::new("measured", "5bc58ec7-1c2d-4e5f-8a9b-0c1d2e3f4a5b", 1 << 30);
    let measured = crate::sim::provision(&svc, &sc, &claim, "pve1").await?;
    kube.put("persistentvolumes", pv(&measured.name, &measured.handle));
    // The new volume reaches the cache as the provisioner's would.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let publish = cost(&kube, async {
        svc.controller_publish_volume(Request::new(attacher::controller_publish(
            &measured, NODE_ID,
        )))
        .await
        .context("publish")
    })
    .await?;
    let unpublish = cost(&kube, async {
        svc.controller_unpublish_volume(Request::new(attacher::controller_unpublish(
            &measured, NODE_ID,
        )))
        .await
        .context("unpublish")
    })
    .await?;
    let list_volumes = cost(&kube, async {
        svc.list_volumes(Request::new(attacher::list_volumes("")))
            .await
            .context("list volumes")
    })
    .await?;
    let delete = cost(&kube, async {
        svc.delete_volume(Request::new(provisioner::delete_volume(&measured)))
            .await
            .context("delete")
    })
    .await?;
    Ok(Row {
        pvs: n + 1,
        watched,
        sync,
        sync_ms,
        publish,
        unpublish,
        list_volumes,
        delete,
    })
}
