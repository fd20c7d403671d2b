//! hostd's promises that need dm-crypt, in the guest: an existing LUKS
//! volume whose plaintext has no filesystem is never formatted; a raw block
//! LUKS volume is not unstaged (its mapping not closed) while a pod still
//! has it; a LUKS header costlier than hostd's bounds is refused before any
//! key is derived. Requests from their real senders (tests/callers).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;

use callers::kubelet::{Kubelet, Pod};
use callers::provisioner::{Claim, StorageClass};
use callers::{PersistentVolume, VolumeMode};
use e2e::guest::{Guest, Share};
use e2e::lab::{
    Lab, MINIMAL_ROLE, attach, attach_without_serial, mkdirs, provision, restart_hostd,
};
use proxmox_csi_common::contract::CTX_WWN;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use tonic::Code;
use tonic::transport::Channel;

const PASSPHRASE: &str = "correct horse battery staple";
const WORKER_2: &str = "worker-2/112";

fn luks() -> HashMap<String, String> {
    HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())])
}

fn block_class() -> StorageClass {
    StorageClass::new(&[("storage", "local-lvm")])
}

/// The SHA-256 of the first 8 MiB a pod reads at its block target.
async fn block_sum(g: &mut Guest, target: &str) -> String {
    g.sh(&format!(
        "dd if={target} bs=1M count=8 2>/dev/null | sha256sum | cut -d' ' -f1"
    ))
    .await
    .unwrap()
    .trim()
    .to_string()
}

/// The volume's LUKS mappings open in the guest.
async fn mappings(g: &mut Guest) -> usize {
    g.sh("ls /dev/mapper | grep -c '^pvecsi-' || true")
        .await
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A raw block volume of a LUKS class, staged and published to `pod`, with
/// 8 MiB of random bytes the pod wrote: the volume, its publish context,
/// the pod's target and the bytes' sum.
async fn written_luks_block(
    g: &mut Guest,
    ctl: &ControllerService,
    node: &mut NodeClient<Channel>,
    name: &str,
    pod: &Pod,
) -> (PersistentVolume, HashMap<String, String>, String, String) {
    let k = Kubelet::new("/var/lib/kubelet");
    let pv = provision(
        ctl,
        &block_class(),
        &Claim::new(name, name, 1 << 30).block(),
    )
    .await;
    let pc = attach(ctl, &pv, WORKER_2).await;
    mkdirs(g, k.stage_dirs(&pv)).await;
    node.node_stage_volume(k.node_stage(&pv, &pc, luks()))
        .await
        .unwrap();
    mkdirs(g, k.publish_dirs(pod, &pv)).await;
    node.node_publish_volume(k.node_publish(&pv, pod, &pc))
        .await
        .unwrap();
    let target = k.target_path(pod, &pv);
    g.sh(&format!(
        "dd if=/dev/urandom of={target} bs=1M count=8 conv=fsync 2>/dev/null"
    ))
    .await
    .unwrap();
    let written = block_sum(g, &target).await;
    (pv, pc, target, written)
}

#[tokio::test]
async fn an_existing_luks_volume_without_a_filesystem_is_never_formatted() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let k = Kubelet::new("/var/lib/kubelet");
    // A raw block volume of a LUKS class, written by its pod: a database's
    // bytes, no filesystem.
    let pod = Pod::new("5b7c0e1a-0000-4000-8000-00000000db01");
    let (pv, pc, target, written) = written_luks_block(&mut g, &ctl, &mut node, "db", &pod).await;
    node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();

    // The same volume staged as a filesystem (a PV rewritten by hand, or a
    // compromised node plugin): the mapping opens, holds no filesystem
    // signature, and this stage did not write its LUKS header.
    let as_fs = PersistentVolume {
        volume_mode: VolumeMode::Filesystem,
        fs_type: "ext4".into(),
        ..pv.clone()
    };
    mkdirs(&mut g, k.stage_dirs(&as_fs)).await;
    let e = node
        .node_stage_volume(k.node_stage(&as_fs, &pc, luks()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("no filesystem signature")
            && e.message().contains("refusing to format"),
        "{e:?}"
    );
    let log = g.sh("grep -c mkfs /run/hostd.log || true").await.unwrap();
    assert_eq!(log.trim(), "0", "hostd ran mkfs");
    node.node_unstage_volume(k.node_unstage(&as_fs))
        .await
        .unwrap();
    // The bytes are the pod's still.
    node.node_stage_volume(k.node_stage(&pv, &pc, luks()))
        .await
        .unwrap();
    node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
        .await
        .unwrap();
    assert_eq!(block_sum(&mut g, &target).await, written);
}

#[tokio::test]
async fn a_published_luks_block_volume_is_not_unstaged_and_keeps_its_mapping() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let k = Kubelet::new("/var/lib/kubelet");
    let pod = Pod::new("5b7c0e1a-0000-4000-8000-00000000b10c");
    let (pv, _pc, target, written) = written_luks_block(&mut g, &ctl, &mut node, "blk", &pod).await;
    // The pod's node is the kernel's dm-N, as sysfs names it.
    let bound = g
        .sh(&format!(
            "grep ' {target} ' /proc/self/mountinfo | cut -d' ' -f4"
        ))
        .await
        .unwrap();
    assert!(bound.trim().starts_with("/dm-"), "bound: {bound}");

    let e = node
        .node_unstage_volume(k.node_unstage(&pv))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("still published"), "{e:?}");
    assert_eq!(mappings(&mut g).await, 1, "the mapping was closed");
    assert_eq!(block_sum(&mut g, &target).await, written);

    node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
    assert_eq!(mappings(&mut g).await, 0, "the mapping stayed");
}

