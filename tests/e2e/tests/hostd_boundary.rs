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
use e2e::lab::{Lab, MINIMAL_ROLE, attach, mkdirs, provision};
use proxmox_csi_common::contract::CTX_WWN;
use tonic::Code;

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

#[tokio::test]
async fn an_existing_luks_volume_without_a_filesystem_is_never_formatted() {
    let Some(Lab {
        mut g,
        ctl,
        mut node,
        sim: _sim,
        images: _images,
    }) = Lab::start(Share::Shared, MINIMAL_ROLE).await
    else {
        return;
    };
    let k = Kubelet::new("/var/lib/kubelet");
    // A raw block volume of a LUKS class, written by its pod: a database's
    // bytes, no filesystem.
    let pv = provision(
        &ctl,
        &block_class(),
        &Claim::new("db", "db", 1 << 30).block(),
    )
    .await;
    let pc = attach(&ctl, &pv, WORKER_2).await;
    let pod = Pod::new("5b7c0e1a-0000-4000-8000-00000000db01");
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    node.node_stage_volume(k.node_stage(&pv, &pc, luks()))
        .await
        .unwrap();
    mkdirs(&mut g, k.publish_dirs(&pod, &pv)).await;
    node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
        .await
        .unwrap();
    let target = k.target_path(&pod, &pv);
    g.sh(&format!(
        "dd if=/dev/urandom of={target} bs=1M count=8 conv=fsync 2>/dev/null"
    ))
    .await
    .unwrap();
    let written = block_sum(&mut g, &target).await;
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
    let Some(Lab {
        mut g,
        ctl,
        mut node,
        sim: _sim,
        images: _images,
    }) = Lab::start(Share::Shared, MINIMAL_ROLE).await
    else {
        return;
    };
    let k = Kubelet::new("/var/lib/kubelet");
    let pv = provision(
        &ctl,
        &block_class(),
        &Claim::new("blk", "blk", 1 << 30).block(),
    )
    .await;
    let pc = attach(&ctl, &pv, WORKER_2).await;
    let pod = Pod::new("5b7c0e1a-0000-4000-8000-00000000b10c");
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    node.node_stage_volume(k.node_stage(&pv, &pc, luks()))
        .await
        .unwrap();
    mkdirs(&mut g, k.publish_dirs(&pod, &pv)).await;
    node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
        .await
        .unwrap();
    let target = k.target_path(&pod, &pv);
    g.sh(&format!(
        "dd if=/dev/urandom of={target} bs=1M count=8 conv=fsync 2>/dev/null"
    ))
    .await
    .unwrap();
    let written = block_sum(&mut g, &target).await;
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
    let Some(Lab {
        mut g,
        ctl,
        mut node,
        sim: _sim,
        images: _images,
    }) = Lab::start(Share::Shared, MINIMAL_ROLE).await
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
        e.message()
            .contains("key slot 0 costs pbkdf2 with 1000 iterations (at most 999)"),
        "{e:?}"
    );
    assert_eq!(
        mappings(&mut g).await,
        0,
        "a key was derived and the mapping opened"
    );
}
