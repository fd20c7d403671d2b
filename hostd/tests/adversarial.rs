//! hostd attacked by the caller it lets in: every request here comes from
//! the node plugin's uid (allowed by `--allow-uid`), and each attack must be
//! refused with nothing touched. Real loop devices, mkfs and mounts (needs
//! root; CI is root).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod support;

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proxmox_csi_proto::hostd::v1 as pb;
use support::*;
use tonic::Code;

fn publish_req(vol: &str, staging: &Path, target: &Path) -> pb::PublishRequest {
    pb::PublishRequest {
        volume_id: vol.into(),
        staging_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        read_only: false,
        block: false,
        mount_flags: vec![],
        single_writer: false,
        device: None,
    }
}

fn unpublish_req(vol: &str, target: &Path) -> pb::UnpublishRequest {
    pb::UnpublishRequest {
        volume_id: vol.into(),
        target_path: target.display().to_string(),
    }
}

fn unstage_req(vol: &str, staging: &Path) -> pb::UnstageRequest {
    pb::UnstageRequest {
        volume_id: vol.into(),
        staging_path: staging.display().to_string(),
    }
}

/// Every mount point under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect()
}

/// Swaps `path` between an empty directory and a symlink to `to`, as fast
/// as it can, until told to stop.
fn swap_with_symlink(
    path: PathBuf,
    to: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut swaps = 0;
        while !stop.load(Ordering::Relaxed) {
            let _ = std::fs::remove_dir(&path).or_else(|_| std::fs::remove_file(&path));
            let _ = std::os::unix::fs::symlink(&to, &path);
            std::thread::yield_now();
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::create_dir(&path);
            swaps += 1;
        }
        swaps
    })
}

const RACE_ROUNDS: usize = 300;

