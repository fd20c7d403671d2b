//! The production path in a real guest: pvesim hot-plugs the disk over QMP
//! as Proxmox does, udev in the guest names it by WWN, hostd opens LUKS with
//! dm-crypt, makes xfs, mounts; data survives unplug and re-attach; online
//! growth goes through block_resize, cryptsetup resize and xfs_growfs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::guest::{Guest, SECRET, Share, guest_cluster, qemu_present};
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::pve;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use proxmox_csi_proto::csi::v1::volume_capability::access_mode::Mode;
use proxmox_csi_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use pvesim::{Sim, State};
use tonic::Request;
use tonic::transport::Channel;

const PASSPHRASE: &str = "correct horse battery staple";


fn cap(fs: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume { fs_type: fs.into(), ..Default::default() })),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}

async fn node_client(port: u16) -> NodeClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect().await {
            // Ready when the node plugin answers and its Probe says hostd does.
            let mut probe = proxmox_csi_proto::csi::v1::identity_client::IdentityClient::new(ch.clone());
            if probe.probe(csi::ProbeRequest {}).await.is_ok_and(|r| r.into_inner().ready == Some(true)) {
                return NodeClient::new(ch);
            }
        }
        assert!(Instant::now() < deadline, "the node plugin in the guest never answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Step<'a> {
    vol: &'a csi::Volume,
    staging: String,
    target: String,
    secrets: HashMap<String, String>,
    fs: &'a str,
}

impl Step<'_> {
    fn stage(&self, pc: &HashMap<String, String>) -> csi::NodeStageVolumeRequest {
        csi::NodeStageVolumeRequest {
            volume_id: self.vol.volume_id.clone(),
            publish_context: pc.clone(),
            staging_target_path: self.staging.clone(),
            volume_capability: Some(cap(self.fs)),
            secrets: self.secrets.clone(),
            volume_context: self.vol.volume_context.clone(),
        }
    }

    fn publish(&self) -> csi::NodePublishVolumeRequest {
        csi::NodePublishVolumeRequest {
            volume_id: self.vol.volume_id.clone(),
            staging_target_path: self.staging.clone(),
            target_path: self.target.clone(),
            volume_capability: Some(cap(self.fs)),
            ..Default::default()
        }
    }
}

