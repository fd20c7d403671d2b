//! A cluster switches from the Go driver (csi.proxmox.sinextra.dev v0.19)
//! while its volumes are in use. The Go driver's part is played as its
//! source does it: the controller's Proxmox calls (pkg/csi/controller.go
//! CreateVolume, pkg/csi/utils.go attachVolume: the LUN-derived WWN, no
//! serial) and the node's commands (pkg/csi/node.go NodeStageVolume and
//! NodePublishVolume; LUKS by siderolabs/go-blockdevice v0.4.8
//! blockdevice/encryption/luks/luks.go: `luksFormat --type luks2
//! --key-file=- -c aes-xts-plain64 <dev> --key-size=512`, opened as
//! `<kernel name>-encrypted`; mkfs and mount by k8s.io/mount-utils), and a
//! replicated volume in the Go driver's untagged holder VM. Then
//! this driver's controller and node plugin take the volumes over while
//! they are staged (one volume was attached by this driver's controller
//! and staged by the Go node plugin, as between the two switches of the
//! procedure in docs/migrating.md): a new pod on each, unpublish, unstage, detach, attach,
//! stage, the bytes checked, growth, a snapshot restored, delete. Nothing is
//! reformatted and no mapping is left behind.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;
use std::time::Duration;

use callers::kubelet::{Kubelet, Pod};
use callers::provisioner::{self, Claim, StorageClass};
use callers::{PersistentVolume, VolumeMode, resizer, snapshotter};
use e2e::guest::{Guest, Share};
use e2e::lab::{
    Lab, attach, detach, mkdirs, provision, restart_hostd, snapshot_when_ready, token_client,
};
use proxmox_csi_controller::pve::{self, Deadline};
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use reqwest::Method;
use tonic::Request;

const PASSPHRASE: &str = "correct horse battery staple";
/// The node id this driver's node plugin reports for the guest (VM 112).
const WORKER_2: &str = "worker-2/112";
/// Snapshots and restores make copy VMs.
const ROLE: &str = "VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Clone, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit";

fn luks() -> HashMap<String, String> {
    HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())])
}

/// One volume the Go driver's node plugin staged.
struct GoVolume {
    pv: PersistentVolume,
    /// The slot the Go controller attached it to (0: not yet, or this
    /// driver's controller did).
    lun: u32,
    /// Its class names the LUKS passphrase Secret (the Go driver encrypts
    /// filesystem volumes only).
    encrypted: bool,
    /// The Go node plugin opened the disk by its `/dev/disk/by-id/wwn-0x…`
    /// link (getDevicePath's fallback when sysfs had no match yet), so its
    /// mapping is `wwn-0x…-encrypted`, not `<kernel name>-encrypted`.
    by_id: bool,
    /// The Go driver's publish context.
    context: HashMap<String, String>,
}

impl GoVolume {
    /// Go's WWN: the hex of `PVC-ID%02d` with the LUN (utils.go attachVolume).
    fn wwn(&self) -> String {
        let ascii = format!("PVC-ID{:02}", self.lun);
        format!(
            "0x{}",
            ascii
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        )
    }
}

/// The Go CreateVolume's answer: the handle, the requested size, the
/// context StorageParameters.ToMap renders, the node's topology.
fn go_answer(handle: &str, claim: &Claim, context: &[(&str, &str)]) -> csi::Volume {
    csi::Volume {
        volume_id: handle.into(),
        capacity_bytes: claim.request_bytes,
        volume_context: context
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        content_source: None,
        accessible_topology: vec![csi::Topology {
            segments: HashMap::from([
                ("topology.kubernetes.io/region".into(), "region-1".into()),
                ("topology.kubernetes.io/zone".into(), "pve2".into()),
            ]),
        }],
    }
}

/// The Go controller's Proxmox calls, with the CSI token.
struct GoController {
    client: pve::Client,
}

impl GoController {
    fn new(sim: &pvesim::Running) -> Self {
        Self {
            client: token_client(sim),
        }
    }

    fn d() -> Deadline {
        Deadline::after(Duration::from_secs(60))
    }

    /// createVolume: `POST /nodes/{zone}/storage/{storage}/content` with
    /// vmid, filename and the size in KiB, no unit.
    async fn allocate(&self, storage: &str, vmid: u32, disk: &str, claim: &Claim) {
        let _: serde_json::Value = self
            .client
            .call(
                Method::POST,
                &format!("/nodes/pve2/storage/{storage}/content"),
                &[
                    ("vmid", vmid.to_string()),
                    ("filename", disk.to_string()),
                    ("size", (claim.request_bytes / 1024).to_string()),
                ],
                Self::d(),
            )
            .await
            .unwrap();
    }

