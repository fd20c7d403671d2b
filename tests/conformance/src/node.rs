//! Node clauses, against the node plugin (uid 65534, no capabilities) and
//! hostd on loop devices: a volume's "WWN" names the loop device backed by
//! `<images>/<wwn>.raw`, as with the hostd test resolver. Needs root.

use std::collections::HashMap;
use std::path::Path;

use callers::kubelet::{Kubelet, Pod};
use callers::{PersistentVolume, provisioner};
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use proxmox_csi_proto::csi::v1::node_service_capability::rpc::Type as NodeRpc;
use proxmox_csi_proto::csi::v1::volume_capability::AccessType;
use tonic::Code;
use tonic::transport::Channel;

use testkit::node::LoopNode;

use crate::{Report, ensure, expect_code, ok};

const VOL: &str = "region-1/pve2/local-lvm/vm-9999-pvc-conf";
/// A volume id the driver never gave out: the one field the NOT_FOUND
/// clauses change in kubelet's request for the real volume.
const NEVER: &str = "region-1/pve2/local-lvm/vm-9999-pvc-never";
/// The size of a loop disk (`NodeHost::disk`).
const DISK_BYTES: i64 = 320 << 20;
/// The pods using the volume (kubelet's pod uids): read-write, read-only, and one it never reached.
const POD_A: &str = "5b0e3f7c-2d9a-4c61-8e4f-1a7b9c3d5e20";
const POD_RO: &str = "9c4d1e8a-6f2b-4a73-b5d0-3e8f7a1c2b64";
const POD_NONE: &str = "e1a7c3f9-4b8d-4e2a-9c06-7d5f2b8e1a39";

/// hostd and the node plugin on loop devices.
pub type Target = LoopNode;

/// Starts hostd (LUKS keys derived cheaply: the clauses are not about
/// PBKDF cost) and the node plugin.
pub async fn start() -> Result<Target, String> {
    LoopNode::start(&["--luks-pbkdf", "pbkdf2:1000"]).await
}

/// Where the node plugin runs: how a disk reaches it and how its files and
/// mounts are seen. Loop devices on this host, or a guest VM.
#[allow(async_fn_in_trait)]
pub trait NodeHost {
    /// A new disk reaching the node.
    async fn disk(&mut self, n: u32) -> Result<Disk, String>;
    /// kubelet's root directory there.
    fn kubelet_root(&self) -> String;
    async fn mkdir(&mut self, path: &str) -> Result<(), String>;
    async fn is_dir(&mut self, path: &str) -> bool;
    async fn exists(&mut self, path: &str) -> bool;
    async fn mounted(&mut self, path: &str) -> bool;
    /// Writes `data` to the file `path`; the error text on failure.
    async fn write(&mut self, path: &str, data: &str) -> Result<(), String>;
    async fn read(&mut self, path: &str) -> Option<String>;
}

/// A disk attached to the node: the volume it belongs to, and the publish
/// context ControllerPublishVolume answered for it (the VolumeAttachment's
/// attachmentMetadata kubelet passes on).
#[derive(Debug, Clone)]
pub struct Disk {
    pub volume_id: String,
    pub publish_context: HashMap<String, String>,
}

impl NodeHost for Target {
    /// A loop device named by its "WWN"; it is volume `VOL`'s.
    async fn disk(&mut self, n: u32) -> Result<Disk, String> {
        let wwn = self.loop_disk(n, DISK_BYTES as u64)?;
        Ok(Disk {
            volume_id: VOL.into(),
            publish_context: publish_context(&wwn),
        })
    }

    fn kubelet_root(&self) -> String {
        self.root.display().to_string()
    }

    async fn mkdir(&mut self, path: &str) -> Result<(), String> {
        std::fs::create_dir_all(path).map_err(|e| e.to_string())
    }

    async fn is_dir(&mut self, path: &str) -> bool {
        Path::new(path).is_dir()
    }

    async fn exists(&mut self, path: &str) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }

    async fn mounted(&mut self, path: &str) -> bool {
        mounted(path).is_some()
    }

    async fn write(&mut self, path: &str, data: &str) -> Result<(), String> {
        std::fs::write(path, data).map_err(|e| e.to_string())
    }

    async fn read(&mut self, path: &str) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