#[tokio::test]
async fn luks_xfs_volume_in_a_guest_vm() {
    let Some(Lab { mut g, ctl, mut node, sim: _sim, images: _images }) = Lab::start(Share::Shared, MINIMAL_ROLE).await else { return };
    eprintln!("MEASURE boot to shell: {:?}", g.boot_time);

    let topo = csi::Topology {
        segments: HashMap::from([
            ("topology.kubernetes.io/region".to_string(), "region-1".to_string()),
            ("topology.kubernetes.io/zone".to_string(), "pve2".to_string()),
        ]),
    };
    let vol = ctl
        .create_volume(Request::new(csi::CreateVolumeRequest {
            name: "pvc-e2e".into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
            volume_capabilities: vec![cap("xfs")],
            parameters: HashMap::from([("storage".into(), "local-lvm".into())]),
            accessibility_requirements: Some(csi::TopologyRequirement { requisite: vec![topo.clone()], preferred: vec![topo] }),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let step = Step {
        vol: &vol,
        staging: "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/e2e/globalmount".into(),
        target: "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-e2e/mount".into(),
        secrets: HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]),
        fs: "xfs",
    };
    g.sh("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/e2e /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-e2e").await.unwrap();

    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: "worker-2/112".into(),
        volume_capability: Some(cap("xfs")),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    };
    let t = Instant::now();
    let pc = ctl.controller_publish_volume(Request::new(publish.clone())).await.unwrap().into_inner().publish_context;
    eprintln!("MEASURE ControllerPublish (QMP hot-plug): {:?}", t.elapsed());
    let wwn = pc["wwn"].clone();
    // udev in the guest names the disk by WWN, with the serial we set.
    let link = g.sh(&format!("udevadm settle; readlink -f /dev/disk/by-id/wwn-{wwn}")).await.unwrap();
    assert!(link.starts_with("/dev/sd"), "{link}");
    let dev = link.trim().to_string();
    let serial = g.sh(&format!("udevadm info --query=property --name={dev} | grep ID_SCSI_SERIAL")).await.unwrap();
    assert!(serial.contains(&pc["serial"]), "{serial}");

    let t = Instant::now();
    let staged = tokio::time::timeout(Duration::from_secs(60), node.node_stage_volume(step.stage(&pc))).await;
    if !matches!(staged, Ok(Ok(_))) {
        let why = g.sh("tail -5 /run/hostd.log; ps | grep -v ']$'; ls -l /dev/mapper; dmsetup info -c; dmsetup udevcookies; ls /lib/udev/rules.d; for p in $(pidof proxmox-csi-hostd); do cat /proc/$p/task/*/wchan; echo; done").await.unwrap_or_default();
        panic!("NodeStage failed: {staged:?}\nguest:\n{why}");
    }
    eprintln!("MEASURE NodeStage (LUKS format+open, mkfs.xfs, mount): {:?}", t.elapsed());
    let staged = g.sh("grep 'volume staged' /run/node.log | tail -1").await.unwrap();
    assert!(staged.contains("\"wait\"") && staged.contains("\"luks_format\"") && staged.contains("\"mkfs\""), "{staged}");
    eprintln!("MEASURE NodeStage phases: {}", staged.split("timings_ms=").nth(1).unwrap_or("?"));
    let mounts = g.sh("grep globalmount /proc/mounts").await.unwrap();
    assert!(mounts.contains("/dev/mapper/pvecsi-") && mounts.contains(" xfs "), "{mounts}");
    let luks = g.sh(&format!("cryptsetup luksDump {dev} | grep -E 'Version|cipher:|Cipher key'")).await.unwrap();
    assert!(luks.contains("aes-xts-plain64") && luks.contains("512 bits"), "{luks}");
    node.node_publish_volume(step.publish()).await.unwrap();
    let sum = g.sh(&format!("dd if=/dev/urandom of={}/data bs=1M count=8 2>/dev/null && sync && sha256sum {}/data | cut -d' ' -f1", step.target, step.target)).await.unwrap();
    assert_eq!(sum.len(), 64, "{sum}");

    // Online growth: Proxmox resizes (block_resize), the node grows LUKS and xfs.
    let grown = ctl
        .controller_expand_volume(Request::new(csi::ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
            volume_capability: Some(cap("xfs")),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(grown.node_expansion_required);
    let ne = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: step.target.clone(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
            staging_target_path: step.staging.clone(),
            volume_capability: Some(cap("xfs")),
            secrets: step.secrets.clone(),
        })
        .await;
    let ne = match ne {
        Ok(r) => r.into_inner(),
        Err(e) => {
            let why = g.sh("tail -5 /run/hostd.log; tail -5 /run/node.log; ps | grep proxmox; dmesg | tail -5").await.unwrap_or_default();
            panic!("NodeExpand failed: {e:?}\nguest:\n{why}");
        }
    };
    assert!(ne.capacity_bytes > (1 << 30) + (900 << 20), "{ne:?}");
    let df = g.sh(&format!("df -kP {} | tail -1 | awk '{{print $2}}'", step.target)).await.unwrap();
    let kib: u64 = df.trim().parse().unwrap();
    assert!(kib > 1_900_000, "filesystem is {kib} KiB after growing to 2 GiB");

    // Down: unpublish, unstage (LUKS closed), detach (the guest sees it go).
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), target_path: step.target.clone() }).await.unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: step.staging.clone() }).await.unwrap();
    let mapper = g.sh("ls /dev/mapper").await.unwrap();
    assert!(!mapper.contains("pvecsi-"), "{mapper}");
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() })).await.unwrap();
    let (code, _) = g.sh_status(&format!("udevadm settle; test -e /dev/disk/by-id/wwn-{wwn}")).await.unwrap();
    assert_ne!(code, 0, "the wwn link must disappear after the unplug");

    // Back again: the LUKS volume is opened, not formatted, and the data is there.
    let pc = ctl.controller_publish_volume(Request::new(publish)).await.unwrap().into_inner().publish_context;
    assert_eq!(pc["wwn"], wwn, "the same WWN read back from the config");
    node.node_stage_volume(step.stage(&pc)).await.unwrap();
    node.node_publish_volume(step.publish()).await.unwrap();
    let again = g.sh(&format!("sha256sum {}/data | cut -d' ' -f1", step.target)).await.unwrap();
    assert_eq!(again, sum, "data survived unplug and re-attach");
    // A wrong passphrase is refused without touching the header.
    let hostd_log = g.sh("cat /run/hostd.log").await.unwrap();
    assert!(!hostd_log.contains(PASSPHRASE), "the passphrase reached hostd's log");
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), target_path: step.target.clone() }).await.unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: step.staging.clone() }).await.unwrap();
    let mut wrong = step.stage(&pc);
    wrong.secrets.insert("encryption-passphrase".into(), "not it".into());
    let err = node.node_stage_volume(wrong).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("passphrase does not open"), "{}", err.message());
}

/// The documented minimal role of the CSI token.
const MINIMAL_ROLE: &str = "VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit";

/// A booted guest with pvesim and a controller bound to it, and a client of
/// the node plugin in the guest, ready (its Probe answers).
/// Bind every field: the ones left out would be dropped (pvesim stopped)
/// at once.
struct Lab {
    g: Guest,
    images: tempfile::TempDir,
    sim: pvesim::Running,
    ctl: ControllerService,
    node: NodeClient<Channel>,
}

impl Lab {
    /// `None` (the test is skipped) where QEMU is not installed outside CI.
    async fn start(share: Share, role: &str) -> Option<Self> {
        if !qemu_present() {
            return None;
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let g = Guest::boot_with(share).await.expect("guest boots");
        let images = tempfile::tempdir().unwrap();
        let (sim, ctl) = setup_with_role(&g, images.path(), role).await;
        let node = node_client(g.csi_port).await;
        Some(Self { g, images, sim, ctl, node })
    }
}

async fn setup_with_role(g: &Guest, images: &std::path::Path, role: &str) -> (pvesim::Running, ControllerService) {
    let state = guest_cluster(&g.qmp, role);
    let sim = Sim::new(State::from_yaml(&state).unwrap()).plain_http().volume_dir(images.to_path_buf()).start("127.0.0.1:0").await.unwrap();
    let cfg = CloudConfig::parse(&format!(
        "clusters:\n  - url: {}\n    token_id: kubernetes-csi@pve!csi\n    token_secret: {SECRET}\n    region: region-1\n",
        sim.api_url()
    ))
    .unwrap();
    let clients = cfg.clusters.into_iter().map(|c| Arc::new(pve::Client::new(c, Duration::from_secs(30), Default::default()).unwrap())).collect();
    (sim, ControllerService(Arc::new(Controller::new(clients, 9999, Duration::from_secs(60)))))
}

async fn create_vol(ctl: &ControllerService, name: &str, fs: &str) -> csi::Volume {
    ctl.create_volume(Request::new(csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
        volume_capabilities: vec![cap(fs)],
        parameters: HashMap::from([("storage".into(), "local-lvm".into())]),
        ..Default::default()
    }))
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap()
}

