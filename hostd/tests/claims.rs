//! Claims on real loop devices: a volume created blank for a filesystem is
//! formatted on its first stage whatever its storage left in it, and never
//! again once it has held its filesystem (needs root; CI is root).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod support;

use std::os::unix::fs::FileExt;
use std::path::Path;

use proxmox_csi_proto::hostd::v1 as pb;
use support::*;
use tonic::Code;

const MIB: u64 = 1 << 20;
/// What the controller names a volume it created blank for a filesystem.
const MARKED: &str = "r/pve1/local-lvm/vm-9999-pvc-a.csf-5bc58ec71c2d";
const MAGIC: &[u8] = b"proxmox-csi:cl1\n";

/// What a removed volume leaves in reused thick-LVM extents: its ext4 and
/// noise everywhere else, less the first 4 KiB lvcreate zeroes (and with
/// them the ext4 signature).
fn leave_old_bytes(img: &Path) {
    let len = std::fs::metadata(img).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    let noise: Vec<u8> = (0..MIB).map(|i| (i * 131 % 251) as u8 | 1).collect();
    let mut at = 0;
    while at < len {
        f.write_all_at(&noise, at).unwrap();
        at += MIB;
    }
    run("mkfs.ext4", &["-q", "-F", "-L", "previous"], img);
    zero(img, 0, 4096);
}

fn unstage(vol: &str, staging: &Path) -> pb::UnstageRequest {
    pb::UnstageRequest {
        volume_id: vol.into(),
        staging_path: staging.display().to_string(),
    }
}

fn zero(img: &Path, at: u64, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all_at(&vec![0u8; len as usize], at).unwrap();
    f.sync_all().unwrap();
}

fn claim_at(img: &Path, at: u64) -> bool {
    let mut buf = vec![0u8; MAGIC.len()];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut buf, at)
        .unwrap();
    buf == MAGIC
}

fn dumpe2fs(img: &Path, field: &str) -> String {
    let out = std::process::Command::new("dumpe2fs")
        .arg("-h")
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn block_count(img: &Path) -> u64 {
    let n = |f: &str| dumpe2fs(img, f).parse::<u64>().unwrap();
    n("Block count:") * n("Block size:")
}

/// A 512 MiB disk holding what a removed volume left: its WWN and image.
fn old_disk(env: &mut Env, n: u32) -> (String, std::path::PathBuf) {
    let wwn = env.disk_sized(n, 512 * MIB);
    let img = env.image(&wwn);
    leave_old_bytes(&img);
    (wwn, img)
}

/// A Stage that must pass: its actions.
async fn stage_ok(env: &mut Env, vol: &str, wwn: &str, staging: &Path, fs: &str) -> Vec<String> {
    env.client
        .stage(stage_req(vol, wwn, staging, fs))
        .await
        .unwrap()
        .into_inner()
        .actions
}

#[tokio::test]
async fn a_fresh_volume_holding_old_bytes_is_formatted_on_its_first_stage_and_claimed() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let (wwn, img) = old_disk(&mut env, 1);
    let staging = env.staging(MARKED);
    let actions = stage_ok(&mut env, MARKED, &wwn, &staging, "ext4").await;
    assert!(
        actions.iter().any(|a| a.starts_with("wiped"))
            && actions.iter().any(|a| a == "mkfs ext4")
            && actions
                .iter()
                .any(|a| a == &format!("claimed at byte {}", 511 * MIB)),
        "{:?}",
        actions
    );
    assert_eq!(mount_at(&staging).as_deref(), Some("ext4"));
    // A new filesystem, made short of the claim's MiB.
    assert_eq!(dumpe2fs(&img, "Filesystem volume name:"), "<none>");
    assert!(claim_at(&img, 511 * MIB));
    std::fs::write(staging.join("kept"), b"data of this volume").unwrap();
    env.client.unstage(unstage(MARKED, &staging)).await.unwrap();
    assert_eq!(block_count(&img), 511 * MIB);

    // Staged again: its own filesystem, never formatted.
    let actions = stage_ok(&mut env, MARKED, &wwn, &staging, "ext4").await;
    assert!(
        !actions
            .iter()
            .any(|a| a.contains("mkfs") || a.contains("wiped")),
        "{:?}",
        actions
    );
    assert_eq!(
        std::fs::read(staging.join("kept")).unwrap(),
        b"data of this volume"
    );
    env.client.unstage(unstage(MARKED, &staging)).await.unwrap();
}