    /// CreateVolume: the disk allocated; the answer's volume, as the
    /// provisioner writes its PV (context: StorageParameters.ToMap).
    async fn create(&self, claim: &Claim, sc: &StorageClass) -> PersistentVolume {
        self.create_on("local-lvm", claim, sc).await
    }

    async fn create_on(&self, storage: &str, claim: &Claim, sc: &StorageClass) -> PersistentVolume {
        let disk = format!("vm-9999-{}", claim.volume_name());
        self.allocate(storage, 9999, &disk, claim).await;
        let volume = go_answer(
            &format!("region-1/pve2/{storage}/{disk}"),
            claim,
            &[
                ("storage", storage),
                ("backup", "0"),
                ("iothread", "1"),
                ("replicate", "0"),
            ],
        );
        provisioner::persistent_volume(sc, claim, &volume)
    }

    /// CreateVolume from a snapshot smaller than the claim (copyVolume,
    /// then `size < volSizeBytes`): the snapshot's bytes at the snapshot's
    /// size, the size asked for left to ControllerPublishVolume in the
    /// context (`resizeRequired`, `resizeSizeBytes`). The copy's bytes are
    /// `source`'s backing file, copied as Proxmox's copy would.
    async fn restore_smaller(
        &self,
        images: &std::path::Path,
        source: &PersistentVolume,
        claim: &Claim,
        sc: &StorageClass,
    ) -> PersistentVolume {
        let disk = format!("vm-9999-{}", claim.volume_name());
        let copied = Claim::new(&claim.name, &claim.uid, 1 << 30);
        self.allocate("local-lvm", 9999, &disk, &copied).await;
        let from = source.handle.rsplit('/').next().unwrap();
        std::fs::copy(
            pvesim::qmp::backing_path(images, &format!("local-lvm:{from}")),
            pvesim::qmp::backing_path(images, &format!("local-lvm:{disk}")),
        )
        .unwrap();
        let wanted = claim.request_bytes.to_string();
        let volume = go_answer(
            &format!("region-1/pve2/local-lvm/{disk}"),
            claim,
            &[
                ("storage", "local-lvm"),
                ("backup", "0"),
                ("iothread", "1"),
                ("replicate", "0"),
                ("resizeRequired", "true"),
                ("resizeSizeBytes", wanted.as_str()),
            ],
        );
        provisioner::persistent_volume(sc, claim, &volume)
    }

    /// CreateVolume with `replicate: "true"` (prepareReplication,
    /// createReplication): a holder VM named after the PV, untagged, never
    /// started; the disk owned by it, attached to its first free slot
    /// (scsi1) with `replicate=1,backup=1` and that LUN's WWN. The handle
    /// has no zone (VolumeSharedID). One node here: no replication job.
    async fn create_replicated(&self, claim: &Claim, sc: &StorageClass) -> PersistentVolume {
        let pv = claim.volume_name();
        let upid: String = self
            .client
            .call(
                Method::POST,
                "/nodes/pve2/qemu",
                &[
                    ("vmid", "10000".into()),
                    ("name", pv.clone()),
                    ("boot", "order=scsi0".into()),
                    ("agent", "0".into()),
                    ("machine", "pc".into()),
                    ("cores", "1".into()),
                    ("memory", "512".into()),
                    ("scsihw", "virtio-scsi-single".into()),
                ],
                Self::d(),
            )
            .await
            .unwrap();
        self.client.wait_task(&upid, Self::d()).await.unwrap();
        let disk = format!("vm-10000-{pv}");
        self.allocate("local-zfs", 10000, &disk, claim).await;
        let upid: String = self
            .client
            .call(
                Method::POST,
                "/nodes/pve2/qemu/10000/config",
                &[(
                    "scsi1",
                    format!("local-zfs:{disk},replicate=1,backup=1,wwn=0x5056432d49443031"),
                )],
                Self::d(),
            )
            .await
            .unwrap();
        self.client.wait_task(&upid, Self::d()).await.unwrap();
        let volume = go_answer(
            &format!("region-1//local-zfs/{disk}"),
            claim,
            &[
                ("storage", "local-zfs"),
                ("backup", "0"),
                ("iothread", "1"),
                ("replicate", "1"),
                ("replicateZones", "pve2"),
            ],
        );
        provisioner::persistent_volume(sc, claim, &volume)
    }