fn publish_to_112(v: &csi::Volume, fs: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: "worker-2/112".into(),
        volume_capability: Some(cap(fs)),
        volume_context: v.volume_context.clone(),
        ..Default::default()
    }
}

#[tokio::test]
async fn ext4_growth_surprise_unplug_and_24_disks() {
    let Some(Lab { mut g, ctl, mut node, sim: _sim, images: _images }) = Lab::start(Share::Shared, MINIMAL_ROLE).await else { return };
    g.sh("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/d/a /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/a").await.unwrap();

    // ext4, plain: online growth with resize2fs (root in the guest has CAP_SYS_RESOURCE).
    let vol = create_vol(&ctl, "pvc-ext4", "ext4").await;
    // The WWN is known before the attach: stage first, so that hostd is
    // already waiting when QEMU's device_add happens.
    let wwn = proxmox_csi_controller::drive::wwn_for(&vol.volume_id, 0);
    let early = HashMap::from([("wwn".to_string(), wwn.clone()), ("serial".to_string(), proxmox_csi_controller::drive::serial_for(&vol.volume_id))]);
    let step = Step {
        vol: &vol,
        staging: "/var/lib/kubelet/plugins/kubernetes.io/csi/d/a/globalmount".into(),
        target: "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/a/mount".into(),
        secrets: HashMap::new(),
        fs: "ext4",
    };
    let t = Instant::now();
    let mut waiting = node.clone();
    let stage_req = step.stage(&early);
    let staged = tokio::spawn(async move { waiting.node_stage_volume(stage_req).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published = Instant::now();
    let pc = ctl.controller_publish_volume(Request::new(publish_to_112(&vol, "ext4"))).await.unwrap().into_inner().publish_context;
    assert_eq!(pc["wwn"], wwn);
    let publish_took = published.elapsed();
    staged.await.unwrap().unwrap();
    eprintln!("MEASURE NodeStage (wait, mkfs.ext4, mount): {:?}", t.elapsed());
    let line = g.sh("grep 'volume staged' /run/node.log | tail -1").await.unwrap();
    eprintln!(
        "MEASURE ControllerPublish took {publish_took:?}; hostd, waiting since 300 ms before it, found the disk: {}",
        line.split("timings_ms=").nth(1).unwrap_or("?")
    );
    node.node_publish_volume(step.publish()).await.unwrap();
    g.sh(&format!("echo kept > {}/f && sync", step.target)).await.unwrap();
    ctl.controller_expand_volume(Request::new(csi::ControllerExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
        volume_capability: Some(cap("ext4")),
        ..Default::default()
    }))
    .await
    .unwrap();
    node.node_expand_volume(csi::NodeExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        volume_path: step.target.clone(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
        staging_target_path: step.staging.clone(),
        volume_capability: Some(cap("ext4")),
        secrets: HashMap::new(),
    })
    .await
    .unwrap();
    let kib: u64 = g.sh(&format!("df -kP {} | tail -1 | awk '{{print $2}}'", step.target)).await.unwrap().trim().parse().unwrap();
    assert!(kib > 1_900_000, "ext4 is {kib} KiB after growing to 2 GiB");

    // Surprise unplug while mounted: the condition turns abnormal, unstage still cleans up.
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: "worker-2/112".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    g.sh("udevadm settle").await.unwrap();
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest { volume_id: vol.volume_id.clone(), volume_path: step.target.clone(), staging_target_path: String::new() })
        .await
        .unwrap()
        .into_inner();
    let cond = stats.volume_condition.unwrap();
    assert!(cond.abnormal, "{cond:?}");
    eprintln!("condition after surprise unplug: {}", cond.message);
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), target_path: step.target.clone() }).await.unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: step.staging.clone() }).await.unwrap();
    let mounts = g.sh("grep -c kubelet/plugins /proc/mounts || true").await.unwrap();
    assert_eq!(mounts.trim(), "0", "nothing left mounted");

    // 24 volumes attached concurrently to one VM: all appear in the guest by WWN.
    let mut vols = Vec::new();
    for i in 0..24 {
        vols.push(create_vol(&ctl, &format!("pvc-many-{i}"), "ext4").await);
    }
    let t = Instant::now();
    let calls = vols.iter().map(|v| {
        let ctl = ctl.clone();
        let req = publish_to_112(v, "ext4");
        async move { ctl.controller_publish_volume(Request::new(req)).await }
    });
    let results: Vec<_> = futures::future::join_all(calls).await;
    eprintln!("MEASURE 24 concurrent ControllerPublish into the guest: {:?}, {} config writes", t.elapsed(), ctl.0.attacher.writes.load(std::sync::atomic::Ordering::Relaxed));
    let contexts: Vec<HashMap<String, String>> = results.into_iter().map(|r| r.unwrap().into_inner().publish_context).collect();
    let wwns: Vec<String> = contexts.iter().map(|c| c["wwn"].clone()).collect();
    // Stage them all as raw block volumes: a burst of hot-plugs can overrun
    // virtio-scsi's event queue, and hostd's SCSI rescan fallback must find
    // whatever the guest kernel missed.
    g.sh("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/many").await.unwrap();
    let t = Instant::now();
    let stages = vols.iter().zip(&contexts).enumerate().map(|(i, (v, pc))| {
        let mut n = node.clone();
        let req = csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            publish_context: pc.clone(),
            staging_target_path: format!("/var/lib/kubelet/plugins/kubernetes.io/csi/many/{i}"),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(AccessType::Block(Default::default())),
                access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
            }),
            ..Default::default()
        };
        async move { n.node_stage_volume(req).await }
    });
    for r in futures::future::join_all(stages).await {
        r.expect("every hot-plugged disk is found and staged");
    }
    eprintln!("MEASURE 24 NodeStage (block) at once in the guest: {:?}", t.elapsed());
    let links = g.sh("udevadm settle; ls /dev/disk/by-id/ | grep -c '^wwn-'").await.unwrap();
    assert_eq!(links.trim(), "24", "by-id links in the guest");
    for w in &wwns {
        g.sh(&format!("test -e /dev/disk/by-id/wwn-{w}")).await.unwrap();
    }
}

