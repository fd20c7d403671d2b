//! The whole node lifecycle through the CSI API: kubelet → the agent running
//! as uid 65534 with no capabilities → hostd (root) → loop devices.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use callers::PersistentVolume;
use callers::kubelet::{Kubelet, Pod};
use callers::provisioner::{self, Claim, StorageClass};
use proxmox_csi_proto::csi::v1 as csi;
use testkit::node::LoopNode;
use testkit::process::Proc;
use tonic::Code;

/// hostd and the node plugin on loop devices (testkit's node).
struct Env(LoopNode);

impl std::ops::Deref for Env {
    type Target = LoopNode;
    fn deref(&self) -> &LoopNode {
        &self.0
    }
}

impl std::ops::DerefMut for Env {
    fn deref_mut(&mut self) -> &mut LoopNode {
        &mut self.0
    }
}

impl Env {
    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// With `extra` arguments for hostd.
    async fn start_with(extra: &[&str]) -> Self {
        Env(LoopNode::start(extra).await.unwrap())
    }

    /// A 320 MiB disk reaching the node; its WWN.
    fn disk(&mut self, n: u32) -> String {
        self.0.loop_disk(n, 320 << 20).unwrap()
    }

    /// kubelet on this environment's root directory.
    fn kubelet(&self) -> Kubelet {
        Kubelet::new(&self.root.display().to_string())
    }

    /// The directories kubelet makes before NodeStage and NodePublish.
    fn kubelet_dirs(&self, pv: &PersistentVolume, pod: &Pod) {
        let k = self.kubelet();
        for d in k.stage_dirs(pv).into_iter().chain(k.publish_dirs(pod, pv)) {
            std::fs::create_dir_all(d).unwrap();
        }
    }

    fn agent_log(&self) -> String {
        self.node_log()
    }
}

/// The PV the provisioner writes for claim `uid` of a StorageClass on
/// local-lvm with `ssd: "1"` and filesystem `fs` (empty: a block claim),
/// from the controller's answer (`vm-9999-pvc-<uid>`, context `ssd`).
fn pv(uid: &str, fs: &str) -> PersistentVolume {
    let mut sc = StorageClass::new(&[("storage", "local-lvm"), ("ssd", "1")]);
    let mut claim = Claim::new(uid, uid, 320 << 20);
    if fs.is_empty() {
        claim = claim.block();
    } else {
        sc.parameters
            .insert("csi.storage.k8s.io/fstype".into(), fs.into());
    }
    let volume = csi::Volume {
        volume_id: format!("region-1/pve2/local-lvm/vm-9999-pvc-{uid}"),
        capacity_bytes: 320 << 20,
        volume_context: HashMap::from([("ssd".into(), "1".into())]),
        ..Default::default()
    };
    provisioner::persistent_volume(&sc, &claim, &volume)
}

/// The controller's publish context for the disk with `wwn`, as the
/// attacher stores it in the VolumeAttachment (ctl/publish.rs), without
/// the drive serial: a loop device has none.
fn attached(wwn: &str) -> HashMap<String, String> {
    HashMap::from([
        ("wwn".into(), format!("0x{wwn}")),
        ("lun".into(), "1".into()),
        ("DevicePath".into(), format!("/dev/disk/by-id/wwn-0x{wwn}")),
    ])
}

fn mounted(p: &str) -> Option<(String, String)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (f[4] == p).then(|| (f[sep + 1].to_string(), f[5].to_string()))
    })
}

