//! pvesim with worker VMs, a controller on it, and request builders.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use callers::{attacher, provisioner};
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use pvesim::Running;
use serde_json::Value;
use testkit::requests::created;
use tonic::Request;

pub use testkit::sim::SECRET;

/// Two workers on pve2 (112 running, 113 running), one on pve1; local-lvm
/// everywhere, NFS shared; the token has exactly the documented CSI role.
pub const CLUSTER: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }, { name: pve3 }]
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
  - { id: nfs, type: nfs, total: 1099511627776, nodes: [pve1, pve2] }
vms:
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci, scsi0: "local-lvm:vm-112-disk-0,size=32G" } }
  - { vmid: 113, node: pve2, name: worker-3, config: { scsihw: virtio-scsi-pci, smbios1: "uuid=5e7f1c2a-9b3d-4c1e-8f00-00000000a113" } }
  - { vmid: 111, node: pve1, name: worker-1, config: { scsihw: virtio-scsi-pci } }
volumes:
  - { volid: "local-lvm:vm-112-disk-0", node: pve2, size: 34359738368 }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
"#;

pub struct Env {
    pub sim: Running,
    pub svc: ControllerService,
    pub http: reqwest::Client,
}

pub async fn env() -> Env {
    env_with(|c| c).await
}

/// Like `env`, with the token's role holding `privileges` (a YAML list).
pub async fn env_with_role(privileges: &str) -> Env {
    env_with_role_then(privileges, |c| c).await
}

/// Like `env_with_role`, the controller then built by `f`.
pub async fn env_with_role_then(privileges: &str, f: impl FnOnce(Controller) -> Controller) -> Env {
    build(
        &CLUSTER.replace(
            "CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]",
            &format!("CSI: {privileges}"),
        ),
        f,
    )
    .await
}

/// A controller built by `f` on a cluster of the caller's own (pvesim state YAML).
pub async fn env_from_with(cluster: &str, f: impl FnOnce(Controller) -> Controller) -> Env {
    build(cluster, f).await
}

/// A controller on a cluster of the caller's own (pvesim state YAML).
pub async fn env_from(cluster: &str) -> Env {
    build(cluster, |c| c).await
}

/// A controller built by `build` from the default one (to add a Kubernetes client).
pub async fn env_with(f: impl FnOnce(Controller) -> Controller) -> Env {
    build(CLUSTER, f).await
}

async fn build(cluster: &str, f: impl FnOnce(Controller) -> Controller) -> Env {
    let sim = testkit::sim::plain(cluster).await.unwrap();
    let ctl = f(controller_of(&sim));
    Env {
        sim,
        svc: ControllerService(Arc::new(ctl)),
        http: reqwest::Client::new(),
    }
}

/// A second controller (its own queues, caches and memory) on `e`'s pvesim.
pub fn controller_on(e: &Env) -> Controller {
    controller_of(&e.sim)
}

/// A controller with the token's cloud config on `sim`: 10 s per Proxmox
/// call, 20 s per operation.
pub fn controller_of(sim: &Running) -> Controller {
    let cfg = CloudConfig::parse(&testkit::sim::config_of(sim)).unwrap();
    Controller::from_config(
        &cfg,
        Duration::from_secs(10),
        Default::default(),
        Duration::from_secs(20),
    )
    .unwrap()
}

impl Env {
    pub async fn admin(&self, method: &str, path: &str, body: &str) -> Value {
        let (status, body) = self.admin_answer(method, path, body).await;
        assert!(status.is_success(), "pvesim admin {path}: {status} {body}");
        body["data"].clone()
    }

    /// An admin call's status and body, whatever the status.
    pub async fn admin_answer(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> (reqwest::StatusCode, Value) {
        let url = format!("http://{}/pvesim/{path}", self.sim.addr);
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = self
            .http
            .request(m, url)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json::<Value>().await.unwrap())
    }

    pub async fn vm(&self, vmid: u32) -> Value {
        self.admin("GET", &format!("vms/{vmid}"), "").await
    }

    /// Sets fault and latency knobs; an unknown knob fails the test.
    pub async fn knobs(&self, json: &str) {
        self.admin("POST", "knobs", json).await;
    }

