//! A volume's life as Kubernetes drives it, every request built by its real
//! sender's builder (tests/callers): the provisioner creates and writes the
//! PV, the attacher publishes from the PV (its volumeAttributes carry the
//! provisioner's identity key, and here also the Go driver's extra keys, as
//! a PV made by the Go driver has), kubelet stages and publishes on its own
//! paths, the resizer and kubelet grow it, the attacher's reconcile finds it
//! published to NodeGetInfo's node id, and everything is undone in
//! kubelet's order. The controller runs on pvesim; the node plugin and hostd
//! on this host, the disk reaching them as a loop device.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;
use std::path::Path;

use callers::kubelet::{Kubelet, Pod};
use callers::{attacher, provisioner, resizer, snapshotter};
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_client::ControllerClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use testkit::lab::{Lab, settle};
use tonic::Code;
use tonic::transport::Channel;

fn mkdirs(dirs: Vec<String>) {
    for d in dirs {
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{d}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_through_kubernetes_callers() {
    testkit::require_root!();
    let lab = Lab::start("local-lvm", "lvmthin").await.unwrap();
    let result = life(&lab).await;
    if let Err(e) = result {
        panic!("{e}\n{}", lab.logs());
    }
    monitored(&lab);
    drop(lab);
    settle();
}

/// The CSI error of `what`, as a test failure.
fn status(what: &'static str) -> impl Fn(tonic::Status) -> String {
    move |s: tonic::Status| format!("{what}: {:?} {}", s.code(), s.message())
}

/// Clients of the controller and the node plugin, and the node as it
/// registers: NodeGetInfo's id (CSINode's) and its topology term.
async fn connect(
    lab: &Lab,
) -> Result<
    (
        ControllerClient<Channel>,
        NodeClient<Channel>,
        csi::NodeGetInfoResponse,
    ),
    String,
> {
    let ctl_ch = proxmox_csi_common::client::unix_channel(lab.controller_socket.clone())
        .await
        .map_err(|e| e.to_string())?;
    let node_ch = proxmox_csi_common::client::unix_channel(lab.node_socket().to_path_buf())
        .await
        .map_err(|e| e.to_string())?;
    let mut node = NodeClient::new(node_ch);
    let info = node
        .node_get_info(callers::identity::node_get_info())
        .await
        .map_err(status("NodeGetInfo"))?
        .into_inner();
    Ok((ControllerClient::new(ctl_ch), node, info))
}

/// kubelet mounting a volume for a pod: the staging directory, NodeStage,
/// the target's parent, NodePublish.
async fn stage_and_publish(
    node: &mut NodeClient<Channel>,
    kubelet: &Kubelet,
    pv: &callers::PersistentVolume,
    pod: &Pod,
    published: &HashMap<String, String>,
) -> Result<(), String> {
    mkdirs(kubelet.stage_dirs(pv));
    node.node_stage_volume(kubelet.node_stage(pv, published, HashMap::new()))
        .await
        .map_err(status("NodeStageVolume"))?;
    mkdirs(kubelet.publish_dirs(pod, pv));
    node.node_publish_volume(kubelet.node_publish(pv, pod, published))
        .await
        .map_err(status("NodePublishVolume"))?;
    Ok(())
}

async fn life(lab: &Lab) -> Result<(), String> {
    // The node registers: its id goes into CSINode, its topology onto the Node.
    let (mut ctl, mut node, info) = connect(lab).await?;
    let segments = info
        .accessible_topology
        .clone()
        .unwrap_or_default()
        .segments;
    let term: Vec<(&str, &str)> = segments
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();

    // The provisioner: a StorageClass with the legacy `fstype` key, a key
    // no driver reads (taken as the Go driver does, with a warning) and
    // mount options.
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("ssd", "true"),
        ("fstype", "xfs"),
        ("tier", "gold"),
    ])
    .mount_options(&["noatime"]);
    let claim = provisioner::Claim::new("data", "7d1c5a9e-2b4f-4c8e-9a61-3f0e8d2c1b7a", 1 << 30);
    let create =
        provisioner::create_volume(&sc, &claim, Some(provisioner::requirement(&[&term], 0)));
    let volume = ctl
        .create_volume(create)
        .await
        .map_err(status("CreateVolume"))?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let mut pv = provisioner::persistent_volume(&sc, &claim, &volume);
    // What a PV the Go driver made also carries (proxmox-csi-plugin pkg/csi/parameters.go).
    for (k, v) in [
        ("resizeRequired", "true"),
        ("resizeSizeBytes", "1073741824"),
        ("iops_rd", "100"),
        ("mbps_wr", "10"),
    ] {
        pv.attributes.insert(k.into(), v.into());
    }
    assert!(pv.attributes.contains_key(provisioner::IDENTITY_KEY));

    // The attacher, from the PV, to the node id of CSINode.
    let published = ctl
        .controller_publish_volume(attacher::controller_publish(&pv, &info.node_id))
        .await
        .map_err(status("ControllerPublishVolume"))?
        .into_inner()
        .publish_context;
    // Its reconcile: ListVolumes names the same node id, so nothing is
    // published again; its first Proxmox call meets a 5xx and is retried.
    lab.sim
        .set_knobs(r#"{"fail_5xx": 1}"#)
        .map_err(|e| e.to_string())?;
    let listed = ctl
        .list_volumes(attacher::list_volumes(""))
        .await
        .map_err(status("ListVolumes"))?
        .into_inner();
    if !attacher::published(&listed.entries, &pv.handle, &info.node_id) {
        return Err(format!(
            "ListVolumes does not show {} published to {}: {listed:?}",
            pv.handle, info.node_id
        ));
    }

    // kubelet: stage, publish, the pod writes.
    let kubelet = Kubelet::new(&lab.kubelet_root().display().to_string());
    let pod = Pod::new("4f2a9c1e-8b7d-4e3f-a2c1-0d9e8f7a6b5c");
    stage_and_publish(&mut node, &kubelet, &pv, &pod, &published).await?;
    let target = kubelet.target_path(&pod, &pv);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(target.as_str()))
        .ok_or("the target is not mounted")?;
    if line.split(' ').nth(2) != Some("xfs") || !line.contains("noatime") {
        return Err(format!(
            "the legacy fstype and the mount options were not applied: {line}"
        ));
    }
    let payload: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(Path::new(&target).join("data.bin"), &payload).map_err(|e| e.to_string())?;

    // The resizer grows it; kubelet grows the filesystem.
    let grown = ctl
        .controller_expand_volume(resizer::controller_expand(&pv, 2 << 30))
        .await
        .map_err(status("ControllerExpandVolume"))?
        .into_inner();
    if grown.capacity_bytes < 2 << 30 || !grown.node_expansion_required {
        return Err(format!("ControllerExpandVolume: {grown:?}"));
    }
    let expanded = node
        .node_expand_volume(kubelet.node_expand(&pv, &pod, 2 << 30, HashMap::new()))
        .await
        .map_err(status("NodeExpandVolume"))?
        .into_inner();
    if expanded.capacity_bytes < 2 << 30 {
        return Err(format!("NodeExpandVolume: {expanded:?}"));
    }
    let stats = node
        .node_get_volume_stats(kubelet.node_stats(&pv, &pod))
        .await
        .map_err(status("NodeGetVolumeStats"))?
        .into_inner();
    let total = stats.usage.first().map(|u| u.total).unwrap_or(0);
    if total < (19 << 30) / 10 {
        return Err(format!("the filesystem did not grow: {stats:?}"));
    }

    // Undone in kubelet's order, then the attacher, then the provisioner.
    node.node_unpublish_volume(kubelet.node_unpublish(&pv, &pod))
        .await
        .map_err(status("NodeUnpublishVolume"))?;
    node.node_unstage_volume(kubelet.node_unstage(&pv))
        .await
        .map_err(status("NodeUnstageVolume"))?;
    ctl.controller_unpublish_volume(attacher::controller_unpublish(&pv, &info.node_id))
        .await
        .map_err(status("ControllerUnpublishVolume"))?;
    let listed = ctl
        .list_volumes(attacher::list_volumes(""))
        .await
        .map_err(status("ListVolumes"))?
        .into_inner();
    if attacher::published(&listed.entries, &pv.handle, &info.node_id) {
        return Err("still listed as published after ControllerUnpublishVolume".into());
    }
    ctl.delete_volume(provisioner::delete_volume(&pv))
        .await
        .map_err(status("DeleteVolume"))?;
    let gone = ctl
        .validate_volume_capabilities(callers::sanity::validate_volume_capabilities(&pv))
        .await;
    match gone {
        Err(s) if s.code() == Code::NotFound => {}
        other => return Err(format!("the deleted volume still answers: {other:?}")),
    }
    // The controller logged the RPC that failed, with its method and code.
    let log = std::fs::read_to_string(lab.dir().join("controller.log")).unwrap_or_default();
    if !log.lines().any(|l| {
        l.contains("RPC failed")
            && l.contains("ValidateVolumeCapabilities")
            && l.contains("NotFound")
    }) {
        return Err("no log line for the failed ValidateVolumeCapabilities".into());
    }
    Ok(())
}