    /// ControllerPublishVolume → attachVolume: the first of scsi1–scsi29
    /// with no entry in the VM config, with the drive options of ToCFG and
    /// that LUN's WWN, no serial; the task awaited.
    async fn attach(&self, v: &mut GoVolume) {
        let cfg: serde_json::Value = self
            .client
            .call(Method::GET, "/nodes/pve2/qemu/112/config", &[], Self::d())
            .await
            .unwrap();
        v.lun = (1..30)
            .find(|n| cfg.get(format!("scsi{n}")).is_none())
            .expect("no free lun found");
        // region/zone/storage/disk; a replicated volume's zone is empty.
        let parts: Vec<&str> = v.pv.handle.split('/').collect();
        let (storage, disk) = (parts[2], parts[3]);
        let replicate = &v.pv.attributes["replicate"];
        let line = format!(
            "{storage}:{disk},backup=0,iothread=1,replicate={replicate},wwn={}",
            v.wwn()
        );
        let upid: String = self
            .client
            .call(
                Method::POST,
                "/nodes/pve2/qemu/112/config",
                &[(format!("scsi{}", v.lun).as_str(), line)],
                Self::d(),
            )
            .await
            .unwrap();
        self.client.wait_task(&upid, Self::d()).await.unwrap();
        v.context = HashMap::from([
            (
                "DevicePath".to_string(),
                format!("/dev/disk/by-id/wwn-{}", v.wwn()),
            ),
            ("lun".to_string(), v.lun.to_string()),
        ]);
    }
}

/// What the Go node plugin does in NodeStageVolume and NodePublishVolume,
/// as shell in the guest; kubelet's vol_data.json first. Returns the
/// checksum of 8 MiB written through the pod's target.
async fn go_node_stage_and_publish(g: &mut Guest, k: &Kubelet, v: &GoVolume, pod: &Pod) -> String {
    let link = &v.context["DevicePath"];
    let staging = k.staging_path(&v.pv);
    let target = k.target_path(pod, &v.pv);
    let (vol_data, json) = k.vol_data(pod, &v.pv, "worker-2");
    let mut script = format!(
        "set -e; udevadm settle; dev=$(readlink -f {link}); kname=$(basename $dev); \
         mkdir -p {staging} $(dirname {vol_data}); printf '%s' '{json}' > {vol_data}; "
    );
    // What luks.go Open names the mapping after: the path it was given.
    script += &if v.by_id {
        format!("name=$(basename {link}); ")
    } else {
        "name=$kname; ".to_string()
    };
    if v.pv.volume_mode == VolumeMode::Block {
        // Stage: nothing, whatever the class's secrets. Publish: the by-id
        // path bound onto a file.
        script += &format!(
            "mkdir -p $(dirname {target}); touch {target}; mount -o bind,rw {link} {target}; \
             dd if=/dev/urandom of=/tmp/blk bs=1M count=8 2>/dev/null; \
             dd if=/tmp/blk of={target} bs=1M count=8 conv=fsync 2>/dev/null; \
             sha256sum /tmp/blk | cut -d' ' -f1"
        );
    } else {
        let fs = &v.pv.fs_type;
        let mut device = "$dev".to_string();
        if v.encrypted {
            script += &format!(
                "printf '%s' '{PASSPHRASE}' | cryptsetup luksFormat --type luks2 --key-file=- -c aes-xts-plain64 $dev --key-size=512; \
                 printf '%s' '{PASSPHRASE}' | cryptsetup luksOpen $dev $name-encrypted --key-file=-; "
            );
            device = "/dev/mapper/$name-encrypted".into();
        }
        let (mkfs, opts) = match fs.as_str() {
            "xfs" => (format!("mkfs.xfs -f {device}"), "defaults,nouuid"),
            _ => (format!("mkfs.{fs} -F -m0 {device}"), "defaults"),
        };
        script += &format!(
            "{mkfs} >/dev/null; mount -t {fs} -o {opts} {device} {staging}; \
             mkdir -p {target}; mount -t {fs} -o bind,rw {staging} {target}; \
             dd if=/dev/urandom of={target}/data bs=1M count=8 2>/dev/null; sync; \
             sha256sum {target}/data | cut -d' ' -f1"
        );
    }
    // A subshell: `set -e` must not outlive the script in the console's shell.
    let (rc, out) = g.sh_status(&format!("({script})")).await.unwrap();
    assert_eq!(rc, 0, "the Go node's stage and publish failed: {out}");
    let sum = out.lines().last().unwrap_or_default().trim().to_string();
    assert_eq!(sum.len(), 64, "{out}");
    sum
}