#[tokio::test]
async fn a_disk_attached_under_the_volumes_name_during_its_first_stage_is_not_claimed() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let (wwn, img) = old_disk(&mut env, 1);
    let dev = loop_of(&img);
    // The disk that takes the name: another one, its last MiB its own.
    let other = env.image(&env.image_sized(2, 512 * MIB));
    let own: Vec<u8> = (0..MIB).map(|i| (i % 199) as u8 | 2).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&other)
        .unwrap()
        .write_all_at(&own, 511 * MIB)
        .unwrap();
    // An mkfs that, once done, detaches the volume's disk and attaches the
    // other under the same loop device (a new disk sequence number), as a
    // SCSI disk detached and another attached may get the same sd name.
    let _tools = env
        .restart_hostd_with_mkfs_ext4(|real| {
            format!(
                "#!/bin/sh\n{real} \"$@\" || exit $?\nlosetup -d {dev}\n\
                 for i in $(seq 100); do losetup {dev} {other} 2>/dev/null && exit 0; sleep 0.05; done\n\
                 exit 1\n",
                dev = dev.display(),
                other = other.display(),
            )
        })
        .await;
    let staging = env.staging(MARKED);
    let err = env
        .client
        .stage(stage_req(MARKED, &wwn, &staging, "ext4"))
        .await
        .unwrap_err();
    assert!(
        err.message()
            .contains("the disk changed since it was verified"),
        "{err:?}"
    );
    assert_eq!(loop_of(&other), dev, "the other disk did not take the name");
    // Nothing claimed on the disk that took the name, nothing mounted.
    let mut tail = vec![0u8; MIB as usize];
    std::fs::File::open(&other)
        .unwrap()
        .read_exact_at(&mut tail, 511 * MIB)
        .unwrap();
    assert!(tail == own, "the other disk's last MiB was written");
    assert_eq!(mount_at(&staging), None);
}

#[tokio::test]
async fn a_disk_without_the_mark_keeps_the_refusal_of_old_bytes() {
    testkit::require_root!();
    let mut env = Env::start().await;
    for (i, vol) in [
        // The Go driver's name, a volume created with block access, and one
        // named before what it was made for was recorded.
        "r/pve1/local-lvm/vm-9999-pvc-a",
        "r/pve1/local-lvm/vm-9999-pvc-a.csb-5bc58ec71c2d",
        "r/pve1/local-lvm/vm-9999-pvc-a.csi-5bc58ec71c2d",
    ]
    .into_iter()
    .enumerate()
    {
        let (wwn, img) = old_disk(&mut env, 10 + i as u32);
        zero(&img, 0, 4 * MIB);
        let before = sha_of(&img);
        let staging = env.staging(vol);
        let e = env
            .client
            .stage(stage_req(vol, &wwn, &staging, "ext4"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{vol}: {e:?}");
        assert!(
            e.message().contains("refusing to format"),
            "{vol}: {}",
            e.message()
        );
        assert_eq!(sha_of(&img), before, "{vol}");
    }
}

#[tokio::test]
async fn a_claimed_volume_whose_header_is_gone_is_never_formatted_again() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let (wwn, img) = old_disk(&mut env, 20);
    let staging = env.staging(MARKED);
    stage_ok(&mut env, MARKED, &wwn, &staging, "ext4").await;
    env.client.unstage(unstage(MARKED, &staging)).await.unwrap();
    // Everything but the claim zeroed: no signature and no data sampled.
    zero(&img, 0, 511 * MIB);
    for fs in ["ext4", "xfs"] {
        let before = sha_of(&img);
        let e = env
            .client
            .stage(stage_req(MARKED, &wwn, &staging, fs))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{fs}: {e:?}");
        assert!(
            e.message()
                .contains(&format!("claim at byte {}", 511 * MIB))
                && e.message().contains("never formatted again"),
            "{fs}: {}",
            e.message()
        );
        assert_eq!(sha_of(&img), before, "{fs}");
        assert_eq!(mount_at(&staging), None);
    }
}

#[tokio::test]
async fn an_expansion_moves_the_claim_to_the_new_end_before_the_filesystem_grows() {
    testkit::require_root!();
    let mut env = Env::start().await;
    for (i, fs) in ["ext4", "xfs"].into_iter().enumerate() {
        let vol = format!("r/pve1/local-lvm/vm-9999-pvc-{fs}.csf-5bc58ec71c2d");
        let wwn = env.disk_sized(30 + i as u32, 512 * MIB);
        let img = env.image(&wwn);
        let staging = env.staging(&vol);
        stage_ok(&mut env, &vol, &wwn, &staging, fs).await;
        grow(&img, &loop_of(&img), 1024 * MIB);
        let result = env
            .client
            .expand(pb::ExpandRequest {
                volume_id: vol.clone(),
                volume_path: staging.display().to_string(),
                required_bytes: 1024 * MIB,
                encryption: None,
            })
            .await;
        if fs == "ext4" && !has_cap_sys_resource() {
            eprintln!("NOTE: ext4 online grow not checked here: CAP_SYS_RESOURCE is missing");
            env.client.unstage(unstage(&vol, &staging)).await.unwrap();
            continue;
        }
        result.unwrap();
        assert!(claim_at(&img, 1023 * MIB), "{fs}: no claim at the new end");
        let total = nix::sys::statvfs::statvfs(&staging).unwrap();
        let fs_bytes = total.blocks() * total.fragment_size();
        assert!(
            fs_bytes <= 1023 * MIB && fs_bytes > 900 * MIB,
            "{fs}: the filesystem reaches into the claim's MiB: {fs_bytes}"
        );
        if fs == "ext4" {
            assert_eq!(block_count(&img), 1023 * MIB);
        }
        // Grown again by the controller, never by hostd, then damaged:
        // the claim at the end it had is still found.
        env.client.unstage(unstage(&vol, &staging)).await.unwrap();
        grow(&img, &loop_of(&img), 1536 * MIB);
        zero(&img, 0, 16 * MIB);
        let e = env
            .client
            .stage(stage_req(&vol, &wwn, &staging, fs))
            .await
            .unwrap_err();
        assert!(
            e.message()
                .contains(&format!("claim at byte {}", 1023 * MIB)),
            "{fs}: {}",
            e.message()
        );
    }
}

#[tokio::test]
async fn a_first_stage_read_only_mounts_nothing_the_storage_left() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let (wwn, img) = old_disk(&mut env, 40);
    let before = sha_of(&img);
    let staging = env.staging(MARKED);
    let mut req = stage_req(MARKED, &wwn, &staging, "ext4");
    req.read_only = true;
    let e = env.client.stage(req).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("never been staged"), "{}", e.message());
    assert_eq!(sha_of(&img), before);
    assert_eq!(mount_at(&staging), None);
}