#[tokio::test]
async fn symlink_races_against_publish_and_unpublish_never_escape() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.disk(1);
    let staging = env.staging("vol-a");
    node.stage(stage_req("vol-a", &wwn, &staging, "ext4"))
        .await
        .unwrap();
    std::fs::write(staging.join("pod-data"), b"the volume's own file").unwrap();

    // Outside kubelet's tree: what an escape would mount over or delete.
    let victim = tempfile::tempdir().unwrap();
    std::fs::write(victim.path().join("precious"), b"host file").unwrap();
    let pv_dir = env.target("pod1", "volumes", "pv-a");
    let target = pv_dir.join("mount");

    // Publish while `mount` flips between a directory and a symlink out.
    let stop = Arc::new(AtomicBool::new(false));
    let racer = swap_with_symlink(target.clone(), victim.path().to_path_buf(), stop.clone());
    let (mut published, mut refused) = (0, 0);
    for _ in 0..RACE_ROUNDS {
        match node.publish(publish_req("vol-a", &staging, &target)).await {
            Ok(_) => {
                published += 1;
                // Under the race, Unpublish may be refused too (a symlink
                // where the directory was); the next round tries again.
                let _ = node.unpublish(unpublish_req("vol-a", &target)).await;
            }
            Err(_) => refused += 1,
        }
        assert!(
            mounts_under(victim.path()).is_empty(),
            "a mount escaped onto {}",
            victim.path().display()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    let _ = std::fs::remove_file(&target);
    node.unpublish(unpublish_req("vol-a", &target))
        .await
        .unwrap();
    assert!(
        mounts_under(&pv_dir).is_empty(),
        "a publication was left behind"
    );
    println!(
        "publish race: {RACE_ROUNDS} rounds, {swaps} swaps, {published} published, {refused} refused, 0 escapes"
    );
    assert!(
        refused > 0,
        "the race never met a symlink: the attack did not run"
    );

    // Unpublish while `mount` flips between a directory and a symlink to a host file.
    let stop = Arc::new(AtomicBool::new(false));
    let racer = swap_with_symlink(target.clone(), victim.path().join("precious"), stop.clone());
    for _ in 0..RACE_ROUNDS {
        let _ = node.unpublish(unpublish_req("vol-a", &target)).await;
    }
    stop.store(true, Ordering::Relaxed);
    racer.join().unwrap();
    assert_eq!(
        std::fs::read(victim.path().join("precious")).unwrap(),
        b"host file"
    );
    assert!(mounts_under(victim.path()).is_empty());
    assert!(victim.path().is_dir());

    // A target inside a mounted volume (which a pod writes) is no target.
    std::fs::create_dir_all(staging.join("d")).unwrap();
    let inside = pv_dir.join("mount/d");
    let e = node
        .publish(publish_req("vol-a", &staging, &inside))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(
        std::fs::read(staging.join("pod-data")).unwrap(),
        b"the volume's own file"
    );
}

#[tokio::test]
async fn foreign_paths_and_other_volumes_are_not_this_volumes() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let root = env.root.clone();
    let wwn = env.disk(2);
    let staging_a = env.staging("vol-a");
    node.stage(stage_req("vol-a", &wwn, &staging_a, "ext4"))
        .await
        .unwrap();
    let target_a = env.target("pod-a", "volumes", "pv-a").join("mount");
    node.publish(publish_req("vol-a", &staging_a, &target_a))
        .await
        .unwrap();

    // Mounted things that are not this driver's: another driver's staging
    // directory, a pod's secret volume. Each holds a secret.
    let mut foreign = Vec::new();
    for dir in [
        "plugins/kubernetes.io/csi/other.driver/0d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa/globalmount",
        "pods/pod-z/volumes/kubernetes.io~secret/token",
        "pods/pod-z/volumes/kubernetes.io~csi/pv-z/mount",
    ] {
        let p = root.join(dir);
        std::fs::create_dir_all(&p).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &p,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        std::fs::write(p.join("secret"), b"not yours").unwrap();
        foreign.push(p);
    }
    let target = env.target("pod-b", "volumes", "pv-b").join("mount");
    for source in &foreign {
        let e = node
            .publish(publish_req("vol-b", source, &target))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::InvalidArgument,
            "{}: {e:?}",
            source.display()
        );
        assert!(
            !target.join("secret").exists(),
            "{} reached the target",
            source.display()
        );
    }
    // Another volume's id on this volume's staging path and target.
    let e = node
        .publish(publish_req("vol-b", &staging_a, &target))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("is not volume vol-b's"),
        "{}",
        e.message()
    );
    assert!(mounts_under(&target).is_empty());
    let e = node
        .unpublish(unpublish_req("vol-b", &target_a))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = node
        .unstage(unstage_req("vol-b", &staging_a))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Stage of another volume onto the staging path vol-a holds.
    let wwn_b = env.disk(3);
    let e = node
        .stage(stage_req("vol-b", &wwn_b, &staging_a, "ext4"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Unstage and Unpublish of the other drivers' and pods' mounts.
    for p in &foreign {
        let e = node.unstage(unstage_req("vol-a", p)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{}: {e:?}", p.display());
    }
    let e = node
        .unpublish(unpublish_req("vol-a", &foreign[2]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // A serial that is not the volume's own.
    let mut req = stage_req("vol-b", &wwn_b, &env.staging("vol-b"), "ext4");
    req.device.as_mut().unwrap().serial = "csi-0123456789abcdef".into();
    let e = node.stage(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // A process of another uid that can open the socket is refused outright.
    let mut stranger = connect_as(&env._dir.path().join("hostd.sock"), 12345).await;
    let e = stranger
        .unstage(unstage_req("vol-a", &staging_a))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // Nothing was touched: vol-a still staged and published, every secret there.
    assert_eq!(mount_at(&staging_a).as_deref(), Some("ext4"));
    assert_eq!(mount_at(&target_a).as_deref(), Some("ext4"));
    for p in &foreign {
        assert_eq!(
            std::fs::read(p.join("secret")).unwrap(),
            b"not yours",
            "{}",
            p.display()
        );
        nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    // The image of vol-b was never formatted.
    assert_eq!(std::fs::metadata(env.image(&wwn_b)).unwrap().blocks(), 0);
}

#[tokio::test]
async fn mount_options_that_open_devices_or_panic_never_reach_the_kernel() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let (wwn, other) = (env.disk(4), env.disk(5));
    let other_dev = env.loops.last().unwrap().dev.clone();
    for (fs, flag) in [
        ("xfs", format!("logdev={}", other_dev.display())),
        ("xfs", "rtdev=/dev/sda".into()),
        ("ext4", "errors=panic".into()),
        ("ext4", "noatime,journal_path=/dev/sda".into()),
    ] {
        let staging = env.staging(&format!("vol-{fs}"));
        let mut req = stage_req(&format!("vol-{fs}"), &wwn, &staging, fs);
        if let Some(pb::stage_request::Access::Filesystem(f)) = req.access.as_mut() {
            f.mount_flags = vec![flag.clone()];
        }
        let e = node.stage(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{flag}: {e:?}");
        assert!(e.message().contains("is refused"), "{}", e.message());
        assert_eq!(mount_at(&staging), None);
    }
    // Refused before anything was written to either disk.
    for w in [&wwn, &other] {
        assert_eq!(std::fs::metadata(env.image(w)).unwrap().blocks(), 0);
    }
}

#[tokio::test]
async fn a_users_device_file_or_directory_survives_unstage_and_restage() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.disk(6);
    let staging = env.staging("vol-dev");
    let req = stage_req("vol-dev", &wwn, &staging, "ext4");
    for kind in ["file", "directory"] {
        node.stage(req.clone()).await.unwrap();
        let _ = std::fs::remove_file(staging.join("device"))
            .or_else(|_| std::fs::remove_dir_all(staging.join("device")));
        if kind == "file" {
            std::fs::write(staging.join("device"), b"a user's file called device").unwrap();
        } else {
            std::fs::create_dir(staging.join("device")).unwrap();
            std::fs::write(staging.join("device/inside"), b"kept").unwrap();
        }
        node.unstage(unstage_req("vol-dev", &staging))
            .await
            .unwrap();
        assert_eq!(mount_at(&staging), None, "{kind}: unstage left the mount");
        node.stage(req.clone()).await.unwrap();
        if kind == "file" {
            assert_eq!(
                std::fs::read(staging.join("device")).unwrap(),
                b"a user's file called device"
            );
        } else {
            assert_eq!(
                std::fs::read(staging.join("device/inside")).unwrap(),
                b"kept"
            );
        }
        node.unstage(unstage_req("vol-dev", &staging))
            .await
            .unwrap();
    }
}

/// The ext4 superblock's checksum (`s_checksum`, the last 4 bytes of the
/// 1 KiB superblock at byte 1024) broken: still someone's filesystem.
fn break_ext4_checksum(img: &Path) {
    let mut f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.seek(SeekFrom::Start(1024 + 0x3FC)).unwrap();
    f.write_all(&[0xde, 0xad, 0xbe, 0xef]).unwrap();
}

#[tokio::test]
async fn data_without_a_clean_signature_is_never_formatted_and_nothing_is_discarded() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;

    let wwn = env.disk(7);
    let img = env.image(&wwn);
    run("mkfs.ext4", &["-q", "-F"], &img);
    break_ext4_checksum(&img);
    let before = std::fs::read(&img).unwrap();
    // Asked for xfs: it holds ext4. Asked for ext4: the kernel refuses to
    // mount it. Either way nothing formats it.
    let e = node
        .stage(stage_req("vol-csum", &wwn, &env.staging("vol-csum"), "xfs"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("a ext4 signature"), "{}", e.message());
    let e = node
        .stage(stage_req(
            "vol-csum",
            &wwn,
            &env.staging("vol-csum"),
            "ext4",
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("mounting"), "{e:?}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "bad-checksum ext4 was written to"
    );

    // No signature in the first MiB, data at 40 MiB.
    let wwn = env.disk(8);
    let img = env.image(&wwn);
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.seek(SeekFrom::Start(40 << 20)).unwrap();
        f.write_all(b"a database written to the raw disk").unwrap();
    }
    let before = std::fs::read(&img).unwrap();
    let e = node
        .stage(stage_req("vol-raw", &wwn, &env.staging("vol-raw"), "ext4"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("data at byte 41943040"),
        "{}",
        e.message()
    );
    assert!(
        std::fs::read(&img).unwrap() == before,
        "the disk was written to"
    );

    // A blank but allocated disk keeps its blocks through mkfs: a discard
    // would punch them out of the loop device's backing file.
    for (i, fs) in ["ext4", "xfs"].into_iter().enumerate() {
        let wwn = env.image_only(20 + i as u32);
        let img = env.image(&wwn);
        let st = std::process::Command::new("fallocate")
            .args(["-l", &(320u64 << 20).to_string()])
            .arg(&img)
            .status()
            .unwrap();
        assert!(st.success());
        env.attach(&wwn);
        let allocated = std::fs::metadata(&img).unwrap().blocks();
        let vol = format!("vol-alloc-{fs}");
        let r = node
            .stage(stage_req(&vol, &wwn, &env.staging(&vol), fs))
            .await
            .unwrap()
            .into_inner();
        assert!(
            r.actions.iter().any(|a| a.starts_with("mkfs")),
            "{:?}",
            r.actions
        );
        let after = std::fs::metadata(&img).unwrap().blocks();
        assert!(
            after >= allocated,
            "{fs}: {allocated} blocks before mkfs, {after} after: blocks were discarded"
        );
    }
}

/// Six LUKS stages with the default argon2id at once: the key derivation
/// (about 2 s and up to 1 GiB each, serialised by libcryptsetup) runs off
/// hostd's async workers, so Health and a plain stage answer meanwhile.
/// This host has no device-mapper: each stage formats, then fails to open;
/// the formats are the load. The guest benchmark measures the whole stage.
#[tokio::test]
async fn health_and_plain_stages_answer_during_six_argon2id_stages() {
    testkit::require_root!();
    let mut env = Env::start_with_pbkdf("argon2id").await;
    let node = env.node_plugin().await;
    let mut stages = Vec::new();
    for i in 0..6 {
        let wwn = env.disk(30 + i);
        let vol = format!("vol-luks-{i}");
        let mut req = stage_req(&vol, &wwn, &env.staging(&vol), "ext4");
        req.encryption = Some(pb::Encryption {
            passphrase: b"a passphrase".to_vec(),
        });
        let mut c = node.clone();
        stages.push(tokio::spawn(async move { c.stage(req).await }));
    }
    let plain_wwn = env.disk(40);
    let plain = stage_req("vol-plain", &plain_wwn, &env.staging("vol-plain"), "ext4");
    let mut c = node.clone();
    let plain = tokio::spawn(async move { c.stage(plain).await });

    let mut health = node.clone();
    let (mut latencies, mut plain_done_first) = (Vec::new(), false);
    while !stages.iter().all(|s| s.is_finished()) {
        let t = Instant::now();
        health.health(pb::HealthRequest {}).await.unwrap();
        latencies.push(t.elapsed());
        if plain.is_finished() && !stages.iter().all(|s| s.is_finished()) {
            plain_done_first = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let formatted = futures::future::join_all(stages)
        .await
        .into_iter()
        .filter(|r| {
            // Formatted, then refused at open: no device-mapper on this host.
            r.as_ref().is_ok_and(|r| {
                r.as_ref().err().is_some_and(|e| {
                    e.message().contains("dm-crypt") || e.message().contains("activating")
                })
            }) || r.as_ref().is_ok_and(|r| r.is_ok())
        });
    assert_eq!(formatted.count(), 6);
    plain.await.unwrap().unwrap();
    latencies.sort();
    let at = |q: usize| latencies[(latencies.len() - 1) * q / 100];
    println!(
        "Health during six argon2id stages: {} answers, p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        at(50),
        at(99),
        at(100)
    );
    assert!(
        latencies.len() >= 6,
        "Health answered {} times while six argon2id stages ran",
        latencies.len()
    );
    assert!(plain_done_first, "a plain stage waited for the LUKS stages");
}

/// A block publish request of `vol` from its staging directory to `target`.
fn block_publish_req(vol: &str, staging: &Path, target: &Path) -> pb::PublishRequest {
    pb::PublishRequest {
        block: true,
        ..publish_req(vol, staging, target)
    }
}

fn block_stage_req(vol: &str, wwn: &str, staging: &Path) -> pb::StageRequest {
    pb::StageRequest {
        access: Some(pb::stage_request::Access::Block(pb::RawBlock {})),
        ..stage_req(vol, wwn, staging, "")
    }
}

#[tokio::test]
async fn publish_onto_a_target_kubelet_gave_another_volume_or_driver_is_refused() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.disk(20);
    let staging = env.staging("vol-a");
    node.stage(stage_req("vol-a", &wwn, &staging, "ext4"))
        .await
        .unwrap();
    std::fs::write(staging.join("a-file"), b"volume a").unwrap();
    // Pod b's target, which kubelet recorded as volume b's; and a target of
    // another CSI driver (secrets-store) in pod c.
    let pv_b = env.target("pod-b", "volumes", "pv-b");
    write_vol_data(&pv_b, "pv-b", "vol-b", DRIVER);
    let pv_c = env.target("pod-c", "volumes", "pv-c");
    write_vol_data(&pv_c, "pv-c", "vol-a", "secrets-store.csi.k8s.io");
    for target in [pv_b.join("mount"), pv_c.join("mount")] {
        let e = node
            .publish(publish_req("vol-a", &staging, &target))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("is not volume vol-a's"), "{e:?}");
        assert!(mounts_under(&target).is_empty(), "{}", target.display());
        assert!(!target.exists(), "{} was made", target.display());
    }
    // The volume's own target, as kubelet recorded it, and a target with no
    // record at all (a bare directory, as a conformance suite makes).
    let pv_a = env.target("pod-a", "volumes", "pv-a");
    write_vol_data(&pv_a, "pv-a", "vol-a", DRIVER);
    let bare = env.target("pod-d", "volumes", "pv-a");
    for target in [pv_a.join("mount"), bare.join("mount")] {
        node.publish(publish_req("vol-a", &staging, &target))
            .await
            .unwrap();
        assert_eq!(std::fs::read(target.join("a-file")).unwrap(), b"volume a");
    }
    // Raw block: a block target whose volume kubelet recorded as another's.
    let wwn_blk = env.disk(21);
    let blk_staging = env.block_staging("pv-blk");
    write_vol_data(
        &env.root
            .join("plugins/kubernetes.io/csi/volumeDevices/pv-blk/data"),
        "pv-blk",
        "vol-blk",
        DRIVER,
    );
    node.stage(block_stage_req("vol-blk", &wwn_blk, &blk_staging))
        .await
        .unwrap();
    let other_pv = env.block_target("pv-other", "pod-e");
    write_vol_data(
        &env.root
            .join("plugins/kubernetes.io/csi/volumeDevices/pv-other/data"),
        "pv-other",
        "vol-other",
        DRIVER,
    );
    let e = node
        .publish(block_publish_req("vol-blk", &blk_staging, &other_pv))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!other_pv.exists());
}

#[tokio::test]
async fn unstage_while_published_is_refused_and_keeps_the_pods_device() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    // Raw block: the pod's bound device node must stay the volume's.
    let wwn = env.disk(22);
    let staging = env.block_staging("pv-blk");
    node.stage(block_stage_req("vol-blk", &wwn, &staging))
        .await
        .unwrap();
    let target = env.block_target("pv-blk", "pod-a");
    node.publish(block_publish_req("vol-blk", &staging, &target))
        .await
        .unwrap();
    let e = node
        .unstage(unstage_req("vol-blk", &staging))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("still published at") && e.message().contains("pod-a"),
        "{e:?}"
    );
    assert!(
        mount_at(&staging.join("device")).is_some(),
        "the staging bind went"
    );
    assert!(mount_at(&target).is_some(), "the pod's bind went");
    // A filesystem volume: the pod's bind of the staged filesystem.
    let wwn_fs = env.disk(23);
    let staging_fs = env.staging("vol-fs");
    node.stage(stage_req("vol-fs", &wwn_fs, &staging_fs, "ext4"))
        .await
        .unwrap();
    let target_fs = env.target("pod-b", "volumes", "pv-fs").join("mount");
    node.publish(publish_req("vol-fs", &staging_fs, &target_fs))
        .await
        .unwrap();
    let e = node
        .unstage(unstage_req("vol-fs", &staging_fs))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(mount_at(&staging_fs).as_deref(), Some("ext4"));
    // Unpublished first, both unstage.
    node.unpublish(unpublish_req("vol-blk", &target))
        .await
        .unwrap();
    node.unstage(unstage_req("vol-blk", &staging))
        .await
        .unwrap();
    node.unpublish(unpublish_req("vol-fs", &target_fs))
        .await
        .unwrap();
    node.unstage(unstage_req("vol-fs", &staging_fs))
        .await
        .unwrap();
    assert!(mount_at(&staging.join("device")).is_none() && mount_at(&staging_fs).is_none());
}

#[tokio::test]
async fn unpublish_never_removes_kubelets_volume_record_or_what_publish_did_not_make() {
    testkit::require_root!();
    let env = Env::start().await;
    let mut node = env.node_plugin().await;
    // Another driver's volume record, named as a target.
    let pv = env.target("pod-a", "volumes", "pv-x");
    write_vol_data(&pv, "pv-x", "vol-x", "other.driver");
    let record = pv.join("vol_data.json");
    let e = node
        .unpublish(unpublish_req("vol-x", &record))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(record.exists(), "kubelet's record was removed");
    // A file where a filesystem target is a directory, and a directory
    // where a block target is a file: neither is removed.
    let pv_y = env.target("pod-a", "volumes", "pv-y");
    std::fs::write(pv_y.join("mount"), b"a file").unwrap();
    let e = node
        .unpublish(unpublish_req("vol-y", &pv_y.join("mount")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(pv_y.join("mount").is_file());
    let blk = env.block_target("pv-z", "pod-a");
    std::fs::create_dir(&blk).unwrap();
    std::fs::write(blk.join("keep"), b"kept").unwrap();
    let e = node
        .unpublish(unpublish_req("vol-z", &blk))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(blk.join("keep").exists());
}

#[tokio::test]
async fn a_disk_mounted_in_another_mount_namespace_is_not_staged() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.disk(24);
    let dev = env.loops.last().unwrap().dev.clone();
    run("mkfs.ext4", &["-q", "-F"], &dev);
    // Mounted where hostd's mount table does not show it: a private mount
    // namespace of a process that holds it until killed.
    let mnt = tempfile::tempdir().unwrap();
    let mut holder = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount {} {} && echo mounted && exec sleep 600",
            dev.display(),
            mnt.path().display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "mounted");
    assert!(
        mounts_under(mnt.path()).is_empty(),
        "the mount is visible here"
    );
    let staging = env.staging("vol-ns");
    let e = node
        .stage(stage_req("vol-ns", &wwn, &staging, "ext4"))
        .await
        .unwrap_err();
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("open it exclusively"), "{e:?}");
    assert!(mount_at(&staging).is_none());
}

#[tokio::test]
async fn a_cancelled_stage_keeps_its_volume_locked_until_its_work_ends() {
    testkit::require_root!();
    let mut env = Env::start().await;
    // An mkfs that takes 3 s, and counts its runs.
    let counted = tempfile::tempdir().unwrap();
    let runs = counted.path().join("runs");
    let _tools = env
        .restart_hostd_with_mkfs_ext4(|real| {
            format!(
                "#!/bin/sh\necho run >> {}\nsleep 3\nexec {real} \"$@\"\n",
                runs.display()
            )
        })
        .await;
    let mut node = env.node_plugin().await;
    let wwn = env.disk(25);
    let staging = env.staging("vol-slow");
    // The caller gives up after 1 s, while mkfs runs.
    let cancelled = tokio::time::timeout(
        Duration::from_secs(1),
        node.stage(stage_req("vol-slow", &wwn, &staging, "ext4")),
    )
    .await;
    assert!(cancelled.is_err(), "the stage answered within 1 s");
    // Unstage of the same volume waits for the stage's work, then undoes it.
    let mut again = env.node_plugin().await;
    again
        .unstage(unstage_req("vol-slow", &staging))
        .await
        .unwrap();
    let log = std::fs::read_to_string(&env.log).unwrap();
    let stage_line = log
        .lines()
        .position(|l| l.contains("call=\"Stage\"") && l.contains("vol-slow"));
    let unstage_line = log
        .lines()
        .position(|l| l.contains("call=\"Unstage\"") && l.contains("vol-slow"));
    assert!(
        matches!((stage_line, unstage_line), (Some(s), Some(u)) if s < u),
        "the stage's audit line is missing or comes after the unstage's:\n{log}"
    );
    assert!(
        mount_at(&staging).is_none(),
        "the stage mounted after the unstage"
    );
    // A stage again while nothing else runs: one more mkfs? No: the disk now
    // holds the filesystem the first made.
    node.stage(stage_req("vol-slow", &wwn, &staging, "ext4"))
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 1);
}

#[tokio::test]
async fn a_luks_header_costlier_than_the_bounds_is_refused_before_any_derivation() {
    testkit::require_root!();
    // Bounds below the header's pbkdf2 cost of 1000 iterations.
    let mut env =
        Env::start_with_args("pbkdf2:1000", &["--luks-kdf-bounds", "1048576:4:64:999"]).await;
    let mut node = env.node_plugin().await;
    let wwn = env.image_only(26);
    luks(&env.image(&wwn));
    env.attach(&wwn);
    let staging = env.staging("vol-kdf");
    let mut req = stage_req("vol-kdf", &wwn, &staging, "ext4");
    req.encryption = Some(pb::Encryption {
        passphrase: b"passphrase".to_vec(),
    });
    let e = node.stage(req).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("cost pbkdf2 with")
            && e.message().contains("iterations in all (at most 999)"),
        "{e:?}"
    );
}