/// hostd is killed in the middle of a LUKS+xfs stage and started again;
/// the kubelet's retry converges on a mounted, consistent volume.
#[tokio::test]
async fn hostd_killed_mid_stage_in_the_guest() {
    // Alone on the machine: the kill must land in the phase it aims at.
    let Some(Lab { mut g, ctl, mut node, sim: _sim, images: _images }) = Lab::start(Share::Alone, MINIMAL_ROLE).await else { return };
    // Kill during luksFormat, luksOpen, and mkfs.xfs (≈1.1 s, 0.4 s, 1.6 s under TCG).
    for (i, kill_after_ms) in [300u64, 1300, 2300].into_iter().enumerate() {
        g.sh(&format!("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/d/k{i}")).await.unwrap();
        let vol = create_vol(&ctl, &format!("pvc-kill-{i}"), "xfs").await;
        let pc = ctl.controller_publish_volume(Request::new(publish_to_112(&vol, "xfs"))).await.unwrap().into_inner().publish_context;
        let step = Step {
            vol: &vol,
            staging: format!("/var/lib/kubelet/plugins/kubernetes.io/csi/d/k{i}/globalmount"),
            target: String::new(),
            secrets: HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]),
            fs: "xfs",
        };
        let mut first = node.clone();
        let req = step.stage(&pc);
        let call = tokio::spawn(async move { first.node_stage_volume(req).await });
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        g.sh("kill -9 $(pidof proxmox-csi-hostd); sleep 0.3; start-hostd & sleep 1").await.unwrap();
        let killed = call.await.unwrap();
        eprintln!("killed after {kill_after_ms} ms: the interrupted NodeStage answered {:?}", killed.as_ref().map(|_| ()).map_err(|e| e.code()));
        // The kubelet retries until it works.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match node.node_stage_volume(step.stage(&pc)).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("retry: {:?} {}", e.code(), e.message());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("NodeStage never converged (killed after {kill_after_ms} ms): {e:?}"),
            }
        }
        let mounts = g.sh("grep globalmount /proc/mounts").await.unwrap();
        assert!(mounts.contains(&step.staging) && mounts.contains("/dev/mapper/pvecsi-"), "{mounts}");
        g.sh(&format!("echo ok > {}/f && sync", step.staging)).await.unwrap();
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: step.staging.clone() }).await.unwrap();
        // Stages again from scratch: LUKS opens, xfs mounts (a torn one would
        // not), and the file written after the retry is there.
        // As kubelet does, a call that finds hostd still settling is retried.
        until_ok("stage after the recovery", || {
            let (mut n, req) = (node.clone(), step.stage(&pc));
            async move { n.node_stage_volume(req).await }
        })
        .await;
        let f = g.sh(&format!("cat {}/f", step.staging)).await.unwrap();
        assert_eq!(f.trim(), "ok");
        until_ok("unstage", || {
            let mut n = node.clone();
            let req = csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: step.staging.clone() };
            async move { n.node_unstage_volume(req).await }
        })
        .await;
    }
    let log = g.sh("grep -cE 'interrupted|half-made' /run/hostd.log || true").await.unwrap();
    eprintln!("recoveries logged by hostd: {}", log.trim());
}