/// The PersistentVolume of the disk's volume: what the provisioner writes
/// for it (an ext4 StorageClass, a ReadWriteOnce claim).
fn volume_pv(volume_id: &str) -> PersistentVolume {
    volume_pv_for(volume_id, &[callers::AccessMode::ReadWriteOnce])
}

/// The same for a claim with the access modes `modes`.
fn volume_pv_for(volume_id: &str, modes: &[callers::AccessMode]) -> PersistentVolume {
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let claim = provisioner::Claim::new("conf", "conf", DISK_BYTES).access(modes);
    provisioner::persistent_volume(
        &sc,
        &claim,
        &csi::Volume {
            volume_id: volume_id.into(),
            capacity_bytes: DISK_BYTES,
            ..Default::default()
        },
    )
}

/// What ControllerPublishVolume answered for the disk (the
/// VolumeAttachment's attachmentMetadata): the WWN the node finds it by.
fn publish_context(wwn: &str) -> HashMap<String, String> {
    HashMap::from([("wwn".into(), format!("0x{wwn}"))])
}

/// Makes the directories kubelet makes before a call (the CO's job).
async fn mkdirs<H: NodeHost>(h: &mut H, dirs: Vec<String>) {
    for d in dirs {
        let _ = h.mkdir(&d).await;
    }
}

fn mounted(p: &str) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&p)).then(|| f.get(5).map(|s| s.to_string()).unwrap_or_default())
    })
}

/// Runs every Node clause on this host's loop devices. Needs root.
pub async fn run(report: &mut Report) {
    let mut t = match start().await {
        Ok(t) => t,
        Err(e) => return report.clause("Node: the node plugin and hostd start", Err(e)),
    };
    identity(&t, report).await;
    let mut node = t.node.clone();
    run_with(&mut t, &mut node, report).await;
    report.clause(
        "Node: the node plugin runs unprivileged (uid and gid 65534, no capability, no new privileges) and every call hostd served came from it",
        unprivileged(&t),
    );
}

/// The node plugin's Identity service, on its own socket as kubelet and
/// the registrar reach it.
async fn identity(t: &Target, r: &mut Report) {
    let socket = t.dir.path().join("sockets/csi.sock");
    let mut id = match proxmox_csi_common::client::unix_channel(socket).await {
        Ok(ch) => IdentityClient::new(ch),
        Err(e) => return r.clause("Identity (node plugin): connects", Err(e.to_string())),
    };
    let info = ok(id
        .get_plugin_info(callers::identity::get_plugin_info())
        .await)
    .map(|x| x.into_inner());
    r.clause(
        "GetPluginInfo (node plugin): name MUST follow domain name notation and be at most 63 characters, and vendor_version MUST be set",
        info.and_then(|i| {
            crate::check_plugin_name(&i.name).and(ensure(!i.vendor_version.is_empty(), || {
                "empty vendor_version".into()
            }))
        }),
    );
    r.clause(
        "Probe (node plugin): answers OK",
        ok(id.probe(callers::identity::probe()).await).map(|_| ()),
    );
    r.clause(
        "GetPluginCapabilities (node plugin): every capability is a service or volume expansion type the spec defines",
        ok(id
            .get_plugin_capabilities(callers::identity::get_plugin_capabilities())
            .await)
        .and_then(|c| crate::check_plugin_capabilities(&c.into_inner().capabilities)),
    );
}

/// What the kernel says of the node plugin's process, and whose calls
/// hostd's audit lines record: not what the plugin says of itself.
fn unprivileged(t: &Target) -> Result<(), String> {
    let pid = t.node_pid();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
    if exe.file_name() != Some(std::ffi::OsStr::new("proxmox-csi-node")) {
        return Err(format!("process {pid} is {}", exe.display()));
    }
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let want: [(&str, &[&str]); 7] = [
        ("Uid", &["65534"; 4]),
        ("Gid", &["65534"; 4]),
        ("Groups", &[]),
        ("CapEff", &["0000000000000000"]),
        ("CapPrm", &["0000000000000000"]),
        ("CapBnd", &["0000000000000000"]),
        ("NoNewPrivs", &["1"]),
    ];
    for (name, value) in want {
        if field(name) != value {
            return Err(format!("{name}: {:?}, want {value:?}", field(name)));
        }
    }
    let hostd = t.hostd_log();
    let audited: Vec<&str> = hostd.lines().filter(|l| l.contains("peer_uid=")).collect();
    if audited.is_empty() {
        return Err("hostd audited no call".into());
    }
    if let Some(other) = audited.iter().find(|l| !l.contains("peer_uid=65534")) {
        return Err(format!("a call from another uid: {other}"));
    }
    let log = t.node_log();
    ensure(!log.contains("hostd is not reachable"), || {
        log.lines().last().unwrap_or_default().to_string()
    })
}

