//! Thick LVM in a real guest: a new volume gets the extents a removed one
//! left, bytes and all (pvesim keeps them, as Proxmox's LVM plugin does
//! without `saferemove`). Its first stage formats it anyway, plain and
//! with LUKS; once it has held its filesystem, a zeroed header is refused,
//! never formatted. Requests are built by their real senders' builders.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

use callers::PersistentVolume;
use callers::kubelet::{Kubelet, Pod};
use callers::provisioner::{self, Claim, StorageClass};
use e2e::guest::{Guest, Share};
use e2e::lab::{Lab, MINIMAL_ROLE, attach, detach, mkdirs, provision};
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

const WORKER_2: &str = "worker-2/112";
const CLUSTER: &str = "e2eguest1";
const MIB: u64 = 1 << 20;

fn kubelet() -> Kubelet {
    Kubelet::new("/var/lib/kubelet")
}

fn luks() -> HashMap<String, String> {
    HashMap::from([(
        "encryption-passphrase".to_string(),
        "correct horse battery staple".to_string(),
    )])
}

/// The guest's cluster with a thick LVM storage `san` beside local-lvm.
fn with_thick_lvm(cluster: String) -> String {
    let thin = "storages: [{ id: local-lvm, type: lvmthin, total: 107374182400 }]";
    assert!(cluster.contains(thin), "{cluster}");
    cluster.replace(
        thin,
        "storages: [{ id: local-lvm, type: lvmthin, total: 107374182400 }, { id: san, type: lvm, total: 107374182400 }]",
    )
}

/// The file pvesim backs `pv`'s disk with.
fn image_of(images: &Path, pv: &PersistentVolume) -> std::path::PathBuf {
    let disk = pv.handle.rsplit('/').next().unwrap();
    pvesim::qmp::backing_path(images, &format!("san:{disk}"))
}

fn nonzero_in(img: &Path, at: u64, len: u64) -> bool {
    let mut buf = vec![0u8; len as usize];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut buf, at)
        .unwrap();
    buf.iter().any(|b| *b != 0)
}

fn claim_at(img: &Path, at: u64) -> bool {
    let mut buf = [0u8; 16];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut buf, at)
        .unwrap();
    &buf == b"proxmox-csi:cl1\n"
}

/// A volume's whole use: staged, published, written, then taken down
/// and deleted, leaving its extents to the next volume on `san`.
#[allow(clippy::too_many_arguments)]
async fn use_and_delete(
    g: &mut Guest,
    ctl: &ControllerService,
    node: &mut NodeClient<Channel>,
    pv: &PersistentVolume,
    pod: &Pod,
    secrets: HashMap<String, String>,
) {
    let k = kubelet();
    let pc = attach(ctl, pv, WORKER_2).await;
    mkdirs(g, k.stage_dirs(pv)).await;
    node.node_stage_volume(k.node_stage(pv, &pc, secrets))
        .await
        .unwrap();
    mkdirs(g, k.publish_dirs(pod, pv)).await;
    node.node_publish_volume(k.node_publish(pv, pod, &pc))
        .await
        .unwrap();
    let target = k.target_path(pod, pv);
    g.sh(&format!(
        "dd if=/dev/urandom of={target}/old bs=1M count=48 conv=fsync 2>/dev/null; sync"
    ))
    .await
    .unwrap();
    node.node_unpublish_volume(k.node_unpublish(pv, pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(pv)).await.unwrap();
    detach(ctl, pv, WORKER_2).await;
    ctl.delete_volume(Request::new(provisioner::delete_volume(pv)))
        .await
        .unwrap();
}

#[tokio::test]
async fn thick_lvm_disks_with_old_bytes_are_formatted_once_and_never_after_their_header_is_gone() {
    let Some((mut g, ctl, mut node, held)) =
        Lab::start_with(Share::Shared, MINIMAL_ROLE, with_thick_lvm, Some(CLUSTER))
            .await
            .map(Lab::parts)
    else {
        return;
    };
    let images = held.images;
    let k = kubelet();
    let sc = StorageClass::new(&[("storage", "san"), ("csi.storage.k8s.io/fstype", "ext4")]);

    // The first volume on san leaves its ext4 and 48 MiB of noise.
    let first = provision(&ctl, &sc, &Claim::new("first", "first", 1 << 30)).await;
    assert!(
        first.handle.ends_with(&format!(".csf-{CLUSTER}")),
        "{}",
        first.handle
    );
    let pod = Pod::new("0f1e2d3c-4b5a-4697-8a7b-6c5d4e3f2a1b");
    use_and_delete(&mut g, &ctl, &mut node, &first, &pod, HashMap::new()).await;

    for (name, secrets) in [("plain", HashMap::new()), ("luks", luks())] {
        let pv = provision(&ctl, &sc, &Claim::new(name, name, 1 << 30)).await;
        let pc = attach(&ctl, &pv, WORKER_2).await;
        let img = image_of(images.path(), &pv);
        // What the storage handed over: not blank past lvcreate's 4 KiB.
        assert!(
            nonzero_in(&img, 4096, 1000 * MIB),
            "{name}: no old bytes to test with"
        );
        mkdirs(&mut g, k.stage_dirs(&pv)).await;
        node.node_stage_volume(k.node_stage(&pv, &pc, secrets.clone()))
            .await
            .unwrap_or_else(|e| panic!("{name}: the first stage refused: {e:?}"));
        let staged = g
            .sh("grep 'volume staged' /run/node.log | tail -1")
            .await
            .unwrap();
        assert!(
            staged.contains("wiped")
                && staged.contains("mkfs ext4")
                && staged.contains("claimed at byte"),
            "{name}: {staged}"
        );
        assert!(
            claim_at(&img, 1023 * MIB),
            "{name}: no claim at the disk's last MiB"
        );
        mkdirs(&mut g, k.publish_dirs(&pod, &pv)).await;
        node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
            .await
            .unwrap();
        let target = k.target_path(&pod, &pv);
        let listing = g.sh(&format!("ls -A {target}")).await.unwrap();
        assert_eq!(
            listing.trim(),
            "lost+found",
            "{name}: the old volume shows through"
        );
        g.sh(&format!("echo mine > {target}/kept && sync"))
            .await
            .unwrap();
        node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
            .await
            .unwrap();
        node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();

        // Its header zeroed in the guest: refused, the bytes kept.
        g.sh(&format!(
            "dd if=/dev/zero of=/dev/disk/by-id/wwn-{} bs=1M count=20 oflag=direct conv=fsync 2>/dev/null",
            pc["wwn"]
        ))
        .await
        .unwrap();
        let e = node
            .node_stage_volume(k.node_stage(&pv, &pc, secrets.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{name}: {e:?}");
        assert!(
            e.message().contains("claim at byte") && e.message().contains("never formatted again"),
            "{name}: {}",
            e.message()
        );
        assert!(claim_at(&img, 1023 * MIB), "{name}: the claim is gone");
        assert!(
            nonzero_in(&img, 20 * MIB, 1000 * MIB),
            "{name}: data beyond the header is gone"
        );
        detach(&ctl, &pv, WORKER_2).await;
        ctl.delete_volume(Request::new(provisioner::delete_volume(&pv)))
            .await
            .unwrap();
    }
}