/// The pod moves: the volume leaves one worker VM and reaches a second one
/// on the same Proxmox node with its data. Local storage cannot follow to
/// another Proxmox node (the error names `pvecsictl migrate`); shared
/// storage can.
#[tokio::test]
async fn volume_moves_between_worker_vms() {
    if !qemu_present() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (g1, g2) = tokio::join!(Guest::boot(), Guest::boot());
    let (mut g1, mut g2) = (g1.expect("guest 1 boots"), g2.expect("guest 2 boots"));
    let images = tempfile::tempdir().unwrap();
    // 112 and 113 are guests on pve2; 114 on pve1 is simulated (no QEMU).
    let state = format!(
        r#"
nodes: [{{ name: pve1 }}, {{ name: pve2 }}]
storages:
  - {{ id: local-lvm, type: lvmthin, total: 107374182400 }}
  - {{ id: nfs, type: nfs, total: 107374182400 }}
vms:
  - {{ vmid: 112, node: pve2, name: worker-2, qmp: "{}", config: {{ scsihw: virtio-scsi-pci }} }}
  - {{ vmid: 113, node: pve2, name: worker-3, qmp: "{}", config: {{ scsihw: virtio-scsi-pci }} }}
  - {{ vmid: 114, node: pve1, name: worker-4, config: {{ scsihw: virtio-scsi-pci }} }}
users:
  - {{ userid: kubernetes-csi@pve, tokens: [{{ name: csi, secret: {SECRET} }}] }}
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - {{ path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }}
"#,
        g1.qmp.display(),
        g2.qmp.display()
    );
    let sim = Sim::new(State::from_yaml(&state).unwrap()).plain_http().volume_dir(images.path().to_path_buf()).start("127.0.0.1:0").await.unwrap();
    let cfg = CloudConfig::parse(&format!(
        "clusters:\n  - url: {}\n    token_id: kubernetes-csi@pve!csi\n    token_secret: {SECRET}\n    region: region-1\n",
        sim.api_url()
    ))
    .unwrap();
    let clients = cfg.clusters.into_iter().map(|c| Arc::new(pve::Client::new(c, Duration::from_secs(30), Default::default()).unwrap())).collect();
    let ctl = ControllerService(Arc::new(Controller::new(clients, 9999, Duration::from_secs(60))));
    let (mut n1, mut n2) = (node_client(g1.csi_port).await, node_client(g2.csi_port).await);
    let create = |name: &'static str, storage: &'static str| {
        let ctl = ctl.clone();
        async move {
            let zone = csi::Topology {
                segments: HashMap::from([
                    ("topology.kubernetes.io/region".to_string(), "region-1".to_string()),
                    ("topology.kubernetes.io/zone".to_string(), "pve2".to_string()),
                ]),
            };
            ctl.create_volume(Request::new(csi::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
                volume_capabilities: vec![cap("ext4")],
                parameters: HashMap::from([("storage".into(), storage.into())]),
                accessibility_requirements: Some(csi::TopologyRequirement { requisite: vec![zone.clone()], preferred: vec![zone] }),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
        }
    };
    let publish = |v: &csi::Volume, node_id: &str| csi::ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: node_id.into(),
        volume_capability: Some(cap("ext4")),
        volume_context: v.volume_context.clone(),
        ..Default::default()
    };
    let staging = "/var/lib/kubelet/plugins/kubernetes.io/csi/d/m/globalmount".to_string();
    for g in [&mut g1, &mut g2] {
        g.sh("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/d/m").await.unwrap();
    }

    // Local storage, same Proxmox node: written on worker-2, read on worker-3.
    let local = create("pvc-local", "local-lvm").await;
    assert!(local.volume_id.contains("/pve2/"), "{}", local.volume_id);
    let step = Step { vol: &local, staging: staging.clone(), target: String::new(), secrets: HashMap::new(), fs: "ext4" };
    let pc = ctl.controller_publish_volume(Request::new(publish(&local, "worker-2/112"))).await.unwrap().into_inner().publish_context;
    n1.node_stage_volume(step.stage(&pc)).await.unwrap();
    let sum = g1.sh(&format!("dd if=/dev/urandom of={staging}/d bs=1M count=4 2>/dev/null && sync && sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
    // While attached to worker-2, worker-3 cannot have it.
    let err = ctl.controller_publish_volume(Request::new(publish(&local, "worker-3/113"))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    n1.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: local.volume_id.clone(), staging_target_path: staging.clone() }).await.unwrap();
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: local.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() })).await.unwrap();
    let pc = ctl.controller_publish_volume(Request::new(publish(&local, "worker-3/113"))).await.unwrap().into_inner().publish_context;
    n2.node_stage_volume(step.stage(&pc)).await.unwrap();
    let moved = g2.sh(&format!("sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
    assert_eq!(moved, sum, "data intact after the move to another VM");
    n2.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: local.volume_id.clone(), staging_target_path: staging.clone() }).await.unwrap();
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: local.volume_id.clone(), node_id: "worker-3/113".into(), ..Default::default() })).await.unwrap();

    // To a VM on another Proxmox node: local storage refused with the reason and the remedy…
    let err = ctl.controller_publish_volume(Request::new(publish(&local, "worker-4/114"))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("pvecsictl migrate"), "{}", err.message());
    // …shared storage goes.
    let shared = create("pvc-shared", "nfs").await;
    ctl.controller_publish_volume(Request::new(publish(&shared, "worker-2/112"))).await.unwrap();
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: shared.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() })).await.unwrap();
    ctl.controller_publish_volume(Request::new(publish(&shared, "worker-4/114"))).await.unwrap();
}

/// The two growth cases the other guest tests do not cover: ext4 inside
/// LUKS (cryptsetup resize, then resize2fs) and plain xfs (xfs_growfs).
#[tokio::test]
async fn online_growth_of_ext4_with_luks_and_of_plain_xfs() {
    let Some(Lab { mut g, ctl, mut node, sim: _sim, images: _images }) = Lab::start(Share::Shared, MINIMAL_ROLE).await else { return };
    let luks = HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]);
    for (name, fs, secrets) in [("pvc-ext4-luks", "ext4", luks), ("pvc-xfs-plain", "xfs", HashMap::new())] {
        grow_online(&ctl, &mut node, &mut g, name, fs, secrets).await;
    }
}