#[tokio::test]
async fn a_volume_created_blank_that_another_node_plugin_formatted_is_staged_as_it_is() {
    testkit::require_root!();
    // The Go node plugin formatted it while both drivers ran: a signature
    // made after the allocation, its data, and no claim.
    let mut env = Env::start().await;
    let (wwn, img) = old_disk(&mut env, 50);
    run("mkfs.ext4", &["-q", "-F", "-L", "go-made"], &img);
    let tail = {
        let mut b = vec![0u8; MIB as usize];
        std::fs::File::open(&img)
            .unwrap()
            .read_exact_at(&mut b, 511 * MIB)
            .unwrap();
        b
    };
    let staging = env.staging(MARKED);
    let actions = stage_ok(&mut env, MARKED, &wwn, &staging, "ext4").await;
    assert!(
        !actions
            .iter()
            .any(|a| a.contains("wiped") || a.contains("mkfs") || a.contains("claimed")),
        "{:?}",
        actions
    );
    assert_eq!(dumpe2fs(&img, "Filesystem volume name:"), "go-made");
    env.client.unstage(unstage(MARKED, &staging)).await.unwrap();
    // Its whole-disk filesystem's last MiB was not claimed over.
    let mut now = vec![0u8; MIB as usize];
    std::fs::File::open(&img)
        .unwrap()
        .read_exact_at(&mut now, 511 * MIB)
        .unwrap();
    assert!(now == tail, "the filesystem's last MiB changed");
}