#[tokio::test]
async fn stats_and_stage_refuse_paths_kubelet_gives_another_volume() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.disk(27);
    let staging = env.staging("vol-a");
    node.stage(stage_req("vol-a", &wwn, &staging, "ext4"))
        .await
        .unwrap();
    // Another driver's mounted target, and a mounted target without
    // kubelet's record: nothing ties either to vol-a.
    let pv = env.target("pod-z", "volumes", "pv-z");
    write_vol_data(&pv, "pv-z", "vol-z", "other.driver");
    let bare = env.target("pod-y", "volumes", "pv-y");
    for mount in [pv.join("mount"), bare.join("mount")] {
        std::fs::create_dir(&mount).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &mount,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        let e = node
            .stats(pb::StatsRequest {
                volume_id: "vol-a".into(),
                volume_path: mount.display().to_string(),
            })
            .await
            .unwrap_err();
        nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert_eq!(
            e.code(),
            Code::FailedPrecondition,
            "{}: {e:?}",
            mount.display()
        );
    }
    // Stage of vol-b at the staging directory kubelet names for vol-c: it
    // would block vol-c's own stage.
    let wwn_b = env.disk(28);
    let e = node
        .stage(stage_req("vol-b", &wwn_b, &env.staging("vol-c"), "ext4"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("SHA-256"), "{e:?}");
    assert_eq!(std::fs::metadata(env.image(&wwn_b)).unwrap().blocks(), 0);
}