/// Create, attach, stage, write, grow from 1 to 2 GiB while mounted, check
/// the size and the bytes, then take everything down and delete.
async fn grow_online(ctl: &ControllerService, node: &mut NodeClient<Channel>, g: &mut Guest, name: &str, fs: &str, secrets: HashMap<String, String>) {
    let vol = create_vol(ctl, name, fs).await;
    let step = Step {
        vol: &vol,
        staging: format!("/var/lib/kubelet/plugins/kubernetes.io/csi/d/{name}/globalmount"),
        target: format!("/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/{name}/mount"),
        secrets,
        fs,
    };
    g.sh(&format!("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/d/{name} /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/{name}")).await.unwrap();
    let pc = ctl.controller_publish_volume(Request::new(publish_to_112(&vol, fs))).await.unwrap().into_inner().publish_context;
    node.node_stage_volume(step.stage(&pc)).await.unwrap();
    let mounts = g.sh(&format!("grep {name}/globalmount /proc/mounts")).await.unwrap();
    assert!(mounts.contains(&format!(" {fs} ")), "{mounts}");
    assert_eq!(mounts.contains("/dev/mapper/pvecsi-"), !step.secrets.is_empty(), "{mounts}");
    node.node_publish_volume(step.publish()).await.unwrap();
    let sum = g.sh(&format!("dd if=/dev/urandom of={t}/data bs=1M count=4 2>/dev/null && sync && sha256sum {t}/data | cut -d' ' -f1", t = step.target)).await.unwrap();
    assert_eq!(sum.len(), 64, "{sum}");

    let range = Some(csi::CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 });
    let grown = ctl
        .controller_expand_volume(Request::new(csi::ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: range,
            volume_capability: Some(cap(fs)),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(grown.node_expansion_required);
    node.node_expand_volume(csi::NodeExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        volume_path: step.target.clone(),
        capacity_range: range,
        staging_target_path: step.staging.clone(),
        volume_capability: Some(cap(fs)),
        secrets: step.secrets.clone(),
    })
    .await
    .unwrap();
    let kib: u64 = g.sh(&format!("df -kP {} | tail -1 | awk '{{print $2}}'", step.target)).await.unwrap().trim().parse().unwrap();
    assert!(kib > 1_900_000, "{name}: {fs} is {kib} KiB after growing to 2 GiB");
    let again = g.sh(&format!("sha256sum {}/data | cut -d' ' -f1", step.target)).await.unwrap();
    assert_eq!(again, sum, "{name}: the data survived the growth");

    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), target_path: step.target.clone() }).await.unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: step.staging.clone() }).await.unwrap();
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() })).await.unwrap();
    ctl.delete_volume(Request::new(csi::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), ..Default::default() })).await.unwrap();
    let (code, _) = g.sh_status(&format!("udevadm settle; test -e /dev/disk/by-id/wwn-{}", pc["wwn"])).await.unwrap();
    assert_ne!(code, 0, "{name}: the disk is gone from the guest");
}

/// A snapshot of a LUKS volume, restored into a new volume: the copy is
/// opened with the same passphrase (never formatted) and has the bytes.
#[tokio::test]
async fn snapshot_restore_keeps_the_bytes() {
    let role = "VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Clone, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit";
    let Some(Lab { mut g, ctl, mut node, images, sim: _sim }) = Lab::start(Share::Shared, role).await else { return };
    let luks = HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]);
    g.sh("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/d/s").await.unwrap();
    let staging = "/var/lib/kubelet/plugins/kubernetes.io/csi/d/s/globalmount".to_string();

    let src = create_vol(&ctl, "pvc-src", "ext4").await;
    let step = Step { vol: &src, staging: staging.clone(), target: String::new(), secrets: luks.clone(), fs: "ext4" };
    let pc = ctl.controller_publish_volume(Request::new(publish_to_112(&src, "ext4"))).await.unwrap().into_inner().publish_context;
    node.node_stage_volume(step.stage(&pc)).await.unwrap();
    let sum = g.sh(&format!("dd if=/dev/urandom of={staging}/d bs=1M count=4 2>/dev/null && sync && sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
    // Quiesced: the filesystem is unmounted while the snapshot is copied.
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: src.volume_id.clone(), staging_target_path: staging.clone() }).await.unwrap();

    let t = Instant::now();
    let snap = loop {
        let s = ctl
            .create_snapshot(Request::new(csi::CreateSnapshotRequest { source_volume_id: src.volume_id.clone(), name: "snapshot-1".into(), ..Default::default() }))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
        if s.ready_to_use {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "snapshot never ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("MEASURE snapshot of 1 GiB ready after {:?}", t.elapsed());
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: src.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() })).await.unwrap();

    let mut restore = csi::CreateVolumeRequest {
        name: "pvc-restored".into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
        volume_capabilities: vec![cap("ext4")],
        parameters: HashMap::from([("storage".into(), "local-lvm".into())]),
        ..Default::default()
    };
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource { snapshot_id: snap.snapshot_id.clone() })),
    });
    let restored = ctl.create_volume(Request::new(restore)).await.unwrap().into_inner().volume.unwrap();
    assert_ne!(restored.volume_id, src.volume_id);
    let step = Step { vol: &restored, staging: staging.clone(), target: String::new(), secrets: luks, fs: "ext4" };
    let pc = ctl.controller_publish_volume(Request::new(publish_to_112(&restored, "ext4"))).await.unwrap().into_inner().publish_context;
    node.node_stage_volume(step.stage(&pc)).await.unwrap();
    let got = g.sh(&format!("sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
    assert_eq!(got, sum, "the restored volume has the snapshot's bytes");
    let staged = g.sh("grep 'volume staged' /run/node.log | tail -1").await.unwrap();
    assert!(!staged.contains("luks_format") && !staged.contains("\"mkfs\""), "the restored volume was opened, not formatted: {staged}");
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: restored.volume_id.clone(), staging_target_path: staging.clone() }).await.unwrap();
    ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: restored.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() })).await.unwrap();
    for id in [&restored.volume_id, &src.volume_id] {
        ctl.delete_volume(Request::new(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })).await.unwrap();
    }
    ctl.delete_snapshot(Request::new(csi::DeleteSnapshotRequest { snapshot_id: snap.snapshot_id.clone(), ..Default::default() })).await.unwrap();
    let left: Vec<_> = std::fs::read_dir(images.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "backing files left behind: {left:?}");
}