/// The checksum of the 8 MiB written, read through `pod`'s target.
async fn sum_at(g: &mut Guest, k: &Kubelet, pv: &PersistentVolume, pod: &Pod) -> String {
    let target = k.target_path(pod, pv);
    let cmd = if pv.volume_mode == VolumeMode::Block {
        format!("dd if={target} bs=1M count=8 2>/dev/null | sha256sum | cut -d' ' -f1")
    } else {
        format!("sha256sum {target}/data | cut -d' ' -f1")
    };
    g.sh(&cmd).await.unwrap().trim().to_string()
}

/// The size of the filesystem mounted at `path`, from BusyBox's df (KiB).
async fn df_bytes(g: &mut Guest, path: &str) -> u64 {
    g.sh(&format!("df -P -k {path} | tail -1 | awk '{{print $2}}'"))
        .await
        .unwrap()
        .trim()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// The guest lab of a cluster switching from the Go driver: local-lvm, a
/// ZFS pool and thick LVM without saferemove (san), this driver's disks
/// carrying the cluster's id as deployed, and hostd restarted with
/// `--go-takeover`, as docs/migrating.md says (the Go driver's disks carry
/// no serial that ties them to a volume). `None` where QEMU is missing
/// outside CI.
async fn switching() -> Option<Lab> {
    let mut lab = Lab::start_with(
        Share::Shared,
        ROLE,
        |cluster| {
            cluster.replace(
                "storages: [{ id: local-lvm, type: lvmthin, total: 107374182400 }]",
                "storages: [{ id: local-lvm, type: lvmthin, total: 107374182400 }, { id: local-zfs, type: zfspool, total: 107374182400 }, \
                 { id: san, type: lvm, total: 107374182400 }]",
            )
        },
        Some("e2eguest1"),
    )
    .await?;
    let restarted = restart_hostd(&mut lab.g, "--go-takeover").await;
    assert!(restarted.contains("--go-takeover"), "hostd: {restarted}");
    Some(lab)
}

/// The pod that used a volume under the Go driver, and the one after the switch.
fn old_pod() -> Pod {
    Pod::new("0f1e2d3c-4b5a-4968-8776-655443322110")
}

fn new_pod() -> Pod {
    Pod::new("1b2c3d4e-5f60-4172-8394-a5b6c7d8e9f0")
}

#[tokio::test]
async fn a_cluster_switched_from_the_go_driver_keeps_its_volumes() {
    let Some((mut g, ctl, mut node, held)) = switching().await.map(Lab::parts) else {
        return;
    };
    let sim = held.sim;
    let images = held.images;
    let k = Kubelet::new("/var/lib/kubelet");
    let go = GoController::new(&sim);
    let ext4 = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let xfs = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ]);
    let block = StorageClass::new(&[("storage", "local-lvm")]);
    let claims = [
        (Claim::new("go-ext4", "go-ext4", 1 << 30), &ext4, false),
        (Claim::new("go-xfs", "go-xfs", 1 << 30), &xfs, true),
        (Claim::new("go-byid", "go-byid", 1 << 30), &ext4, true),
        (
            // Of a LUKS class: the Go driver left it unencrypted.
            Claim::new("go-blk", "go-blk", 1 << 30).block(),
            &block,
            true,
        ),
    ];

    // The Go driver's life of each volume: created, attached, staged, in a pod.
    let old_pod = Pod::new("0f1e2d3c-4b5a-4968-8776-655443322110");
    let mut volumes = Vec::new();
    let mut sums = Vec::new();
    for (claim, sc, encrypted) in &claims {
        let mut v = GoVolume {
            pv: go.create(claim, sc).await,
            lun: 0,
            encrypted: *encrypted,
            by_id: claim.name == "go-byid",
            context: HashMap::new(),
        };
        go.attach(&mut v).await;
        sums.push(go_node_stage_and_publish(&mut g, &k, &v, &old_pod).await);
        volumes.push(v);
    }
    // A volume the Go driver replicated, in its holder VM.
    let replicated = StorageClass::new(&[
        ("storage", "local-zfs"),
        ("csi.storage.k8s.io/fstype", "ext4"),
        ("replicate", "true"),
        ("replicateZones", "pve2"),
    ]);
    let claim = Claim::new("go-rep", "go-rep", 1 << 30);
    let mut v = GoVolume {
        pv: go.create_replicated(&claim, &replicated).await,
        lun: 0,
        encrypted: false,
        by_id: false,
        context: HashMap::new(),
    };
    go.attach(&mut v).await;
    sums.push(go_node_stage_and_publish(&mut g, &k, &v, &old_pod).await);
    volumes.push(v);

    // Between the controller's switch and this node's: this driver's
    // controller attaches, the Go node plugin stages by the publish
    // context's DevicePath (getDevicePath: the wwid of /sys/bus/scsi).
    let claim = Claim::new("go-mixed", "go-mixed", 1 << 30);
    let pv = provision(&ctl, &ext4, &claim).await;
    let context = attach(&ctl, &pv, WORKER_2).await;
    let v = GoVolume {
        pv,
        lun: 0,
        encrypted: false,
        by_id: false,
        context,
    };
    sums.push(go_node_stage_and_publish(&mut g, &k, &v, &old_pod).await);
    volumes.push(v);
    let mapped = g.sh("ls /dev/mapper").await.unwrap();
    assert!(
        mapped.contains("sd") && mapped.contains("-encrypted"),
        "{mapped}"
    );
    assert!(mapped.contains("wwn-0x"), "{mapped}");

    // The switch: this driver's node plugin and controller from here on.
    // A new pod on each volume while the Go driver's staging stands: a
    // Go-staged block volume has nothing in its staging directory.
    let new_pod = Pod::new("9a8b7c6d-5e4f-4031-8223-344556677889");
    for (v, sum) in volumes.iter().zip(&sums) {
        mkdirs(&mut g, k.publish_dirs(&new_pod, &v.pv)).await;
        node.node_publish_volume(k.node_publish(&v.pv, &new_pod, &v.context))
            .await
            .unwrap_or_else(|e| panic!("NodePublish of {} after the switch: {e:?}", v.pv.name));
        assert_eq!(
            &sum_at(&mut g, &k, &v.pv, &new_pod).await,
            sum,
            "{}",
            v.pv.name
        );
    }
    // Both pods go; the volumes are unstaged, the Go mapping closed.
    for v in &volumes {
        for pod in [&old_pod, &new_pod] {
            node.node_unpublish_volume(k.node_unpublish(&v.pv, pod))
                .await
                .unwrap_or_else(|e| panic!("NodeUnpublish of {}: {e:?}", v.pv.name));
        }
        node.node_unstage_volume(k.node_unstage(&v.pv))
            .await
            .unwrap_or_else(|e| panic!("NodeUnstage of {}: {e:?}", v.pv.name));
    }
    let left = g
        .sh("ls /dev/mapper; grep ' /var/lib/kubelet/' /proc/mounts; true")
        .await
        .unwrap();
    assert!(
        !left.contains("-encrypted") && !left.contains("/var/lib/kubelet/"),
        "a mapping or a mount was left: {left}"
    );
    for v in &volumes {
        detach(&ctl, &v.pv, WORKER_2).await;
    }
    let vm = sim.ctx.cluster().vms.get(&112).cloned().unwrap();
    assert!(
        !vm.config.values().any(|l| l.contains("pvc-go-")),
        "{:?}",
        vm.config
    );

    // The Go driver's restore of go-ext4 into a 2 GiB claim, made before
    // the switch and never published: its first attach grows the disk,
    // its stage the filesystem; the bytes are go-ext4's.
    let claim = Claim::new("go-restore", "go-restore", 2 << 30);
    let go_restore = go
        .restore_smaller(images.path(), &volumes[0].pv, &claim, &ext4)
        .await;
    let pc = attach(&ctl, &go_restore, WORKER_2).await;
    assert_eq!(
        pc.get("resizeRequired").map(String::as_str),
        Some("true"),
        "{pc:?}"
    );
    let restore_pod = Pod::new("2c3d4e5f-6071-4283-94a5-b6c7d8e9f0a1");
    mkdirs(&mut g, k.stage_dirs(&go_restore)).await;
    node.node_stage_volume(k.node_stage(&go_restore, &pc, HashMap::new()))
        .await
        .unwrap_or_else(|e| panic!("NodeStage of the Go restore: {e:?}"));
    mkdirs(&mut g, k.publish_dirs(&restore_pod, &go_restore)).await;
    node.node_publish_volume(k.node_publish(&go_restore, &restore_pod, &pc))
        .await
        .unwrap();
    assert_eq!(sum_at(&mut g, &k, &go_restore, &restore_pod).await, sums[0]);
    assert!(
        df_bytes(&mut g, &k.target_path(&restore_pod, &go_restore)).await > 3 << 29,
        "the Go restore's filesystem did not grow to its 2 GiB"
    );
    node.node_unpublish_volume(k.node_unpublish(&go_restore, &restore_pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&go_restore))
        .await
        .unwrap();
    detach(&ctl, &go_restore, WORKER_2).await;

    // Attached, staged and published again by this driver: the same bytes,
    // nothing formatted.
    let pod = Pod::new("1b2c3d4e-5f60-4172-8394-a5b6c7d8e9f0");
    let mut contexts = Vec::new();
    for (v, sum) in volumes.iter().zip(&sums) {
        let pc = attach(&ctl, &v.pv, WORKER_2).await;
        mkdirs(&mut g, k.stage_dirs(&v.pv)).await;
        let secrets = if v.encrypted { luks() } else { HashMap::new() };
        node.node_stage_volume(k.node_stage(&v.pv, &pc, secrets))
            .await
            .unwrap_or_else(|e| panic!("NodeStage of {}: {e:?}", v.pv.name));
        mkdirs(&mut g, k.publish_dirs(&pod, &v.pv)).await;
        node.node_publish_volume(k.node_publish(&v.pv, &pod, &pc))
            .await
            .unwrap();
        assert_eq!(&sum_at(&mut g, &k, &v.pv, &pod).await, sum, "{}", v.pv.name);
        contexts.push(pc);
    }
    let staged = g.sh("grep 'volume staged' /run/node.log").await.unwrap();
    assert!(
        !staged.contains("mkfs") && !staged.contains("luks_format"),
        "a Go volume was formatted: {staged}"
    );
    // The Go driver's unencrypted block volume of a LUKS class stays as it was.
    assert!(staged.contains("not encrypted: the disk holds"), "{staged}");

    // Growth, online, of the filesystems (LUKS too).
    for v in volumes
        .iter()
        .filter(|v| v.pv.volume_mode == VolumeMode::Filesystem)
    {
        ctl.controller_expand_volume(Request::new(resizer::controller_expand(&v.pv, 2 << 30)))
            .await
            .unwrap();
        let secrets = if v.encrypted { luks() } else { HashMap::new() };
        node.node_expand_volume(k.node_expand(&v.pv, &pod, 2 << 30, secrets))
            .await
            .unwrap_or_else(|e| panic!("NodeExpand of {}: {e:?}", v.pv.name));
        let size = df_bytes(&mut g, &k.target_path(&pod, &v.pv)).await;
        assert!(size > 3 << 29, "{}: {size} bytes after growth", v.pv.name);
    }

    // Quiesced, every volume goes; the ext4 one is snapshotted and restored first.
    for v in &volumes {
        node.node_unpublish_volume(k.node_unpublish(&v.pv, &pod))
            .await
            .unwrap();
        node.node_unstage_volume(k.node_unstage(&v.pv))
            .await
            .unwrap();
    }
    let take = snapshotter::create_snapshot(
        "7e6d5c4b-3a29-4817-9605-f4e3d2c1b0a9",
        "go-ext4-snap",
        &volumes[0].pv,
        &[],
    );
    let (snap, _) = snapshot_when_ready(&ctl, &take).await;
    for v in &volumes {
        detach(&ctl, &v.pv, WORKER_2).await;
    }
    // Larger than its 2 GiB source: the filesystem grows at stage.
    let claim = Claim::new("go-restored", "go-restored", 3 << 30).from_snapshot(&snap.snapshot_id);
    let restored = provision(&ctl, &ext4, &claim).await;
    let pc = attach(&ctl, &restored, WORKER_2).await;
    mkdirs(&mut g, k.stage_dirs(&restored)).await;
    node.node_stage_volume(k.node_stage(&restored, &pc, HashMap::new()))
        .await
        .unwrap();
    mkdirs(&mut g, k.publish_dirs(&pod, &restored)).await;
    node.node_publish_volume(k.node_publish(&restored, &pod, &pc))
        .await
        .unwrap();
    assert_eq!(sum_at(&mut g, &k, &restored, &pod).await, sums[0]);
    let size = df_bytes(&mut g, &k.target_path(&pod, &restored)).await;
    assert!(
        size > 5 << 29,
        "the restore's filesystem is {size} bytes on 3 GiB"
    );
    node.node_unpublish_volume(k.node_unpublish(&restored, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&restored))
        .await
        .unwrap();
    detach(&ctl, &restored, WORKER_2).await;

    // A new block volume of a LUKS class is encrypted by this driver.
    let claim = Claim::new("go-blk-luks", "go-blk-luks", 1 << 30).block();
    let sealed = provision(&ctl, &block, &claim).await;
    let pc = attach(&ctl, &sealed, WORKER_2).await;
    mkdirs(&mut g, k.stage_dirs(&sealed)).await;
    node.node_stage_volume(k.node_stage(&sealed, &pc, luks()))
        .await
        .unwrap();
    mkdirs(&mut g, k.publish_dirs(&pod, &sealed)).await;
    node.node_publish_volume(k.node_publish(&sealed, &pod, &pc))
        .await
        .unwrap();
    let target = k.target_path(&pod, &sealed);
    let wwn = &pc["wwn"];
    let check = g
        .sh(&format!(
            "dd if=/dev/urandom of=/tmp/sealed bs=1M count=4 2>/dev/null; \
             dd if=/tmp/sealed of={target} bs=1M count=4 conv=fsync 2>/dev/null; \
             a=$(sha256sum /tmp/sealed | cut -d' ' -f1); \
             b=$(dd if={target} bs=1M count=4 2>/dev/null | sha256sum | cut -d' ' -f1); \
             c=$(dd if=/dev/disk/by-id/wwn-{wwn} bs=1M count=4 2>/dev/null | sha256sum | cut -d' ' -f1); \
             cryptsetup isLuks /dev/disk/by-id/wwn-{wwn} && echo luks; \
             [ $a = $b ] && echo same-through-the-pod; [ $a != $c ] && echo not-on-the-disk"
        ))
        .await
        .unwrap();
    assert!(
        check.contains("luks")
            && check.contains("same-through-the-pod")
            && check.contains("not-on-the-disk"),
        "{check}"
    );
    node.node_unpublish_volume(k.node_unpublish(&sealed, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&sealed))
        .await
        .unwrap();
    detach(&ctl, &sealed, WORKER_2).await;

    ctl.delete_snapshot(Request::new(snapshotter::delete_snapshot(
        &snap.snapshot_id,
    )))
    .await
    .unwrap();
    for pv in volumes
        .iter()
        .map(|v| &v.pv)
        .chain([&restored, &sealed, &go_restore])
    {
        ctl.delete_volume(Request::new(provisioner::delete_volume(pv)))
            .await
            .unwrap();
    }
    // The simulator's state, released before the next await.
    {
        let cluster = sim.ctx.cluster();
        let vm = cluster.vms.get(&112).unwrap();
        assert!(
            !vm.config
                .iter()
                .any(|(k, v)| k.starts_with("unused") || v.contains("pvc-go")),
            "{:?}",
            vm.config
        );
        let disks: Vec<&String> = cluster
            .volumes
            .values()
            .flat_map(|m| m.keys())
            .filter(|n| n.contains("go-"))
            .collect();
        assert!(disks.is_empty(), "disks left: {disks:?}");
        // The Go driver's holder went with its volume.
        assert!(!cluster.vms.contains_key(&10000));
    }
    let left = g.sh("ls /dev/mapper; dmsetup ls; true").await.unwrap();
    assert!(
        !left.contains("-encrypted") && !left.contains("pvecsi-"),
        "{left}"
    );
}