#[tokio::test]
async fn an_unfinished_xfs_hostd_did_not_begin_is_never_formatted_nor_read_only() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.image_only(30);
    let img = env.image(&wwn);
    run("mkfs.xfs", &["-q", "-f"], &img);
    {
        // sb_inprogress set by hand, data behind it.
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[1], 126).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"precious", 150 << 20).unwrap();
    }
    env.attach(&wwn);
    let before = sha_of(&img);
    let staging = env.staging("vol-unf");
    for read_only in [true, false] {
        let mut req = stage_req("vol-unf", &wwn, &staging, "xfs");
        req.read_only = read_only;
        let e = node.stage(req).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert_eq!(sha_of(&img), before, "read_only {read_only}");
    }
    let mut f = std::fs::File::open(&img).unwrap();
    let mut marker = [0u8; 8];
    f.seek(SeekFrom::Start(150 << 20)).unwrap();
    std::io::Read::read_exact(&mut f, &mut marker).unwrap();
    assert_eq!(&marker, b"precious");
}

#[tokio::test]
async fn luks_format_reads_the_whole_header_area_first() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    // Data between two of the samples, inside the 16 MiB luksFormat writes.
    let wwn = env.image_only(31);
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(env.image(&wwn))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"database page", (1 << 20) + (128 << 10))
            .unwrap();
    }
    env.attach(&wwn);
    let before = sha_of(&env.image(&wwn));
    let staging = env.block_staging("pv-hdr");
    let mut req = block_stage_req("vol-hdr", &wwn, &staging);
    req.encryption = Some(pb::Encryption {
        passphrase: b"passphrase".to_vec(),
    });
    let e = node.stage(req).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("data at byte 1179648"), "{e:?}");
    assert_eq!(sha_of(&env.image(&wwn)), before);
}

