//! The lab every guest test starts from: a booted guest with hostd and the
//! node plugin, pvesim bound to it over QMP, a controller on that pvesim,
//! and a client of the node plugin once it is ready.

// Test harness: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::pve;
use proxmox_csi_controller::volume::ClusterId;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use tonic::transport::Channel;

use proxmox_csi_proto::csi::v1::controller_server::Controller as _;

use crate::guest::{Guest, Share, guest_cluster, qemu_present};
use testkit::requests::created;

/// The documented minimal role of the CSI token.
pub use testkit::sim::MINIMAL_ROLE;

/// A booted guest with pvesim and a controller bound to it, and a client of
/// the node plugin in the guest, ready (its Probe answers).
/// Bind every field: the ones left out would be dropped (pvesim stopped)
/// at once; [`Lab::parts`] gives the three a test works with and the rest.
#[allow(missing_debug_implementations)] // a guest VM and servers: nothing to print
pub struct Lab {
    pub g: Guest,
    pub images: tempfile::TempDir,
    pub sim: pvesim::Running,
    pub ctl: ControllerService,
    pub node: NodeClient<Channel>,
}

/// What a test keeps alive beside the guest, the controller and the node
/// plugin's client: pvesim and the disks' files.
#[allow(missing_debug_implementations)]
pub struct Held {
    pub sim: pvesim::Running,
    pub images: tempfile::TempDir,
}

/// The parts of a lab: `let Some((mut g, ctl, mut node, held)) = Lab::start(…).await.map(Lab::parts)`.
pub type Parts = (Guest, ControllerService, NodeClient<Channel>, Held);

impl Lab {
    pub fn parts(self) -> Parts {
        let Lab {
            g,
            images,
            sim,
            ctl,
            node,
        } = self;
        (g, ctl, node, Held { sim, images })
    }

    /// `None` (the test is skipped) where QEMU is not installed outside CI.
    pub async fn start(share: Share, role: &str) -> Option<Self> {
        Self::start_in(share, role, |cluster| cluster).await
    }

    /// Like `start`, on the cluster `edit` makes of the guest's cluster
    /// (`guest_cluster`'s YAML).
    pub async fn start_in(
        share: Share,
        role: &str,
        edit: impl FnOnce(String) -> String,
    ) -> Option<Self> {
        Self::start_with(share, role, edit, None).await
    }