#[tokio::test]
async fn mount_and_block_volumes_through_an_unprivileged_agent() {
    testkit::require_root!();
    let mut env = Env::start().await;

    let k = env.kubelet();
    // Mount volume, xfs so that it can also grow online on this host.
    let wwn = env.disk(1);
    let (vol, pod) = (pv("a", "xfs"), Pod::new("pod-a"));
    env.kubelet_dirs(&vol, &pod);
    let (staging, target) = (k.staging_path(&vol), k.target_path(&pod, &vol));
    // kubelet repeats a call whose answer it did not see: each twice.
    for _ in 0..2 {
        env.node
            .node_stage_volume(k.node_stage(&vol, &attached(&wwn), HashMap::new()))
            .await
            .unwrap();
    }
    let (fs, opts) = mounted(&staging).unwrap();
    assert_eq!(fs, "xfs");
    assert!(
        opts.contains("noatime"),
        "ssd=1 must mount with noatime: {opts}"
    );
    for _ in 0..2 {
        env.node
            .node_publish_volume(k.node_publish(&vol, &pod, &attached(&wwn)))
            .await
            .unwrap();
    }
    std::fs::write(
        Path::new(&target).join("payload"),
        b"written through the pod's mount",
    )
    .unwrap();
    assert_eq!(
        std::fs::read(Path::new(&staging).join("payload")).unwrap(),
        b"written through the pod's mount"
    );

    let stats = env
        .node
        .node_get_volume_stats(k.node_stats(&vol, &pod))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage.len(), 2, "bytes and inodes");
    assert!(
        stats.usage[0].total > 200 << 20 && stats.usage[0].used > 0,
        "{stats:?}"
    );
    assert!(!stats.volume_condition.unwrap().abnormal);

    // Grow the disk as Proxmox would, then NodeExpandVolume.
    let img = env.images.join(format!("{wwn}.raw"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(640 << 20)
        .unwrap();
    assert!(
        Command::new("losetup")
            .arg("-c")
            .arg(&env.loops[0].dev)
            .status()
            .unwrap()
            .success()
    );
    let grown = env
        .node
        .node_expand_volume(k.node_expand(&vol, &pod, 640 << 20, HashMap::new()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 640 << 20);

    for _ in 0..2 {
        env.node
            .node_unpublish_volume(k.node_unpublish(&vol, &pod))
            .await
            .unwrap();
        env.node
            .node_unstage_volume(k.node_unstage(&vol))
            .await
            .unwrap();
    }
    assert_eq!(mounted(&staging), None);
    assert!(!Path::new(&target).exists());
    let e = env
        .node
        .node_get_volume_stats(k.node_stats(&vol, &pod))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // Raw block volume, on kubelet's volumeDevices layout.
    let wwn = env.disk(2);
    let (vol, pod) = (pv("b", ""), Pod::new("pod-b"));
    env.kubelet_dirs(&vol, &pod);
    let target = k.target_path(&pod, &vol);
    for _ in 0..2 {
        env.node
            .node_stage_volume(k.node_stage(&vol, &attached(&wwn), HashMap::new()))
            .await
            .unwrap();
        env.node
            .node_publish_volume(k.node_publish(&vol, &pod, &attached(&wwn)))
            .await
            .unwrap();
    }
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .unwrap();
        f.seek(SeekFrom::Start(4096)).unwrap();
        f.write_all(b"block bytes").unwrap();
        f.sync_all().unwrap();
    }
    for _ in 0..2 {
        env.node
            .node_unpublish_volume(k.node_unpublish(&vol, &pod))
            .await
            .unwrap();
        env.node
            .node_unstage_volume(k.node_unstage(&vol))
            .await
            .unwrap();
    }
    let mut buf = [0u8; 11];
    let mut f = std::fs::File::open(env.images.join(format!("{wwn}.raw"))).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"block bytes");

    // The agent really ran unprivileged: uid 65534, no capabilities.
    let pid = env.node_pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert_eq!(field("Uid:"), "65534 65534 65534 65534", "{status}");
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("CapPrm:"), "0000000000000000", "{status}");
    let log = env.agent_log();
    assert!(log.contains("volume staged"), "{log}");
}