/// After a volume's whole life, the three binaries' `/metrics` hold every
/// series the chart's dashboard and alerts read, with the labels they use.
fn monitored(lab: &Lab) {
    let mut exposed = packaging::observability::Exposed::default();
    for (binary, port) in [
        ("controller", lab.controller_metrics),
        ("node plugin", lab.node.node_metrics),
        ("hostd", lab.node.hostd_metrics),
    ] {
        let text =
            packaging::observability::scrape(port).unwrap_or_else(|e| panic!("{binary}: {e}"));
        exposed
            .add(&text)
            .unwrap_or_else(|e| panic!("{binary}: {e}"));
    }
    // The retry of the failed call, and a stage's phases, were counted.
    for name in [
        "proxmox_csi_proxmox_api_retries_total",
        "proxmox_csi_hostd_stage_phase_duration_seconds_bucket",
        "proxmox_csi_attach_batch_size_count",
    ] {
        assert!(
            exposed.has(name),
            "{name} not served: {:?}",
            exposed.names().collect::<Vec<_>>()
        );
    }
    // Scraped through the chart's PodMonitor, no label is renamed.
    assert_eq!(
        exposed.target_label_clashes(),
        Vec::<String>::new(),
        "labels Prometheus renames when scraping through prometheus-operator"
    );
    let queries = packaging::observability::chart_queries().unwrap();
    assert!(queries.len() > 20, "{queries:?}");
    let problems: Vec<String> = queries
        .iter()
        .flat_map(|q| packaging::observability::problems(q, &exposed))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A raw block volume on kubelet's block layouts: staging
/// `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>` (kubelet makes
/// it), the pod's device file `…/volumeDevices/publish/<pv>/<pod uid>` (the
/// driver makes it; kubelet makes its parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_volume_through_kubernetes_callers() {
    testkit::require_root!();
    let lab = Lab::start("local-lvm", "lvmthin").await.unwrap();
    if let Err(e) = block_life(&lab).await {
        panic!("{e}\n{}", lab.logs());
    }
    drop(lab);
    settle();
}