    /// Like `start_in`, with a controller that writes `cluster_id` into
    /// the names of the disks it creates, as a deployed one does.
    pub async fn start_with(
        share: Share,
        role: &str,
        edit: impl FnOnce(String) -> String,
        cluster_id: Option<&str>,
    ) -> Option<Self> {
        if !qemu_present() {
            return None;
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut g = Guest::boot_with(share).await.expect("guest boots");
        let images = tempfile::tempdir().unwrap();
        let cluster = edit(guest_cluster(&g.qmp, role));
        let (sim, ctl) = setup_marked(&cluster, images.path(), cluster_id).await;
        let node = node_client(&mut g).await;
        Some(Self {
            g,
            images,
            sim,
            ctl,
            node,
        })
    }
}

pub async fn setup_with_role(
    g: &Guest,
    images: &std::path::Path,
    role: &str,
) -> (pvesim::Running, ControllerService) {
    setup_on(&guest_cluster(&g.qmp, role), images).await
}

/// pvesim on `cluster` (YAML), its disks' files in `images`, and a controller on it.
pub async fn setup_on(
    cluster: &str,
    images: &std::path::Path,
) -> (pvesim::Running, ControllerService) {
    setup_marked(cluster, images, None).await
}

/// `setup_on`, the controller's disk names carrying `cluster_id`.
pub async fn setup_marked(
    cluster: &str,
    images: &std::path::Path,
    cluster_id: Option<&str>,
) -> (pvesim::Running, ControllerService) {
    let sim = testkit::sim::plain_with(cluster, |s| s.volume_dir(images.to_path_buf()))
        .await
        .unwrap();
    let cfg = CloudConfig::parse(&testkit::sim::config_of(&sim)).unwrap();
    let mut controller = Controller::from_config(
        &cfg,
        Duration::from_secs(30),
        Default::default(),
        Duration::from_secs(60),
    )
    .unwrap();
    controller.cluster_id = cluster_id.map(|id| ClusterId::parse(id).unwrap());
    (sim, ControllerService(Arc::new(controller)))
}

/// A client of the node plugin in `g`, once its Probe says it and hostd
/// are ready. If that never happens, what the guest shows is in the panic.
pub async fn node_client(g: &mut Guest) -> NodeClient<Channel> {
    let port = g.csi_port;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let last = match tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
        {
            Ok(ch) => {
                // Ready when the node plugin answers and its Probe says hostd does.
                let mut probe =
                    proxmox_csi_proto::csi::v1::identity_client::IdentityClient::new(ch.clone());
                match probe.probe(callers::identity::probe()).await {
                    Ok(r) if r.get_ref().ready == Some(true) => return NodeClient::new(ch),
                    Ok(r) => format!("Probe: {:?}", r.into_inner()),
                    Err(e) => format!("Probe: {e}"),
                }
            }
            Err(e) => format!("connect to 127.0.0.1:{port}: {e}"),
        };
        if Instant::now() > deadline {
            let guest = g.sh("tail -5 /run/node.log; tail -5 /run/hostd.log; ps | grep -v ']$'; netstat -ltn 2>/dev/null").await.unwrap_or_default();
            panic!("the node plugin in the guest never answered ({last}); the guest:\n{guest}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The snapshotter's loop: CreateSnapshot, unchanged, until ready_to_use
/// (at most a minute here); the snapshot and how long it took.
pub async fn snapshot_when_ready(
    ctl: &ControllerService,
    req: &proxmox_csi_proto::csi::v1::CreateSnapshotRequest,
) -> (proxmox_csi_proto::csi::v1::Snapshot, Duration) {
    let t = Instant::now();
    loop {
        let s = ctl
            .create_snapshot(tonic::Request::new(req.clone()))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
        if s.ready_to_use {
            return (s, t.elapsed());
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "snapshot never ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The attacher: ControllerPublish of `pv` to `node_id`; the publish context.
pub async fn attach(
    ctl: &ControllerService,
    pv: &callers::PersistentVolume,
    node_id: &str,
) -> std::collections::HashMap<String, String> {
    ctl.controller_publish_volume(tonic::Request::new(callers::attacher::controller_publish(
        pv, node_id,
    )))
    .await
    .unwrap()
    .into_inner()
    .publish_context
}

pub async fn detach(ctl: &ControllerService, pv: &callers::PersistentVolume, node_id: &str) {
    ctl.controller_unpublish_volume(tonic::Request::new(
        callers::attacher::controller_unpublish(pv, node_id),
    ))
    .await
    .unwrap();
}

/// The directories kubelet makes before a call, made in the guest.
pub async fn mkdirs(g: &mut Guest, dirs: Vec<String>) {
    let quoted: Vec<String> = dirs.iter().map(|d| format!("'{d}'")).collect();
    g.sh(&format!("mkdir -p {}", quoted.join(" ")))
        .await
        .unwrap();
}

/// The provisioner: CreateVolume for `claim` with the pod's node on pve2
/// (delayed binding), and the PV it writes.
pub async fn provision(
    ctl: &ControllerService,
    sc: &callers::provisioner::StorageClass,
    claim: &callers::provisioner::Claim,
) -> callers::PersistentVolume {
    use callers::provisioner;
    let term = [
        ("topology.kubernetes.io/region", "region-1"),
        ("topology.kubernetes.io/zone", "pve2"),
    ];
    let req = provisioner::create_volume(sc, claim, Some(provisioner::requirement(&[&term], 0)));
    let volume = created(ctl, req).await;
    provisioner::persistent_volume(sc, claim, &volume)
}

/// A Proxmox client with the CSI token, as the Go driver's controller
/// calls the API (the test's hand behind this driver's back).
pub fn token_client(sim: &pvesim::Running) -> pve::Client {
    let cfg = CloudConfig::parse(&testkit::sim::config_of(sim)).unwrap();
    pve::Client::new(
        cfg.clusters.into_iter().next().unwrap(),
        Duration::from_secs(30),
        Default::default(),
    )
    .unwrap()
}

/// `pv`'s disk attached to the guest (VM 112) at `scsi<slot>` as the Go
/// driver attaches it (its pkg/csi/utils.go attachVolume: the LUN's WWN
/// `wwn`, no serial); the publish context the Go controller answers.
pub async fn attach_without_serial(
    sim: &pvesim::Running,
    pv: &callers::PersistentVolume,
    slot: u32,
    wwn: &str,
) -> std::collections::HashMap<String, String> {
    let client = token_client(sim);
    let d = pve::Deadline::after(Duration::from_secs(60));
    let parts: Vec<&str> = pv.handle.split('/').collect();
    let upid: String = client
        .call(
            reqwest::Method::POST,
            "/nodes/pve2/qemu/112/config",
            &[(
                format!("scsi{slot}").as_str(),
                format!("{}:{},backup=0,wwn={wwn}", parts[2], parts[3]),
            )],
            d,
        )
        .await
        .unwrap();
    client.wait_task(&upid, d).await.unwrap();
    std::collections::HashMap::from([
        (
            proxmox_csi_common::contract::CTX_WWN.to_string(),
            wwn.to_string(),
        ),
        ("lun".to_string(), slot.to_string()),
    ])
}

/// hostd restarted in the guest with `args` (its `/run/hostd.args`); its
/// command line once it serves again.
pub async fn restart_hostd(g: &mut Guest, args: &str) -> String {
    g.sh(&format!(
        "echo '{args}' > /run/hostd.args; kill $(pidof proxmox-csi-hostd); \
         while pidof proxmox-csi-hostd >/dev/null; do sleep 0.1; done; start-hostd & \
         n=0; until [ $(grep -c 'serving hostd' /run/hostd.log) -ge 2 ]; do sleep 0.1; n=$((n+1)); [ $n -gt 300 ] && break; done; \
         pidof proxmox-csi-hostd && tr '\\0' ' ' < /proc/$(pidof proxmox-csi-hostd)/cmdline"
    ))
    .await
    .unwrap()
}