/// A Go node plugin that died in NodeUnstageVolume between its unmount and
/// its luksClose leaves the mapping open on the disk, named after the by-id
/// link (`wwn-0x…-encrypted`); this driver's next stage of that disk closes
/// it instead of refusing the disk, and the bytes are the Go volume's.
#[tokio::test]
async fn a_mapping_a_dead_go_node_plugin_left_open_is_closed_at_the_next_stage() {
    let Some((mut g, ctl, mut node, held)) = switching().await.map(Lab::parts) else {
        return;
    };
    let sim = held.sim;
    let k = Kubelet::new("/var/lib/kubelet");
    let go = GoController::new(&sim);
    let (old_pod, pod) = (old_pod(), new_pod());
    let ext4 = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let claim = Claim::new("go-idle", "go-idle", 1 << 30);
    let mut idle = GoVolume {
        pv: go.create(&claim, &ext4).await,
        lun: 0,
        encrypted: true,
        by_id: true,
        context: HashMap::new(),
    };
    go.attach(&mut idle).await;
    let idle_sum = go_node_stage_and_publish(&mut g, &k, &idle, &old_pod).await;
    g.sh(&format!(
        "umount {} && umount {}",
        k.target_path(&old_pod, &idle.pv),
        k.staging_path(&idle.pv)
    ))
    .await
    .unwrap();
    let open = g.sh("ls /dev/mapper").await.unwrap();
    assert!(
        open.contains("wwn-0x") && open.contains("-encrypted"),
        "{open}"
    );
    mkdirs(&mut g, k.stage_dirs(&idle.pv)).await;
    node.node_stage_volume(k.node_stage(&idle.pv, &idle.context, luks()))
        .await
        .unwrap_or_else(|e| panic!("NodeStage over the Go driver's idle mapping: {e:?}"));
    mkdirs(&mut g, k.publish_dirs(&pod, &idle.pv)).await;
    node.node_publish_volume(k.node_publish(&idle.pv, &pod, &idle.context))
        .await
        .unwrap();
    assert_eq!(sum_at(&mut g, &k, &idle.pv, &pod).await, idle_sum);
    let open = g.sh("ls /dev/mapper").await.unwrap();
    assert!(
        !open.contains("-encrypted"),
        "the Go mapping stayed: {open}"
    );
    node.node_unpublish_volume(k.node_unpublish(&idle.pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&idle.pv))
        .await
        .unwrap();
    detach(&ctl, &idle.pv, WORKER_2).await;
    ctl.delete_volume(Request::new(provisioner::delete_volume(&idle.pv)))
        .await
        .unwrap();
}