#[tokio::test]
async fn a_luks_header_without_key_slots_is_not_remade_unless_hostd_began_it() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.image_only(32);
    let img = env.image(&wwn);
    luks(&img);
    let kill = std::process::Command::new("cryptsetup")
        .args(["luksKillSlot", "--batch-mode", "-q"])
        .arg(&img)
        .arg("0")
        .output()
        .unwrap();
    assert!(
        kill.status.success(),
        "{}",
        String::from_utf8_lossy(&kill.stderr)
    );
    env.attach(&wwn);
    let header = sha_of(&img);
    let staging = env.block_staging("pv-noslot");
    for read_only in [true, false] {
        let mut req = block_stage_req("vol-noslot", &wwn, &staging);
        req.read_only = read_only;
        req.encryption = Some(pb::Encryption {
            passphrase: b"another".to_vec(),
        });
        let e = node.stage(req).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert_eq!(sha_of(&img), header, "read_only {read_only}");
    }
}

#[tokio::test]
async fn stages_waiting_for_their_disks_hold_no_call_slot() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    let wwn = env.disk(33);
    let staging = env.staging("vol-live");
    node.stage(stage_req("vol-live", &wwn, &staging, "ext4"))
        .await
        .unwrap();
    // More Stages than there are call slots, each for a disk that never
    // comes (hostd waits --device-wait, 5 s here, for each).
    let mut waiting = Vec::new();
    for i in 0..80 {
        let mut c = env.node_plugin().await;
        let vol = format!("vol-wait-{i}");
        let req = stage_req(
            &vol,
            &format!("5000c500dead{i:04x}"),
            &env.staging(&vol),
            "ext4",
        );
        waiting.push(tokio::spawn(async move { c.stage(req).await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another volume's calls are served meanwhile.
    let stats = node
        .stats(pb::StatsRequest {
            volume_id: "vol-live".into(),
            volume_path: staging.display().to_string(),
        })
        .await
        .unwrap();
    assert!(stats.get_ref().total_bytes > 0);
    let still = waiting.iter().filter(|w| !w.is_finished()).count();
    assert_eq!(
        still, 80,
        "Stats answered only after some waiting stage ended"
    );
    for w in waiting {
        let e = w.await.unwrap().unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    }
}

#[tokio::test]
async fn an_encrypted_class_never_stages_a_disk_of_plain_data_unencrypted_unasked() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let mut node = env.node_plugin().await;
    // A raw block volume of an encrypted class whose disk holds plain data
    // and no LUKS header (what the Go driver left): without --go-takeover it
    // is refused, not staged unencrypted.
    let wwn = env.image_only(34);
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(env.image(&wwn))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"plain rows", 0).unwrap();
    }
    env.attach(&wwn);
    let staging = env.block_staging("pv-plain");
    let mut req = block_stage_req("vol-plain-blk", &wwn, &staging);
    req.encryption = Some(pb::Encryption {
        passphrase: b"passphrase".to_vec(),
    });
    let e = node.stage(req).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("--go-takeover"), "{e:?}");
    assert!(mount_at(&staging.join("device")).is_none());
}