    /// The faults pvesim has taken: a fault test proves its fault fired.
    pub fn faults(&self) -> pvesim::knobs::Faults {
        self.sim.faults()
    }

    /// A GET of the Proxmox API with the CSI token.
    pub async fn api(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.sim.api_url());
        let r = self
            .http
            .get(url)
            .header(
                "Authorization",
                format!("PVEAPIToken=kubernetes-csi@pve!csi={SECRET}"),
            )
            .send()
            .await
            .unwrap();
        r.json::<Value>().await.unwrap()["data"].clone()
    }

    /// A write to the Proxmox API with the CSI token, as an operator
    /// clicking in the UI would make it behind the controller's back.
    pub async fn api_write(&self, method: &str, path: &str, form: &[(&str, &str)]) -> Value {
        let url = format!("{}{path}", self.sim.api_url());
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = self
            .http
            .request(m, url)
            .header(
                "Authorization",
                format!("PVEAPIToken=kubernetes-csi@pve!csi={SECRET}"),
            )
            .form(form)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{method} {path}: {}", r.status());
        r.json::<Value>().await.unwrap()["data"].clone()
    }

    pub async fn calls(&self) -> u64 {
        let c = self.admin("GET", "counters", "").await;
        c.as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum()
    }
}

/// The claim behind a volume named `name` (`pvc-<uid>`, as the provisioner
/// names volumes; another name becomes `pvc-<name>`).
pub fn claim(name: &str, bytes: i64) -> provisioner::Claim {
    provisioner::Claim::new(name, name.strip_prefix("pvc-").unwrap_or(name), bytes)
}

/// CreateVolume as the external-provisioner sends it for a claim of
/// `bytes` with a StorageClass of `params`, the pod's node in `zone` (or
/// only the region). An empty `name` is a malformed request no caller
/// sends, for the spec's checks.
pub fn create_req(
    name: &str,
    bytes: i64,
    params: &[(&str, &str)],
    zone: Option<&str>,
) -> csi::CreateVolumeRequest {
    let mut r = provision_req(&claim(name, bytes), params, zone);
    if name.is_empty() {
        r.name.clear();
    }
    r
}

/// CreateVolume as the provisioner sends it for `claim`.
fn provision_req(
    claim: &provisioner::Claim,
    params: &[(&str, &str)],
    zone: Option<&str>,
) -> csi::CreateVolumeRequest {
    let mut term = vec![("topology.kubernetes.io/region", "region-1")];
    if let Some(z) = zone {
        term.push(("topology.kubernetes.io/zone", z));
    }
    let requirement = provisioner::requirement(&[&term], 0);
    provisioner::create_volume(
        &provisioner::StorageClass::new(params),
        claim,
        Some(requirement),
    )
}

/// A 1 GiB volume of a class of `params`, the pod's node in `zone`.
pub async fn create_in(
    e: &Env,
    name: &str,
    params: &[(&str, &str)],
    zone: Option<&str>,
) -> csi::Volume {
    created(&e.svc, create_req(name, 1 << 30, params, zone)).await
}

pub async fn create(e: &Env, name: &str, zone: Option<&str>) -> csi::Volume {
    created(
        &e.svc,
        create_req(
            name,
            1 << 30,
            &[("storage", "local-lvm"), ("ssd", "1")],
            zone,
        ),
    )
    .await
}

/// The PersistentVolume the provisioner writes for `v` (its
/// volumeAttributes: the provisioner's identity key and the context).
pub fn pv_of(v: &csi::Volume) -> callers::PersistentVolume {
    let name = v
        .volume_id
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .trim_start_matches("vm-9999-")
        .to_string();
    provisioner::persistent_volume(
        &provisioner::StorageClass::default(),
        &claim(&name, v.capacity_bytes),
        v,
    )
}

/// ControllerPublish as the external-attacher sends it for `v`'s PV.
pub fn publish_req(v: &csi::Volume, node: &str) -> csi::ControllerPublishVolumeRequest {
    attacher::controller_publish(&pv_of(v), node)
}

/// The PV of a volume known only by its handle (one deleted or never made).
pub fn pv_id(handle: &str) -> callers::PersistentVolume {
    pv_of(&csi::Volume {
        volume_id: handle.into(),
        capacity_bytes: 1 << 30,
        ..Default::default()
    })
}