/// Runs every Node clause against `node`, running on `host`.
pub async fn run_with<H: NodeHost>(
    host: &mut H,
    node: &mut NodeClient<Channel>,
    report: &mut Report,
) {
    info(node, report).await;
    let disk = match host.disk(1).await {
        Ok(d) => d,
        Err(e) => return report.clause("Node: a disk to stage", Err(e)),
    };
    stage_clauses(host, node, report, &disk).await;
}

async fn info(n: &mut NodeClient<Channel>, r: &mut Report) {
    let info =
        ok(n.node_get_info(callers::identity::node_get_info()).await).map(|x| x.into_inner());
    r.clause(
        "NodeGetInfo: node_id is set and max_volumes_per_node is not negative",
        info.as_ref().map_err(Clone::clone).and_then(|i| {
            ensure(!i.node_id.is_empty() && i.max_volumes_per_node >= 0, || {
                format!("{i:?}")
            })
        }),
    );
    r.clause(
        "NodeGetInfo: accessible_topology is set, as the plugin has VOLUME_ACCESSIBILITY_CONSTRAINTS",
        info.and_then(|i| ensure(i.accessible_topology.is_some_and(|x| x.segments.get("topology.kubernetes.io/zone").is_some_and(|z| z == "pve2")), || "no zone".into())),
    );
    // Each capability's RPC type as sent, a number.
    let raw: Vec<Option<i32>> = match ok(n
        .node_get_capabilities(callers::identity::node_get_capabilities())
        .await)
    {
        Ok(c) => c
            .into_inner()
            .capabilities
            .iter()
            .map(|c| {
                c.r#type
                    .as_ref()
                    .map(|csi::node_service_capability::Type::Rpc(x)| x.r#type)
            })
            .collect(),
        Err(e) => return r.clause("NodeGetCapabilities: answers", Err(e)),
    };
    let unknown: Vec<&Option<i32>> = raw
        .iter()
        .filter(|t| !t.is_some_and(|n| NodeRpc::try_from(n).is_ok_and(|x| x != NodeRpc::Unknown)))
        .collect();
    r.clause(
        "NodeGetCapabilities: every capability is an RPC type the spec defines",
        ensure(unknown.is_empty(), || format!("unknown types {unknown:?}")),
    );
    let caps: Vec<NodeRpc> = raw
        .iter()
        .flatten()
        .filter_map(|n| NodeRpc::try_from(*n).ok())
        .collect();
    r.clause(
        "NodeGetCapabilities: STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS and EXPAND_VOLUME, which the plugin implements",
        ensure([NodeRpc::StageUnstageVolume, NodeRpc::GetVolumeStats, NodeRpc::ExpandVolume].iter().all(|c| caps.contains(c)), || format!("{caps:?}")),
    );
}

async fn stage_clauses<H: NodeHost>(
    h: &mut H,
    n: &mut NodeClient<Channel>,
    r: &mut Report,
    disk: &Disk,
) {
    let kubelet = Kubelet::new(&h.kubelet_root());
    let pv = volume_pv(&disk.volume_id);
    let pc = disk.publish_context.clone();
    let pod = Pod::new(POD_A);
    mkdirs(h, kubelet.stage_dirs(&pv)).await;
    mkdirs(h, kubelet.publish_dirs(&pod, &pv)).await;
    let staging = kubelet.staging_path(&pv);
    let target = kubelet.target_path(&pod, &pv);
    let stage = kubelet.node_stage(&pv, &pc, HashMap::new());
    // The spec's missing-field cases: kubelet's request, one field then removed.
    for (field, req) in [
        ("volume_id", {
            let mut q = stage.clone();
            q.volume_id.clear();
            q
        }),
        ("staging_target_path", {
            let mut q = stage.clone();
            q.staging_target_path.clear();
            q
        }),
        ("volume_capability", {
            let mut q = stage.clone();
            q.volume_capability = None;
            q
        }),
    ] {
        r.clause(
            &format!("NodeStageVolume: a missing {field} is INVALID_ARGUMENT"),
            expect_code(n.node_stage_volume(req).await, Code::InvalidArgument),
        );
    }
    r.clause(
        "NodeUnstageVolume: a volume not staged at the path answers OK",
        ok(n.node_unstage_volume(kubelet.node_unstage(&pv)).await).map(|_| ()),
    );
    let first = ok(n.node_stage_volume(stage.clone()).await);
    let is_mounted = h.mounted(&staging).await;
    r.clause(
        "NodeStageVolume: the volume is staged at staging_target_path (mounted there)",
        first.and_then(|_| ensure(is_mounted, || format!("nothing mounted at {staging}"))),
    );
    r.clause(
        "NodeStageVolume: staging again with the same arguments answers OK (idempotent)",
        ok(n.node_stage_volume(stage.clone()).await).map(|_| ()),
    );
    let mut repeated = Ok(());
    for _ in 0..8 {
        repeated = repeated.and(ok(n.node_stage_volume(stage.clone()).await).map(|_| ()));
    }
    let still = h.mounted(&staging).await;
    r.clause(
        "NodeStageVolume: staged ten times with the same arguments, each answers OK and the volume stays staged",
        repeated.and_then(|_| ensure(still, || format!("nothing mounted at {staging}"))),
    );
    let mut xfs = stage.clone();
    // The same volume asked for as xfs: an incompatible capability.
    if let Some(AccessType::Mount(m)) = xfs
        .volume_capability
        .as_mut()
        .and_then(|c| c.access_type.as_mut())
    {
        m.fs_type = "xfs".into();
    }
    r.clause(
        "NodeStageVolume: staged already with an incompatible capability is ALREADY_EXISTS",
        expect_code(n.node_stage_volume(xfs).await, Code::AlreadyExists),
    );

    let publish = kubelet.node_publish(&pv, &pod, &pc);
    // The spec's missing-field cases: kubelet's request, one field then removed.
    for (field, req) in [
        ("volume_id", {
            let mut q = publish.clone();
            q.volume_id.clear();
            q
        }),
        ("target_path", {
            let mut q = publish.clone();
            q.target_path.clear();
            q
        }),
        ("volume_capability", {
            let mut q = publish.clone();
            q.volume_capability = None;
            q
        }),
    ] {
        r.clause(
            &format!("NodePublishVolume: a missing {field} is INVALID_ARGUMENT"),
            expect_code(n.node_publish_volume(req).await, Code::InvalidArgument),
        );
    }
    let mut unstaged = publish.clone();
    unstaged.staging_target_path.clear(); // the spec's missing-staging-path case
    r.clause(
        "NodePublishVolume: with STAGE_UNSTAGE_VOLUME, a missing staging_target_path is FAILED_PRECONDITION",
        expect_code(n.node_publish_volume(unstaged).await, Code::FailedPrecondition),
    );
    let published = ok(n.node_publish_volume(publish.clone()).await);
    let there = h.is_dir(&target).await && h.mounted(&target).await;
    r.clause(
        "NodePublishVolume: the SP creates target_path and mounts the volume there",
        published.and_then(|_| ensure(there, || format!("{target} not mounted"))),
    );
    r.clause(
        "NodePublishVolume: publishing again with the same arguments answers OK (idempotent)",
        ok(n.node_publish_volume(publish.clone()).await).map(|_| ()),
    );
    let mut repeated = Ok(());
    for _ in 0..8 {
        repeated = repeated.and(ok(n.node_publish_volume(publish.clone()).await).map(|_| ()));
    }
    let still = h.mounted(&target).await;
    r.clause(
        "NodePublishVolume: published ten times with the same arguments, each answers OK and the volume stays published",
        repeated.and_then(|_| ensure(still, || format!("{target} not mounted"))),
    );
    let written = h.write(&format!("{target}/conformance"), "csi").await;
    let seen = h.read(&format!("{staging}/conformance")).await;
    r.clause(
        "NodePublishVolume: the published volume is the staged one (a file written at the target is on the volume)",
        written.and_then(|_| ensure(seen.as_deref() == Some("csi"), || format!("staging mount holds {seen:?}"))),
    );
    // A pod whose claim reference says readOnly.
    let ro_pod = Pod {
        read_only: true,
        ..Pod::new(POD_RO)
    };
    mkdirs(h, kubelet.publish_dirs(&ro_pod, &pv)).await;
    let ro_target = kubelet.target_path(&ro_pod, &pv);
    let ro = ok(n
        .node_publish_volume(kubelet.node_publish(&pv, &ro_pod, &pc))
        .await);
    let write = h.write(&format!("{ro_target}/x"), "x").await;
    r.clause(
        "NodePublishVolume: readonly publishes the volume read-only",
        ro.and_then(|_| match write {
            Err(e) if e.contains("Read-only file system") => Ok(()),
            other => Err(format!(
                "write answered {other:?}, want a read-only file system"
            )),
        }),
    );

    let mut no_id = kubelet.node_stats(&pv, &pod);
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "NodeGetVolumeStats: a missing volume_id is INVALID_ARGUMENT",
        expect_code(n.node_get_volume_stats(no_id).await, Code::InvalidArgument),
    );
    let mut other = kubelet.node_stats(&pv, &pod);
    other.volume_id = NEVER.into(); // a volume that does not exist, at the real one's path
    r.clause(
        "NodeGetVolumeStats: a volume_id that is not the volume at volume_path is NOT_FOUND",
        expect_code(n.node_get_volume_stats(other).await, Code::NotFound),
    );
    let mut no_path = kubelet.node_stats(&pv, &pod);
    no_path.volume_path.clear(); // the spec's missing-path case
    r.clause(
        "NodeGetVolumeStats: a missing volume_path is INVALID_ARGUMENT",
        expect_code(
            n.node_get_volume_stats(no_path).await,
            Code::InvalidArgument,
        ),
    );
    // A pod the volume never reached: its target path holds nothing.
    r.clause(
        "NodeGetVolumeStats: a path that holds no volume is NOT_FOUND",
        expect_code(
            n.node_get_volume_stats(kubelet.node_stats(&pv, &Pod::new(POD_NONE)))
                .await,
            Code::NotFound,
        ),
    );
    r.clause(
        "NodeGetVolumeStats: usage in BYTES with total, used and available for a mounted volume",
        ok(n.node_get_volume_stats(kubelet.node_stats(&pv, &pod)).await).and_then(|x| {
            let u = x.into_inner().usage;
            ensure(
                u.iter().any(|u| {
                    u.unit == csi::volume_usage::Unit::Bytes as i32
                        && u.total > 0
                        && u.available > 0
                        && u.used >= 0
                }),
                || format!("{u:?}"),
            )
        }),
    );
    // kubelet's NodeExpand at the PV's size (no secret: the class names none).
    let expand = kubelet.node_expand(&pv, &pod, pv.capacity_bytes, HashMap::new());
    let mut no_path = expand.clone();
    no_path.volume_path.clear(); // the spec's missing-path case
    r.clause(
        "NodeExpandVolume: a missing volume_path is INVALID_ARGUMENT",
        expect_code(n.node_expand_volume(no_path).await, Code::InvalidArgument),
    );
    let mut no_id = expand.clone();
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "NodeExpandVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(n.node_expand_volume(no_id).await, Code::InvalidArgument),
    );
    // A volume that does not exist, where kubelet would have published it for a pod it never reached.
    let gone = kubelet.node_expand(
        &volume_pv(NEVER),
        &Pod::new(POD_NONE),
        pv.capacity_bytes,
        HashMap::new(),
    );
    r.clause(
        "NodeExpandVolume: a volume that does not exist is NOT_FOUND",
        expect_code(n.node_expand_volume(gone).await, Code::NotFound),
    );
    r.clause(
        "NodeExpandVolume: answers the filesystem's capacity",
        ok(n.node_expand_volume(expand).await).and_then(|x| {
            let b = x.into_inner().capacity_bytes;
            ensure(b > 200 << 20, || format!("{b} bytes"))
        }),
    );

    let unpublish = kubelet.node_unpublish(&pv, &pod);
    let mut no_id = unpublish.clone();
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "NodeUnpublishVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(n.node_unpublish_volume(no_id).await, Code::InvalidArgument),
    );
    let mut no_target = unpublish.clone();
    no_target.target_path.clear(); // the spec's missing-path case
    r.clause(
        "NodeUnpublishVolume: a missing target_path is INVALID_ARGUMENT",
        expect_code(
            n.node_unpublish_volume(no_target).await,
            Code::InvalidArgument,
        ),
    );
    let gone = ok(n.node_unpublish_volume(unpublish.clone()).await);
    let left = h.exists(&target).await;
    r.clause(
        "NodeUnpublishVolume: the SP deletes the target_path it created",
        gone.and_then(|_| ensure(!left, || format!("{target} still exists"))),
    );
    r.clause(
        "NodeUnpublishVolume: unpublishing again answers OK",
        ok(n.node_unpublish_volume(unpublish).await).map(|_| ()),
    );
    let _ = n
        .node_unpublish_volume(kubelet.node_unpublish(&pv, &ro_pod))
        .await;
    let unstage = kubelet.node_unstage(&pv);
    let mut no_id = unstage.clone();
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "NodeUnstageVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(n.node_unstage_volume(no_id).await, Code::InvalidArgument),
    );
    let mut no_staging = unstage.clone();
    no_staging.staging_target_path.clear(); // the spec's missing-path case
    r.clause(
        "NodeUnstageVolume: a missing staging_target_path is INVALID_ARGUMENT",
        expect_code(
            n.node_unstage_volume(no_staging).await,
            Code::InvalidArgument,
        ),
    );
    let down = ok(n.node_unstage_volume(unstage.clone()).await);
    let still = h.mounted(&staging).await;
    r.clause(
        "NodeUnstageVolume: nothing stays mounted at staging_target_path",
        down.and_then(|_| ensure(!still, || format!("{staging} still mounted"))),
    );
    r.clause(
        "NodeUnstageVolume: unstaging again answers OK",
        ok(n.node_unstage_volume(unstage.clone()).await).map(|_| ()),
    );
    let again = ok(n.node_stage_volume(stage).await);
    let kept = h.read(&format!("{staging}/conformance")).await;
    r.clause(
        "NodeStageVolume: staging the volume again keeps its data (never reformatted)",
        again.and_then(|_| {
            ensure(kept.as_deref() == Some("csi"), || {
                format!("the file written before reads {kept:?}")
            })
        }),
    );
    let _ = n.node_unstage_volume(unstage).await;
    r.clause(
        "NodePublishVolume: a SINGLE_NODE_SINGLE_WRITER volume published read-write at one target is FAILED_PRECONDITION at another",
        single_writer(h, n, &kubelet, disk).await,
    );
}