/// The node plugin in the guest, as the conformance suite sees it: disks
/// arrive by ControllerPublish (a QMP hot-plug), files and mounts are read
/// through the guest's shell.
struct GuestNode<'a> {
    g: &'a mut Guest,
    ctl: ControllerService,
}

impl conformance::node::NodeHost for GuestNode<'_> {
    async fn disk(&mut self, n: u32) -> Result<String, String> {
        let v = create_vol(&self.ctl, &format!("pvc-conf-{n}"), "ext4").await;
        let pc = self.ctl.controller_publish_volume(Request::new(publish_to_112(&v, "ext4"))).await.map_err(|e| e.to_string())?;
        Ok(pc.into_inner().publish_context.get("wwn").cloned().unwrap_or_default().trim_start_matches("0x").to_string())
    }

    fn kubelet_root(&self) -> String {
        "/var/lib/kubelet".into()
    }

    async fn mkdir(&mut self, path: &str) -> Result<(), String> {
        self.g.sh(&format!("mkdir -p '{path}'")).await.map(|_| ()).map_err(|e| e.to_string())
    }

    async fn is_dir(&mut self, path: &str) -> bool {
        self.g.sh_status(&format!("test -d '{path}'")).await.is_ok_and(|(c, _)| c == 0)
    }

    async fn exists(&mut self, path: &str) -> bool {
        self.g.sh_status(&format!("test -e '{path}' || test -L '{path}'")).await.is_ok_and(|(c, _)| c == 0)
    }

    async fn mounted(&mut self, path: &str) -> bool {
        self.g.sh_status(&format!("awk '$2==\"{path}\" {{f=1}} END {{exit !f}}' /proc/mounts")).await.is_ok_and(|(c, _)| c == 0)
    }

    async fn write(&mut self, path: &str, data: &str) -> Result<(), String> {
        match self.g.sh_status(&format!("printf %s '{data}' > '{path}' 2>&1")).await {
            Ok((0, _)) => Ok(()),
            Ok((_, out)) => Err(out),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn read(&mut self, path: &str) -> Option<String> {
        match self.g.sh_status(&format!("cat '{path}'")).await {
            Ok((0, out)) => Some(out.trim().to_string()),
            _ => None,
        }
    }
}

/// The conformance suite's Node clauses against the node plugin and hostd
/// in the guest, with real hot-plugged disks and udev.
#[tokio::test]
async fn node_follows_the_spec_in_the_guest() {
    let Some(Lab { mut g, ctl, mut node, sim: _sim, images: _images }) = Lab::start(Share::Shared, MINIMAL_ROLE).await else { return };
    let mut report = conformance::Report::default();
    let mut host = GuestNode { g: &mut g, ctl };
    conformance::node::run_with(&mut host, &mut node, &mut report).await;
    print!("{}", report.render("CSI spec clauses: Node (node plugin and hostd in the guest VM)"));
    assert!(report.results.len() >= 30, "only {} clauses ran", report.results.len());
    assert!(report.failed().is_empty(), "failed clauses: {:#?}", report.failed());
}

/// Calls `f` until it succeeds, as a sidecar would, while faults are
/// injected; a final error fails the test. Returns the value and the retries.
async fn until_ok<T, F, Fut>(what: &str, mut f: F) -> (T, u32)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    for attempt in 0..40 {
        match f().await {
            Ok(r) => return (r.into_inner(), attempt),
            Err(s) if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Internal | tonic::Code::Aborted | tonic::Code::DeadlineExceeded) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!("{what}: final error {:?}: {}", s.code(), s.message()),
        }
    }
    panic!("{what}: not done after 40 attempts")
}