/// Thick LVM without saferemove: a Go volume deleted leaves its ext4 and
/// data in the extents the next volume gets. This driver's new volume
/// there is formatted on its first stage; nothing of the Go volume shows
/// through.
#[tokio::test]
async fn a_new_volume_over_a_deleted_go_volumes_thick_lvm_extents_is_formatted() {
    let Some((mut g, ctl, mut node, held)) = switching().await.map(Lab::parts) else {
        return;
    };
    let sim = held.sim;
    let k = Kubelet::new("/var/lib/kubelet");
    let go = GoController::new(&sim);
    let (old_pod, pod) = (old_pod(), new_pod());
    let thick = StorageClass::new(&[("storage", "san"), ("csi.storage.k8s.io/fstype", "ext4")]);
    let claim = Claim::new("go-thick", "go-thick", 1 << 30);
    let mut old = GoVolume {
        pv: go.create_on("san", &claim, &thick).await,
        lun: 0,
        encrypted: false,
        by_id: false,
        context: HashMap::new(),
    };
    go.attach(&mut old).await;
    go_node_stage_and_publish(&mut g, &k, &old, &old_pod).await;
    g.sh(&format!(
        "umount {} && umount {}",
        k.target_path(&old_pod, &old.pv),
        k.staging_path(&old.pv)
    ))
    .await
    .unwrap();
    detach(&ctl, &old.pv, WORKER_2).await;
    ctl.delete_volume(Request::new(provisioner::delete_volume(&old.pv)))
        .await
        .unwrap();
    let fresh = provision(&ctl, &thick, &Claim::new("thick-new", "thick-new", 1 << 30)).await;
    let pc = attach(&ctl, &fresh, WORKER_2).await;
    mkdirs(&mut g, k.stage_dirs(&fresh)).await;
    node.node_stage_volume(k.node_stage(&fresh, &pc, HashMap::new()))
        .await
        .unwrap_or_else(|e| panic!("first stage over the Go volume's extents: {e:?}"));
    let staged = g
        .sh("grep 'volume staged' /run/node.log | tail -1")
        .await
        .unwrap();
    assert!(
        staged.contains("wiped the head and tail") && staged.contains("mkfs ext4"),
        "{staged}"
    );
    mkdirs(&mut g, k.publish_dirs(&pod, &fresh)).await;
    node.node_publish_volume(k.node_publish(&fresh, &pod, &pc))
        .await
        .unwrap();
    let listed = g
        .sh(&format!("ls -A {}", k.target_path(&pod, &fresh)))
        .await
        .unwrap();
    assert_eq!(listed.trim(), "lost+found", "the Go volume shows through");
    node.node_unpublish_volume(k.node_unpublish(&fresh, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&fresh))
        .await
        .unwrap();
    detach(&ctl, &fresh, WORKER_2).await;
    ctl.delete_volume(Request::new(provisioner::delete_volume(&fresh)))
        .await
        .unwrap();
}