#[tokio::test]
async fn node_info_and_bad_requests() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let info = env
        .node
        .node_get_info(callers::identity::node_get_info())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "worker-2/112");
    assert!((1..=24).contains(&info.max_volumes_per_node), "{info:?}");
    let segs = info.accessible_topology.unwrap().segments;
    assert_eq!(
        segs.get("topology.kubernetes.io/region")
            .map(String::as_str),
        Some("region-1")
    );
    assert_eq!(
        segs.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("pve2")
    );

    let caps = env
        .node
        .node_get_capabilities(callers::identity::node_get_capabilities())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 5);

    // kubelet's request for a good volume, each case breaking one field.
    let k = env.kubelet();
    let wwn = env.disk(3);
    let (vol, pod) = (pv("c", "ext4"), Pod::new("pod-c"));
    env.kubelet_dirs(&vol, &pod);
    let good = k.node_stage(&vol, &attached(&wwn), HashMap::new());
    let mut cases: Vec<(csi::NodeStageVolumeRequest, &str)> = Vec::new();
    let mut r = good.clone();
    r.volume_id.clear();
    cases.push((r, "volume_id: is required"));
    let mut r = good.clone();
    r.staging_target_path = "/etc/kubernetes/x".into();
    cases.push((
        r,
        "staging_target_path: \"/etc/kubernetes/x\" is not under kubelet's directory",
    ));
    // A ReadWriteMany PV.
    let rwx = PersistentVolume {
        access_modes: vec![callers::AccessMode::ReadWriteMany],
        ..vol.clone()
    };
    cases.push((
        k.node_stage(&rwx, &attached(&wwn), HashMap::new()),
        "volume_capability.access_mode: MULTI_NODE_MULTI_WRITER is not supported",
    ));
    // A PV whose fsType this driver does not make.
    let ntfs = PersistentVolume {
        fs_type: "ntfs".into(),
        ..vol.clone()
    };
    cases.push((
        k.node_stage(&ntfs, &attached(&wwn), HashMap::new()),
        "volume_capability.mount.fs_type: \"ntfs\" is not supported; allowed: ext4, xfs, ext3, ext2",
    ));
    // An attachment without metadata.
    cases.push((
        k.node_stage(&vol, &HashMap::new(), HashMap::new()),
        "publish_context.wwn: is required",
    ));
    for (req, want) in cases {
        let e = env.node.node_stage_volume(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{want}: {e:?}");
        assert!(
            e.message().starts_with(want),
            "want {want:?}, got {:?}",
            e.message()
        );
    }
    // Nothing was formatted by any of those.
    let mut head = vec![0u8; 1 << 20];
    std::fs::File::open(env.images.join(format!("{wwn}.raw")))
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert!(head.iter().all(|b| *b == 0));

    // Publish before stage: FailedPrecondition, per the spec.
    let e = env
        .node
        .node_publish_volume(k.node_publish(&vol, &pod, &attached(&wwn)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // A secret never reaches the agent's log.
    let btrfs = PersistentVolume {
        fs_type: "btrfs".into(),
        ..vol.clone()
    };
    let secret = HashMap::from([(
        "encryption-passphrase".to_string(),
        "hunter2-secret".to_string(),
    )]);
    let _ = env
        .node
        .node_stage_volume(k.node_stage(&btrfs, &attached(&wwn), secret))
        .await;
    assert!(!env.agent_log().contains("hunter2-secret"));
}

/// Version skew: today's node plugin against a hostd of a release that
/// lacks growth and LUKS. The probe is ready and what hostd has works;
/// what it lacks fails once, before hostd is asked, naming the hostd
/// release, the capability and what to upgrade.
#[tokio::test]
async fn an_older_hostd_serves_what_it_has_and_the_rest_names_what_it_lacks() {
    testkit::require_root!();
    let mut env = Env::start_with(&["--without", "expand", "--without", "stage.luks2"]).await;
    let k = env.kubelet();
    let wwn = env.disk(3);
    let (vol, pod) = (pv("old", "ext4"), Pod::new("pod-old"));
    env.kubelet_dirs(&vol, &pod);
    env.node
        .node_stage_volume(k.node_stage(&vol, &attached(&wwn), HashMap::new()))
        .await
        .unwrap();
    env.node
        .node_publish_volume(k.node_publish(&vol, &pod, &attached(&wwn)))
        .await
        .unwrap();
    let e = env
        .node
        .node_expand_volume(k.node_expand(&vol, &pod, 640 << 20, HashMap::new()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        e.message().contains(&format!(
            "hostd {version} on this node cannot grow volumes on the node (expand)"
        )) && e.message().contains("upgrade hostd"),
        "{}",
        e.message()
    );
    let wwn = env.disk(4);
    let (luks, luks_pod) = (pv("oldluks", "ext4"), Pod::new("pod-oldluks"));
    env.kubelet_dirs(&luks, &luks_pod);
    let e = env
        .node
        .node_stage_volume(k.node_stage(
            &luks,
            &attached(&wwn),
            HashMap::from([("encryption-passphrase".into(), "a passphrase".into())]),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .contains("cannot stage encrypted volumes (stage.luks2)"),
        "{}",
        e.message()
    );
    // Nothing was asked of hostd for it: no mount, no LUKS header.
    assert_eq!(mounted(&k.staging_path(&luks)), None);
    let head = std::fs::read(env.images.join(format!("{wwn}.raw"))).unwrap();
    assert!(!head.starts_with(b"LUKS"), "a LUKS header was written");
    env.node
        .node_unpublish_volume(k.node_unpublish(&vol, &pod))
        .await
        .unwrap();
    env.node
        .node_unstage_volume(k.node_unstage(&vol))
        .await
        .unwrap();
}

/// A node where hostd never ran: kubelet made the plugin's socket
/// directory, root's. The node plugin neither exits nor crash-loops: it says
/// hostd is missing and waits; once hostd shares the directory it serves,
/// not ready while hostd does not answer.
#[tokio::test]
async fn without_hostd_the_node_plugin_waits_and_names_it() {
    testkit::require_root!();
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    mode(dir.path(), 0o755);
    let sockets = dir.path().join("plugins");
    std::fs::create_dir_all(&sockets).unwrap();
    mode(&sockets, 0o755);
    let csi_sock = sockets.join("csi.sock");
    let log = dir.path().join("agent.log");
    let mut agent = Proc::spawn(
        "node plugin",
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            &testkit::bin("proxmox-csi-node").display().to_string(),
            "--csi-address",
            &format!("unix://{}", csi_sock.display()),
            "--hostd-socket",
            dir.path().join("absent/hostd.sock").to_str().unwrap(),
            "--node-id",
            "worker-2",
            "--region",
            "region-1",
            "--zone",
            "pve2",
        ],
        &log,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("hostd has not run on this node")
    {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(agent.exited().is_none(), "the node plugin exited");
    // hostd shares the directory (--plugin-dir): the plugin serves.
    mode(&sockets, 0o777);
    testkit::wait_for(&csi_sock).await.unwrap();
    let ch = proxmox_csi_common::client::unix_channel(csi_sock)
        .await
        .unwrap();
    let probe = proxmox_csi_proto::csi::v1::identity_client::IdentityClient::new(ch)
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false));
    assert!(agent.exited().is_none(), "the node plugin exited");
}