#[tokio::test]
async fn luks_costs_count_every_key_slot_a_wrong_passphrase_is_tried_on() {
    testkit::require_root!();
    // Each slot within a bound of 3,500 pbkdf2 rounds, four slots and the
    // digest together far above it.
    let mut env =
        Env::start_with_args("pbkdf2:1000", &["--luks-kdf-bounds", "1048576:4:64:3500"]).await;
    let mut node = env.node_plugin().await;
    let wwn = env.image_only(35);
    let img = env.image(&wwn);
    luks(&img);
    let keys = tempfile::tempdir().unwrap();
    let old = keys.path().join("old");
    std::fs::write(&old, b"passphrase").unwrap();
    for i in 0..3 {
        let new = keys.path().join(format!("new{i}"));
        std::fs::write(&new, format!("another {i}")).unwrap();
        let out = std::process::Command::new("cryptsetup")
            .args([
                "luksAddKey",
                "--batch-mode",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
            ])
            .arg(&old)
            .arg(&img)
            .arg(&new)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    env.attach(&wwn);
    let staging = env.staging("vol-slots");
    let mut req = stage_req("vol-slots", &wwn, &staging, "ext4");
    req.encryption = Some(pb::Encryption {
        passphrase: b"wrong".to_vec(),
    });
    let e = node.stage(req).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("(at most 3500)"), "{e:?}");
}