async fn block_life(lab: &Lab) -> Result<(), String> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let (mut ctl, mut node, info) = connect(lab).await?;
    let segments = info
        .accessible_topology
        .clone()
        .unwrap_or_default()
        .segments;
    let term: Vec<(&str, &str)> = segments
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();

    let sc = provisioner::StorageClass::new(&[("storage", "local-lvm")]);
    let claim =
        provisioner::Claim::new("raw", "0a7c2e94-5d1b-4f3a-8c6e-9b2d1f0e4a73", 1 << 30).block();
    let create =
        provisioner::create_volume(&sc, &claim, Some(provisioner::requirement(&[&term], 0)));
    let volume = ctl
        .create_volume(create)
        .await
        .map_err(status("CreateVolume"))?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let pv = provisioner::persistent_volume(&sc, &claim, &volume);
    let published = ctl
        .controller_publish_volume(attacher::controller_publish(&pv, &info.node_id))
        .await
        .map_err(status("ControllerPublishVolume"))?
        .into_inner()
        .publish_context;

    let kubelet = Kubelet::new(&lab.kubelet_root().display().to_string());
    let pod = Pod::new("9c3e1a7b-2f4d-4b8e-a6c5-1d0f9e8b7a62");
    stage_and_publish(&mut node, &kubelet, &pv, &pod, &published).await?;
    // The pod's device: bytes written at 100 MiB are there when read back.
    let target = kubelet.target_path(&pod, &pv);
    let mut dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&target)
        .map_err(|e| format!("{target}: {e}"))?;
    let pattern = b"proxmox-csi block volume";
    dev.seek(SeekFrom::Start(100 << 20))
        .and_then(|_| dev.write_all(pattern))
        .and_then(|_| dev.sync_all())
        .map_err(|e| e.to_string())?;
    let mut back = vec![0u8; pattern.len()];
    dev.seek(SeekFrom::Start(100 << 20))
        .and_then(|_| dev.read_exact(&mut back))
        .map_err(|e| e.to_string())?;
    drop(dev);
    if back != pattern {
        return Err("the block device did not keep its bytes".into());
    }

    node.node_unpublish_volume(kubelet.node_unpublish(&pv, &pod))
        .await
        .map_err(status("NodeUnpublishVolume"))?;
    if Path::new(&target).exists() {
        return Err(format!("{target} is still there after NodeUnpublishVolume"));
    }
    node.node_unstage_volume(kubelet.node_unstage(&pv))
        .await
        .map_err(status("NodeUnstageVolume"))?;
    ctl.controller_unpublish_volume(attacher::controller_unpublish(&pv, &info.node_id))
        .await
        .map_err(status("ControllerUnpublishVolume"))?;
    ctl.delete_volume(provisioner::delete_volume(&pv))
        .await
        .map_err(status("DeleteVolume"))?;
    Ok(())
}