/// The fault campaign in the guest: volumes attached, staged, written,
/// grown, unstaged and detached over and over while Proxmox faults are
/// injected (failed hot-plugs, tasks failing after their UPID, 5xx); every
/// stage checks the bytes written before.
#[tokio::test]
async fn soak_in_the_guest_keeps_every_byte() {
    use rand::{Rng, SeedableRng};
    let Some(Lab { mut g, ctl, mut node, sim, images: _images }) = Lab::start(Share::Shared, MINIMAL_ROLE).await else { return };
    let http = reqwest::Client::new();
    let knobs = |body: &'static str| {
        let (http, url) = (http.clone(), format!("http://{}/pvesim/knobs", sim.addr));
        async move { http.post(url).body(body).send().await.unwrap() }
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let luks = HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]);
    let mut vols = Vec::new();
    for (i, (fs, secrets)) in [("ext4", HashMap::new()), ("xfs", HashMap::new()), ("ext4", luks)].into_iter().enumerate() {
        let vol = create_vol(&ctl, &format!("pvc-soak-{i}"), fs).await;
        g.sh(&format!("mkdir -p /var/lib/kubelet/plugins/kubernetes.io/csi/d/soak{i}")).await.unwrap();
        vols.push((vol, fs, secrets, None::<String>, 1u64 << 30));
    }
    let (mut faults, mut retries) = (0u32, 0u32);
    for round in 0..14 {
        let i = rng.random_range(0..vols.len());
        let (vol, fs, secrets, sum, bytes) = vols[i].clone();
        let staging = format!("/var/lib/kubelet/plugins/kubernetes.io/csi/d/soak{i}/globalmount");
        let step = Step { vol: &vol, staging: staging.clone(), target: String::new(), secrets: secrets.clone(), fs };
        let fault = ["", r#"{"fail_hotplugs": 1}"#, r#"{"fail_tasks": 1}"#, r#"{"error_5xx_rate": 0.2}"#][rng.random_range(0..4)];
        if !fault.is_empty() {
            knobs(fault).await;
            faults += 1;
        }
        let (pc, n) = until_ok("publish", || ctl.controller_publish_volume(Request::new(publish_to_112(&vol, fs)))).await;
        retries += n;
        knobs(r#"{"error_5xx_rate": 0.0, "fail_hotplugs": 0, "fail_tasks": 0}"#).await;
        let (_, n) = until_ok("stage", || {
            let mut n = node.clone();
            let req = step.stage(&pc.publish_context);
            async move { n.node_stage_volume(req).await }
        })
        .await;
        retries += n;
        if let Some(want) = &sum {
            let got = g.sh(&format!("sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
            assert_eq!(&got, want, "round {round}: volume {i} lost its bytes");
        }
        let mut bytes = bytes;
        if rng.random_bool(0.3) && bytes < 2 << 30 {
            bytes += 512 << 20;
            let range = Some(csi::CapacityRange { required_bytes: bytes as i64, limit_bytes: 0 });
            let (_, n) = until_ok("expand", || {
                ctl.controller_expand_volume(Request::new(csi::ControllerExpandVolumeRequest {
                    volume_id: vol.volume_id.clone(),
                    capacity_range: range,
                    volume_capability: Some(cap(fs)),
                    ..Default::default()
                }))
            })
            .await;
            retries += n;
            node.node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: vol.volume_id.clone(),
                volume_path: staging.clone(),
                capacity_range: range,
                staging_target_path: staging.clone(),
                volume_capability: Some(cap(fs)),
                secrets: secrets.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("round {round}: NodeExpand of volume {i}: {}", e.message()));
        }
        let new_sum = g.sh(&format!("dd if=/dev/urandom of={staging}/d bs=1M count=2 2>/dev/null && sync && sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: staging.clone() }).await.unwrap();
        if rng.random_bool(0.5) {
            knobs(r#"{"fail_hotplugs": 1}"#).await;
            faults += 1;
        }
        let (_, n) = until_ok("unpublish", || {
            ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() }))
        })
        .await;
        retries += n;
        knobs(r#"{"fail_hotplugs": 0}"#).await;
        vols[i].3 = Some(new_sum);
        vols[i].4 = bytes;
    }
    // Every volume once more: the bytes last written are there.
    for (i, (vol, fs, secrets, sum, _)) in vols.iter().enumerate() {
        let Some(want) = sum else { continue };
        let staging = format!("/var/lib/kubelet/plugins/kubernetes.io/csi/d/soak{i}/globalmount");
        let step = Step { vol, staging: staging.clone(), target: String::new(), secrets: secrets.clone(), fs };
        let pc = ctl.controller_publish_volume(Request::new(publish_to_112(vol, fs))).await.unwrap().into_inner().publish_context;
        node.node_stage_volume(step.stage(&pc)).await.unwrap();
        let got = g.sh(&format!("sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
        assert_eq!(&got, want, "volume {i} lost its last bytes");
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest { volume_id: vol.volume_id.clone(), staging_target_path: staging }).await.unwrap();
        ctl.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: vol.volume_id.clone(), node_id: "worker-2/112".into(), ..Default::default() })).await.unwrap();
    }
    let vm: serde_json::Value = http.get(format!("http://{}/pvesim/vms/112", sim.addr)).send().await.unwrap().json().await.unwrap();
    assert_eq!(vm["data"]["pending"], serde_json::json!({}), "{vm}");
    let keys: Vec<&String> = vm["data"]["config"].as_object().unwrap().keys().filter(|k| k.starts_with("unused") || k.strip_prefix("scsi").is_some_and(|n| n.parse::<u32>().is_ok())).collect();
    assert!(keys.is_empty(), "left in VM 112: {keys:?}");
    eprintln!("MEASURE guest soak: 14 rounds, {faults} faults, {retries} retried calls, every byte intact");
}