/// DeleteVolume as the provisioner sends it for `v`'s PV.
pub fn delete_req(v: &csi::Volume) -> csi::DeleteVolumeRequest {
    provisioner::delete_volume(&pv_of(v))
}

/// ControllerExpandVolume as the external-resizer sends it for `v`'s PV.
pub fn expand_req(v: &csi::Volume, bytes: i64) -> csi::ControllerExpandVolumeRequest {
    callers::resizer::controller_expand(&pv_of(v), bytes)
}

pub fn unpublish_req(v: &csi::Volume, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    attacher::controller_unpublish(&pv_of(v), node)
}

/// The documented role for snapshots and clones: the minimal one plus the
/// helper-VM privileges (copy VMs) and VM.Clone (import-from).
pub const COPY_ROLE: &str = "[VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Clone, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]";

/// CreateVolume as the provisioner sends it for a claim with a dataSource
/// (a VolumeSnapshot's handle, or a source PV's).
pub fn from_source(
    source: csi::volume_content_source::Type,
    name: &str,
    bytes: i64,
    params: &[(&str, &str)],
    zone: Option<&str>,
) -> csi::CreateVolumeRequest {
    let mut claim = claim(name, bytes);
    claim.data_source = Some(source);
    provision_req(&claim, params, zone)
}

/// CreateSnapshot as the external-snapshotter sends it for the
/// VolumeSnapshot whose uid makes `name` (`snapshot-<uid>`) of the volume
/// `source`.
pub fn snap_req(name: &str, source: &str) -> csi::CreateSnapshotRequest {
    let v = csi::Volume {
        volume_id: source.into(),
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    let uid = name.strip_prefix("snapshot-").unwrap_or(name);
    callers::snapshotter::create_snapshot(uid, uid, &pv_of(&v), &[])
}

pub async fn create_snapshot(e: &Env, name: &str, source: &str) -> csi::Snapshot {
    e.svc
        .create_snapshot(Request::new(snap_req(name, source)))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

/// Calls CreateSnapshot until the snapshot is ready, as the snapshotter
/// does; the answers seen.
pub async fn until_ready(e: &Env, name: &str, source: &str) -> Vec<csi::Snapshot> {
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        let s = create_snapshot(e, name, source).await;
        let ready = s.ready_to_use;
        seen.push(s);
        if ready {
            return seen;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "snapshot never became ready: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Calls CreateVolume again while it answers Aborted (a copy still
/// running), as the provisioner does; the volume.
pub async fn until_created(e: &Env, req: csi::CreateVolumeRequest) -> csi::Volume {
    let started = std::time::Instant::now();
    loop {
        match e.svc.create_volume(Request::new(req.clone())).await {
            Err(s)
                if s.code() == tonic::Code::Aborted
                    && started.elapsed() < Duration::from_secs(30) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r => return r.unwrap().into_inner().volume.unwrap(),
        }
    }
}

/// The VMID of the copy VM a snapshot id of this driver names
/// (`…/snapshot-vm-<vmid>[.<mark>]`).
pub fn copy_vmid(snapshot_id: &str) -> u32 {
    snapshot_id
        .rsplit("snapshot-vm-")
        .next()
        .and_then(|rest| rest.split('.').next())
        .and_then(|vmid| vmid.parse().ok())
        .unwrap_or_else(|| panic!("{snapshot_id} names no copy VM"))
}

/// pvesim's VMs named `name`, as its admin API lists them.
pub async fn vms_named(e: &Env, name: &str) -> Vec<Value> {
    let all = e.admin("GET", "vms", "").await;
    all.as_array()
        .unwrap()
        .iter()
        .filter(|v| v["config"]["name"] == name)
        .cloned()
        .collect()
}

/// Every volume pvesim holds (`<storage>:<name>`).
pub async fn volumes(e: &Env) -> Vec<String> {
    let vols = e.admin("GET", "volumes", "").await;
    vols.as_array()
        .unwrap()
        .iter()
        .map(|v| v["volid"].as_str().unwrap().to_string())
        .collect()
}