#[tokio::test]
async fn a_first_stage_cut_off_before_its_claim_is_claimed_by_the_next_stage_elsewhere() {
    testkit::require_root!();
    // Another node's first stage made the filesystem, short of the claim's
    // MiB, and died before the claim: no note here, nothing mounted yet.
    let mut env = Env::start().await;
    for (i, (fs, mkfs, size_arg)) in [
        ("ext4", "mkfs.ext4", format!("{}k", 511 * 1024)),
        ("xfs", "mkfs.xfs", format!("size={}", 511 * MIB)),
    ]
    .into_iter()
    .enumerate()
    {
        let vol = format!("r/pve1/local-lvm/vm-9999-pvc-cut-{fs}.csf-5bc58ec71c2d");
        let (wwn, img) = old_disk(&mut env, 60 + i as u32);
        let st = if fs == "ext4" {
            std::process::Command::new(mkfs)
                .args(["-q", "-F"])
                .arg(&img)
                .arg(&size_arg)
                .status()
        } else {
            std::process::Command::new(mkfs)
                .args(["-q", "-f", "-d", &size_arg])
                .arg(&img)
                .status()
        };
        assert!(st.unwrap().success());
        let staging = env.staging(&vol);
        let actions = stage_ok(&mut env, &vol, &wwn, &staging, fs).await;
        assert!(
            actions
                .iter()
                .any(|a| a == &format!("claimed at byte {}", 511 * MIB))
                && !actions
                    .iter()
                    .any(|a| a.contains("mkfs") || a.contains("wiped")),
            "{fs}: {:?}",
            actions
        );
        assert!(claim_at(&img, 511 * MIB), "{fs}");
        env.client.unstage(unstage(&vol, &staging)).await.unwrap();
    }
}

/// A restore asked for more than its source: the source's disk copied into
/// a larger one, as Proxmox's import copies it. Its stage grows the
/// filesystem to the disk; the claimed source's stage, on a disk grown
/// offline, never grows over its claim (expand moves the claim first).
#[tokio::test]
async fn a_restore_larger_than_its_source_grows_at_stage_and_a_claimed_volume_does_not() {
    testkit::require_root!();
    let mut env = Env::start().await;
    for (i, fs) in ["ext4", "xfs"].into_iter().enumerate() {
        let source = format!("r/pve1/local-lvm/vm-9999-pvc-src-{fs}.csf-5bc58ec71c2d");
        let wwn = env.disk_sized(40 + i as u32, 512 * MIB);
        let img = env.image(&wwn);
        let staging = env.staging(&source);
        stage_ok(&mut env, &source, &wwn, &staging, fs).await;
        std::fs::write(staging.join("data"), vec![9u8; MIB as usize]).unwrap();
        env.client
            .unstage(unstage(&source, &staging))
            .await
            .unwrap();
        let source_fs = probe_fs_bytes(&img);
        assert!(source_fs <= 511 * MIB, "{fs}: {source_fs}");

        // The copy: the source's bytes in a 1 GiB disk, no mark.
        let restore = format!("r/pve1/local-lvm/vm-9999-pvc-restore-{fs}");
        let copy = env.image_sized(50 + i as u32, 1024 * MIB);
        std::fs::copy(&img, env.image(&copy)).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(env.image(&copy))
            .unwrap()
            .set_len(1024 * MIB)
            .unwrap();
        env.attach(&copy);
        let copy_staging = env.staging(&restore);
        let result = env
            .client
            .stage(stage_req(&restore, &copy, &copy_staging, fs))
            .await;
        if fs == "ext4" && !has_cap_sys_resource() {
            // Online growth needs CAP_SYS_RESOURCE, which some sandboxes
            // withhold from root: the stage fails with resize2fs's cause and
            // leaves nothing mounted (the guest VM test covers the growth).
            let e = result.unwrap_err();
            assert!(e.message().contains("resize2fs"), "{e:?}");
            assert_eq!(mount_at(&copy_staging), None);
            eprintln!("NOTE: ext4 online grow not checked here: CAP_SYS_RESOURCE is missing");
        } else {
            let actions = result.unwrap().into_inner().actions;
            assert!(
                actions.iter().any(|a| a.starts_with("grew the")),
                "{fs}: {actions:?}"
            );
            let v = nix::sys::statvfs::statvfs(&copy_staging).unwrap();
            let total = v.blocks() * v.fragment_size();
            assert!(total > 900 * MIB, "{fs}: {total} bytes after the stage");
            assert_eq!(
                std::fs::read(copy_staging.join("data")).unwrap(),
                vec![9u8; MIB as usize],
                "{fs}"
            );
            // Staged again: nothing more to grow.
            let again = stage_ok(&mut env, &restore, &copy, &copy_staging, fs).await;
            assert_eq!(again, vec!["already staged".to_string()], "{fs}");
            env.client
                .unstage(unstage(&restore, &copy_staging))
                .await
                .unwrap();
        }

        // The claimed source on a disk the controller grew offline: staged
        // as it is, its claim where it was.
        grow(&img, &loop_of(&img), 1024 * MIB);
        let actions = stage_ok(&mut env, &source, &wwn, &staging, fs).await;
        assert!(
            !actions.iter().any(|a| a.starts_with("grew")),
            "{fs}: {actions:?}"
        );
        assert_eq!(probe_fs_bytes(&img), source_fs, "{fs}");
        assert!(claim_at(&img, 511 * MIB), "{fs}: the claim moved or went");
        env.client
            .unstage(unstage(&source, &staging))
            .await
            .unwrap();
    }
}