#[tokio::test]
async fn a_luks_header_above_the_kdf_bounds_is_refused_before_deriving() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let k = Kubelet::new("/var/lib/kubelet");
    let class = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let pv = provision(&ctl, &class, &Claim::new("kdf", "kdf", 1 << 30)).await;
    let pc = attach(&ctl, &pv, WORKER_2).await;
    // Whoever wrote the disk chose its key slot's cost: pbkdf2, 1000 rounds;
    // hostd bounds pbkdf2 at 999 here.
    let wwn = &pc[CTX_WWN];
    let restarted = g.sh(&format!(
        "n=0; until [ -e /dev/disk/by-id/wwn-{wwn} ]; do sleep 0.1; n=$((n+1)); [ $n -gt 300 ] && break; done; \
         printf '%s' '{PASSPHRASE}' | cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 \
         --pbkdf-force-iterations 1000 --key-file=- /dev/disk/by-id/wwn-{wwn}; \
         echo '--luks-kdf-bounds 1048576:4:64:999' > /run/hostd.args; kill $(pidof proxmox-csi-hostd); \
         while pidof proxmox-csi-hostd >/dev/null; do sleep 0.1; done; start-hostd & \
         n=0; until [ $(grep -c 'serving hostd' /run/hostd.log) -ge 2 ]; do sleep 0.1; n=$((n+1)); [ $n -gt 300 ] && break; done; \
         grep -c 'serving hostd' /run/hostd.log"
    ))
    .await
    .unwrap();
    assert_eq!(restarted.trim(), "2", "hostd did not start again");
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    let e = node
        .node_stage_volume(k.node_stage(&pv, &pc, luks()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("cost pbkdf2 with")
            && e.message().contains("iterations in all (at most 999)"),
        "{e:?}"
    );
    assert_eq!(
        mappings(&mut g).await,
        0,
        "a key was derived and the mapping opened"
    );
}