/// The disk's volume as a ReadWriteOncePod claim's (kubelet asks for
/// SINGLE_NODE_SINGLE_WRITER, the node advertising SINGLE_NODE_MULTI_WRITER):
/// staged, published to one pod, then asked for by a second pod.
async fn single_writer<H: NodeHost>(
    h: &mut H,
    n: &mut NodeClient<Channel>,
    kubelet: &Kubelet,
    disk: &Disk,
) -> Result<(), String> {
    let pv = volume_pv_for(&disk.volume_id, &[callers::AccessMode::ReadWriteOncePod]);
    let pc = &disk.publish_context;
    let (first, second) = (Pod::new(POD_A), Pod::new(POD_NONE));
    mkdirs(h, kubelet.stage_dirs(&pv)).await;
    for pod in [&first, &second] {
        mkdirs(h, kubelet.publish_dirs(pod, &pv)).await;
    }
    ok(
        n.node_stage_volume(kubelet.node_stage(&pv, pc, HashMap::new()))
            .await,
    )?;
    let outcome = match ok(n
        .node_publish_volume(kubelet.node_publish(&pv, &first, pc))
        .await)
    {
        Ok(_) => expect_code(
            n.node_publish_volume(kubelet.node_publish(&pv, &second, pc))
                .await,
            Code::FailedPrecondition,
        ),
        Err(e) => Err(e),
    };
    for pod in [&second, &first] {
        let _ = n
            .node_unpublish_volume(kubelet.node_unpublish(&pv, pod))
            .await;
    }
    let _ = n.node_unstage_volume(kubelet.node_unstage(&pv)).await;
    outcome
}