/// The size a filesystem's superblock gives, read from its image.
fn probe_fs_bytes(img: &Path) -> u64 {
    proxmox_csi_hostd::probe::fs_bytes(img).unwrap().unwrap()
}

/// A disk that stands for one attached without a serial (the Go driver's
/// attach, taken over): its serial proves no volume id.
fn without_serial(img: &Path) {
    std::fs::write(format!("{}.noserial", img.display()), "").unwrap();
}

/// A claimed volume's disk attached without a serial, grown by the
/// controller, then staged and expanded by a node plugin under another,
/// unmarked volume id: its filesystem is not grown at stage, and an expand
/// refuses to grow over the claim beyond it; the claim stays.
#[tokio::test]
async fn a_claimed_disk_without_a_serial_is_not_grown_under_another_name() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let owner = "r/pve1/local-lvm/vm-9999-pvc-owner.csf-5bc58ec71c2d";
    let wwn = env.disk_sized(60, 1024 * MIB);
    let img = env.image(&wwn);
    let staging = env.staging(owner);
    stage_ok(&mut env, owner, &wwn, &staging, "xfs").await;
    env.client.unstage(unstage(owner, &staging)).await.unwrap();
    assert!(claim_at(&img, 1023 * MIB));
    without_serial(&img);
    grow(&img, &loop_of(&img), 1536 * MIB);

    let other = "r/pve1/local-lvm/vm-9999-pvc-other";
    let other_staging = env.staging(other);
    let actions = stage_ok(&mut env, other, &wwn, &other_staging, "xfs").await;
    assert!(
        !actions.iter().any(|a| a.starts_with("grew")),
        "{actions:?}"
    );
    assert!(claim_at(&img, 1023 * MIB), "the stage grew over the claim");
    let e = env
        .client
        .expand(pb::ExpandRequest {
            volume_id: other.into(),
            volume_path: other_staging.display().to_string(),
            required_bytes: 1536 * MIB,
            encryption: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("claim lies at byte"), "{e:?}");
    assert!(claim_at(&img, 1023 * MIB), "the expand grew over the claim");
    env.client
        .unstage(unstage(other, &other_staging))
        .await
        .unwrap();
}

/// A claim record inside a mounted filesystem is a file's bytes (a pod's):
/// an expand never takes it for the volume's claim, and writes nothing
/// into the filesystem.
#[tokio::test]
async fn an_expand_ignores_a_claim_record_inside_the_filesystem() {
    testkit::require_root!();
    let mut env = Env::start().await;
    let vol = "r/pve1/local-lvm/vm-9999-pvc-whole.csf-5bc58ec71c2d";
    let wwn = env.disk_sized(61, 1024 * MIB);
    let img = env.image(&wwn);
    // Formatted whole by another node plugin before its first stage here.
    run("mkfs.xfs", &["-q", "-f"], &img);
    let staging = env.staging(vol);
    stage_ok(&mut env, vol, &wwn, &staging, "xfs").await;
    assert!(!claim_at(&img, 1023 * MIB));
    // A pod's bytes that read as the volume's claim, where the claim of a
    // 1 GiB disk would be.
    let mut forged = MAGIC.to_vec();
    forged.extend_from_slice(&sha2_of(vol));
    forged.resize(4096, 0x5a);
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all_at(&forged, 1023 * MIB).unwrap();
    f.sync_all().unwrap();
    let before = read_at(&img, 1023 * MIB, MIB);
    env.client
        .expand(pb::ExpandRequest {
            volume_id: vol.into(),
            volume_path: staging.display().to_string(),
            required_bytes: 0,
            encryption: None,
        })
        .await
        .unwrap();
    assert_eq!(
        read_at(&img, 1023 * MIB, MIB),
        before,
        "the expand wrote into the filesystem"
    );
    env.client.unstage(unstage(vol, &staging)).await.unwrap();
}

fn sha2_of(s: &str) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes()).to_vec()
}

fn read_at(img: &Path, at: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut buf, at)
        .unwrap();
    buf
}