/// The Go driver attaches a disk with a WWN from its LUN and no serial:
/// nothing on the disk ties it to a volume, and the WWNs are a few
/// guessable values. Without `--go-takeover`, hostd stages such a disk
/// under no volume id, its own included, unless it is already staged.
#[tokio::test]
async fn a_disk_without_this_drivers_serial_is_staged_under_no_volume() {
    let Some((mut g, ctl, mut node, held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let sim = held.sim;
    let k = Kubelet::new("/var/lib/kubelet");
    let class = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let pv = provision(&ctl, &class, &Claim::new("m1", "m1", 1 << 30)).await;
    // Attached as the Go driver attaches, through the API with the driver's token.
    let pc = attach_without_serial(&sim, &pv, 5, "0x5056432d49443035").await;
    let other = PersistentVolume {
        name: "pvc-m2".into(),
        handle: pv.handle.replace("pvc-m1", "pvc-m2"),
        ..pv.clone()
    };
    for v in [&other, &pv] {
        mkdirs(&mut g, k.stage_dirs(v)).await;
        let e = node
            .node_stage_volume(k.node_stage(v, &pc, HashMap::new()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{}: {e:?}", v.handle);
        assert!(
            e.message().contains("carries no serial of this driver's"),
            "{}: {e:?}",
            v.handle
        );
    }
    let mounted = g
        .sh("grep -c globalmount /proc/mounts || true")
        .await
        .unwrap();
    assert_eq!(mounted.trim(), "0", "a stage mounted the disk");
}

/// Under `--go-takeover` a serial-less disk may be staged under any volume
/// id: a volume's LUKS mapping opened on such a disk and mounted at its
/// staging path is not taken for that volume's staging when the volume's
/// own disk (its serial naming it) comes: the stage is refused, nothing
/// grows over the other disk.
#[tokio::test]
async fn a_mapping_on_another_disk_is_not_this_volumes_staging() {
    let Some((mut g, ctl, mut node, held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let sim = held.sim;
    let restarted = restart_hostd(&mut g, "--go-takeover").await;
    assert!(restarted.contains("--go-takeover"), "hostd: {restarted}");
    let k = Kubelet::new("/var/lib/kubelet");
    let class = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    // The volume, attached by this driver (its serial names it).
    let pv = provision(&ctl, &class, &Claim::new("own", "own", 1 << 30)).await;
    let own = attach(&ctl, &pv, WORKER_2).await;
    // Another disk, attached as the Go driver attaches (no serial), with
    // a LUKS volume the same passphrase opens.
    let foreign = provision(&ctl, &class, &Claim::new("foreign", "foreign", 1 << 30)).await;
    let wwn = "0x5056432d49443036";
    let on_foreign = attach_without_serial(&sim, &foreign, 6, wwn).await;
    let made = g
        .sh(&format!(
            "(set -e; dev=/dev/disk/by-id/wwn-{wwn}; \
             n=0; until [ -e $dev ]; do sleep 0.1; n=$((n+1)); [ $n -gt 300 ] && break; done; \
             printf '%s' '{PASSPHRASE}' | cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file=- $dev; \
             printf '%s' '{PASSPHRASE}' | cryptsetup luksOpen $dev made --key-file=-; \
             mkfs.ext4 -q /dev/mapper/made; cryptsetup close made; echo made)"
        ))
        .await
        .unwrap();
    assert!(made.contains("made"), "{made}");

    // Staged under the volume's id on the foreign disk (a node plugin's
    // request), then asked with the volume's own disk.
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    node.node_stage_volume(k.node_stage(&pv, &on_foreign, luks()))
        .await
        .unwrap();
    let e = node
        .node_stage_volume(k.node_stage(&pv, &own, luks()))
        .await
        .unwrap_err();
    assert!(
        e.message().contains("not on this disk"),
        "the volume's stage took the foreign disk's mapping: {e:?}"
    );
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
    assert_eq!(mappings(&mut g).await, 0);
}

/// One volume's costly key derivation holds no other volume's LUKS call:
/// each derivation runs in a process of its own (hostd's `kdf`).
#[tokio::test]
async fn a_slow_key_derivation_holds_no_other_volumes_luks_call() {
    let Some((mut g, ctl, node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let k = Kubelet::new("/var/lib/kubelet");
    let class = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    // A: a header whose key slot takes long to open (pbkdf2, 500,000
    // rounds, within hostd's bounds). B: a new volume, hostd's own cheap
    // header (the guest's hostd runs --luks-pbkdf pbkdf2:1000).
    let slow = provision(&ctl, &class, &Claim::new("slow", "slow", 1 << 30)).await;
    let fast = provision(&ctl, &class, &Claim::new("fast", "fast", 1 << 30)).await;
    let slow_pc = attach(&ctl, &slow, WORKER_2).await;
    let fast_pc = attach(&ctl, &fast, WORKER_2).await;
    let wwn = &slow_pc[CTX_WWN];
    g.sh(&format!(
        "n=0; until [ -e /dev/disk/by-id/wwn-{wwn} ]; do sleep 0.1; n=$((n+1)); [ $n -gt 300 ] && break; done; \
         printf '%s' '{PASSPHRASE}' | cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 \
         --pbkdf-force-iterations 500000 --key-file=- /dev/disk/by-id/wwn-{wwn}"
    ))
    .await
    .unwrap();
    mkdirs(&mut g, k.stage_dirs(&slow)).await;
    mkdirs(&mut g, k.stage_dirs(&fast)).await;
    let mut a = node.clone();
    let slow_req = k.node_stage(&slow, &slow_pc, luks());
    let slow_call = tokio::spawn(async move { a.node_stage_volume(slow_req).await });
    // A's derivation is under way: its child process runs.
    let seen = g
        .sh("n=0; until grep -qs '__luks[-]child' /proc/[0-9]*/cmdline; do sleep 0.05; n=$((n+1)); [ $n -gt 600 ] && break; done; \
             grep -ls '__luks[-]child' /proc/[0-9]*/cmdline | wc -l")
        .await
        .unwrap();
    assert_eq!(seen.trim(), "1", "no key derivation child appeared");
    let mut b = node.clone();
    b.node_stage_volume(k.node_stage(&fast, &fast_pc, luks()))
        .await
        .unwrap();
    assert!(
        !slow_call.is_finished(),
        "the slow derivation ended before the other volume's stage did"
    );
    // The slow header opens, and its plaintext, which hostd did not make,
    // holds no filesystem: refused, never formatted.
    let e = slow_call.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no filesystem signature"), "{e:?}");
}