// The whole life on every storage type pvesim models: create, publish,
// grow online, detach, grow offline, snapshot, restore, clone, delete; the
// bytes written first are found in the restored and the cloned volume, and
// nothing is left on Proxmox afterwards.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_life_on_lvmthin() {
    whole_life_on("local-lvm", "lvmthin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_life_on_lvm_with_volume_chains() {
    whole_life_on("san", "lvm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_life_on_zfspool() {
    whole_life_on("local-zfs", "zfspool").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_life_on_shared_rbd() {
    whole_life_on("ceph", "rbd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_life_on_dir() {
    whole_life_on("local", "dir").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_life_on_shared_nfs() {
    whole_life_on("nfs", "nfs").await;
}

async fn whole_life_on(storage: &str, kind: &str) {
    testkit::require_root!();
    let lab = Lab::start(storage, kind).await.unwrap();
    if let Err(e) = whole_life(&lab, storage).await {
        panic!("{kind}: {e}\n{}", lab.logs());
    }
    drop(lab);
    settle();
}

/// kubelet and the attacher taking a volume off the node.
async fn take_down(
    ctl: &mut ControllerClient<Channel>,
    node: &mut NodeClient<Channel>,
    kubelet: &Kubelet,
    pv: &callers::PersistentVolume,
    pod: &Pod,
    node_id: &str,
) -> Result<(), String> {
    node.node_unpublish_volume(kubelet.node_unpublish(pv, pod))
        .await
        .map_err(status("NodeUnpublishVolume"))?;
    node.node_unstage_volume(kubelet.node_unstage(pv))
        .await
        .map_err(status("NodeUnstageVolume"))?;
    ctl.controller_unpublish_volume(attacher::controller_unpublish(pv, node_id))
        .await
        .map_err(status("ControllerUnpublishVolume"))?;
    Ok(())
}

/// The provisioner's CreateVolume, called again unchanged while the answer
/// is retryable (a copy still running), and the PV it then writes.
async fn provision(
    ctl: &mut ControllerClient<Channel>,
    sc: &provisioner::StorageClass,
    claim: &provisioner::Claim,
    term: &[(&str, &str)],
) -> Result<callers::PersistentVolume, String> {
    let req = provisioner::create_volume(sc, claim, Some(provisioner::requirement(&[term], 0)));
    for _ in 0..300 {
        match ctl.create_volume(req.clone()).await {
            Ok(r) => {
                let volume = r.into_inner().volume.ok_or("no volume")?;
                return Ok(provisioner::persistent_volume(sc, claim, &volume));
            }
            Err(s)
                if matches!(
                    s.code(),
                    Code::Aborted | Code::Unavailable | Code::DeadlineExceeded
                ) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(s) => return Err(status("CreateVolume")(s)),
        }
    }
    Err(format!(
        "CreateVolume of {} never finished",
        claim.volume_name()
    ))
}

/// The bytes of `file` in the pod's volume.
fn digest(kubelet: &Kubelet, pv: &callers::PersistentVolume, pod: &Pod) -> Result<Vec<u8>, String> {
    std::fs::read(Path::new(&kubelet.target_path(pod, pv)).join("data.bin"))
        .map_err(|e| format!("{}: {e}", pv.name))
}

async fn whole_life(lab: &Lab, storage: &str) -> Result<(), String> {
    let (mut ctl, mut node, info) = connect(lab).await?;
    let segments = info
        .accessible_topology
        .clone()
        .unwrap_or_default()
        .segments;
    let term: Vec<(&str, &str)> = segments
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let kubelet = Kubelet::new(&lab.kubelet_root().display().to_string());
    // xfs: ext4 cannot grow online on this host (resize2fs needs CAP_SYS_RESOURCE there).
    let sc = provisioner::StorageClass::new(&[
        ("storage", storage),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ]);

    // Created, published, staged, written.
    let claim = provisioner::Claim::new("data", "3e5a7c9b-1d2f-4a6b-8c0e-2f4a6b8c0d1e", 1 << 30);
    let pv = provision(&mut ctl, &sc, &claim, &term).await?;
    let published = ctl
        .controller_publish_volume(attacher::controller_publish(&pv, &info.node_id))
        .await
        .map_err(status("ControllerPublishVolume"))?
        .into_inner()
        .publish_context;
    let pod = Pod::new("9b1d3f5a-7c9e-4b1d-a3f5-7c9e1b3d5f7a");
    stage_and_publish(&mut node, &kubelet, &pv, &pod, &published).await?;
    let payload: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(
        Path::new(&kubelet.target_path(&pod, &pv)).join("data.bin"),
        &payload,
    )
    .map_err(|e| e.to_string())?;

    // Grown online: the disk through the VM, the filesystem by the node.
    let grown = ctl
        .controller_expand_volume(resizer::controller_expand(&pv, 2 << 30))
        .await
        .map_err(status("ControllerExpandVolume (online)"))?
        .into_inner();
    if grown.capacity_bytes < 2 << 30 || !grown.node_expansion_required {
        return Err(format!("online ControllerExpandVolume: {grown:?}"));
    }
    node.node_expand_volume(kubelet.node_expand(&pv, &pod, 2 << 30, HashMap::new()))
        .await
        .map_err(status("NodeExpandVolume"))?;
    take_down(&mut ctl, &mut node, &kubelet, &pv, &pod, &info.node_id).await?;

    // Grown offline (through a holder VM), then a snapshot of the detached volume.
    let grown = ctl
        .controller_expand_volume(resizer::controller_expand(&pv, 3 << 30))
        .await
        .map_err(status("ControllerExpandVolume (offline)"))?
        .into_inner();
    if grown.capacity_bytes < 3 << 30 {
        return Err(format!("offline ControllerExpandVolume: {grown:?}"));
    }
    let take = snapshotter::create_snapshot(
        "5f7a9c1e-3b5d-4f7a-9c1e-3b5d7f9a1c3e",
        "data-snap",
        &pv,
        &[],
    );
    let mut snapshot = None;
    for _ in 0..300 {
        let s = ctl
            .create_snapshot(take.clone())
            .await
            .map_err(status("CreateSnapshot"))?
            .into_inner()
            .snapshot
            .ok_or("no snapshot")?;
        if s.ready_to_use {
            snapshot = Some(s);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let snapshot = snapshot.ok_or("the snapshot never became ready")?;

    // Restored from the snapshot and cloned from the volume: both have the bytes.
    let restored = provision(
        &mut ctl,
        &sc,
        // Larger than its source: its filesystem grows at stage.
        &provisioner::Claim::new("restored", "7a9c1e3b-5d7f-4a9c-8e3b-5d7f9a1c3e5b", 4 << 30)
            .from_snapshot(&snapshot.snapshot_id),
        &term,
    )
    .await?;
    let cloned = provision(
        &mut ctl,
        &sc,
        &provisioner::Claim::new("cloned", "1c3e5a7b-9d1f-4c3e-a7b9-d1f3c5e7a9b1", 3 << 30)
            .from_volume(&pv),
        &term,
    )
    .await?;
    for copy in [&restored, &cloned] {
        let pc = ctl
            .controller_publish_volume(attacher::controller_publish(copy, &info.node_id))
            .await
            .map_err(status("ControllerPublishVolume (copy)"))?
            .into_inner()
            .publish_context;
        stage_and_publish(&mut node, &kubelet, copy, &pod, &pc).await?;
        if digest(&kubelet, copy, &pod)? != payload {
            return Err(format!("{} does not have the source's bytes", copy.name));
        }
        let fs = nix::sys::statvfs::statvfs(Path::new(&kubelet.target_path(&pod, copy)))
            .map_err(|e| e.to_string())?;
        let bytes = fs.blocks() * fs.fragment_size();
        if bytes + (512 << 20) < copy.capacity_bytes as u64 {
            return Err(format!(
                "{}: a filesystem of {bytes} bytes on a volume of {}",
                copy.name, copy.capacity_bytes
            ));
        }
        take_down(&mut ctl, &mut node, &kubelet, copy, &pod, &info.node_id).await?;
    }

    // Deleted: nothing of any of it stays on Proxmox.
    for v in [&restored, &cloned, &pv] {
        ctl.delete_volume(provisioner::delete_volume(v))
            .await
            .map_err(status("DeleteVolume"))?;
    }
    ctl.delete_snapshot(snapshotter::delete_snapshot(&snapshot.snapshot_id))
        .await
        .map_err(status("DeleteSnapshot"))?;
    let (vms, volumes) = {
        let c = lab.sim.ctx.cluster();
        // Besides the workers, only the node's holder VM (offline growth)
        // may stay, holding nothing.
        let vms: Vec<String> =
            c.vms
                .values()
                .filter(|vm| ![112, 113].contains(&vm.vmid))
                .filter(|vm| {
                    let holder = vm
                        .config
                        .get("name")
                        .is_some_and(|n| n.starts_with("proxmox-csi-holder-"));
                    let holds = vm.config.keys().chain(vm.pending.keys()).any(|k| {
                        (k.starts_with("scsi") && k != "scsihw") || k.starts_with("unused")
                    });
                    !holder || holds
                })
                .map(|vm| format!("{} {:?}", vm.vmid, vm.config))
                .collect();
        let volumes: Vec<String> = c.volumes.values().flat_map(|m| m.keys().cloned()).collect();
        (vms, volumes)
    };
    if !vms.is_empty() || !volumes.is_empty() {
        return Err(format!("left behind: VMs {vms:?}, volumes {volumes:?}"));
    }
    Ok(())
}

/// The controller binary as deployed reads the UID of the namespace
/// kube-system and writes the cluster's id into the names of the disks it
/// creates (`.csf-<id>`: what `pvecsictl clean` attributes a disk by); the
/// volume still publishes, stages and deletes by that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployed_controller_names_new_disks_with_its_clusters_id() {
    testkit::require_root!();
    let lab = Lab::start_in_kubernetes(
        "local-lvm",
        "lvmthin",
        "5bc58ec7-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
    )
    .await
    .unwrap();
    let (mut ctl, mut node, info) = connect(&lab).await.unwrap();
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let claim = provisioner::Claim::new("marked", "6a1b2c3d-0000-4000-8000-00000000c1d0", 1 << 30);
    let volume = ctl
        .create_volume(provisioner::create_volume(&sc, &claim, None))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", lab.logs()))
        .into_inner()
        .volume
        .unwrap();
    let disk = volume.volume_id.rsplit('/').next().unwrap().to_string();
    assert!(
        disk.ends_with(".csf-5bc58ec71c2d"),
        "{disk}\n{}",
        lab.logs()
    );
    assert!(
        lab.logs().contains("new disks carry this cluster id"),
        "{}",
        lab.logs()
    );
    let pv = provisioner::persistent_volume(&sc, &claim, &volume);
    let pc = ctl
        .controller_publish_volume(attacher::controller_publish(&pv, &info.node_id))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let kubelet = Kubelet::new(&lab.kubelet_root().display().to_string());
    let pod = Pod::new("7d8e9f0a-1b2c-4d3e-8f40-5a6b7c8d9e0f");
    stage_and_publish(&mut node, &kubelet, &pv, &pod, &pc)
        .await
        .unwrap();
    node.node_unpublish_volume(kubelet.node_unpublish(&pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(kubelet.node_unstage(&pv))
        .await
        .unwrap();
    ctl.controller_unpublish_volume(attacher::controller_unpublish(&pv, &info.node_id))
        .await
        .unwrap();
    ctl.delete_volume(provisioner::delete_volume(&pv))
        .await
        .unwrap();
    let left: Vec<String> = lab
        .sim
        .ctx
        .cluster()
        .volumes
        .values()
        .flat_map(|m| m.keys().cloned())
        .filter(|n| n.contains("marked"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    settle();
}
