//! A disk that takes the volume's device name in the middle of its stage
//! (the volume's disk detached, another attached under the same name): on
//! loop devices, as root. What hostd writes is checked against the disk it
//! verified, right before each write.

use sha2::Digest;
use std::os::unix::fs::FileExt;
use testkit::loopdev::Loop;

use super::*;

const MIB: u64 = 1 << 20;
const VOL: &str = "local-lvm:vm-9999-disk-0";

fn volumes(dir: &Path) -> Volumes {
    let kubelet = dir.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    Volumes {
        paths: KubeletPaths::new(&kubelet, "csi.proxmox.sinextra.dev").unwrap(),
        bindings: Bindings::open(&dir.join("state")).unwrap(),
        resolver: Resolver::default(),
        index: Arc::new(DeviceIndex::default()),
        device_wait: Duration::from_secs(1),
        pbkdf: luks::Pbkdf::Pbkdf2 { iterations: 1000 },
        kdf_bounds: luks::KdfBounds::default(),
        go_takeover: false,
    }
}

/// The identity of the volume's disk as the stage verified it; the disk
/// is detached when this returns.
fn verified_then_detached(dir: &Path) -> DiskId {
    let ours = Loop::create(&dir.join("ours.img"), 64 * MIB).unwrap();
    DiskId::of(&ours.dev).unwrap()
}

#[test]
fn a_disk_attached_under_the_volumes_name_before_its_luks_format_keeps_its_bytes() {
    testkit::require_root!();
    let dir = tempfile::tempdir().unwrap();
    let v = volumes(dir.path());
    let disk = verified_then_detached(dir.path());
    // The volume's first stage noted its format of this disk (after its
    // wipe, the disk blank): LUKS's plan formats it without a data sample.
    v.bindings.begin_format(VOL, &disk).unwrap();
    // Another disk under the device name the stage holds (loop devices
    // are taken by whoever asks first, so the test hands it over as the
    // name, not by number): blank where libblkid looks, its own bytes at
    // 10 MiB, inside the 16 MiB a LUKS2 header takes.
    let other = dir.path().join("other.img");
    std::fs::File::create(&other)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    let own = vec![0x5au8; 4096];
    std::fs::OpenOptions::new()
        .write(true)
        .open(&other)
        .unwrap()
        .write_all_at(&own, 10 * MIB)
        .unwrap();
    let now = Loop::attach(&other).unwrap();
    assert_ne!(DiskId::of(&now.dev).unwrap(), disk);

    let err = v
        .open_luks(
            VOL,
            &now.dev,
            &disk,
            ("swapped", &Secret::new(b"passphrase".to_vec())),
            Claim::Unmarked,
            false,
            &[],
            &mut Vec::new(),
            &mut HashMap::new(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, HostdError::DeviceRefused { reason, .. } if reason.contains("the disk changed since it was verified")),
        "{err:?}"
    );
    let mut read = vec![0u8; 4096];
    std::fs::File::open(&other)
        .unwrap()
        .read_exact_at(&mut read, 10 * MIB)
        .unwrap();
    assert_eq!(read, own, "the other disk's bytes were overwritten");
    let mut head = vec![0u8; 4096];
    std::fs::File::open(&other)
        .unwrap()
        .read_exact_at(&mut head, 0)
        .unwrap();
    assert!(head.iter().all(|b| *b == 0), "a LUKS header was written");
}

#[test]
fn a_disk_attached_under_the_volumes_name_is_not_mounted() {
    testkit::require_root!();
    let dir = tempfile::tempdir().unwrap();
    let v = volumes(dir.path());
    let disk = verified_then_detached(dir.path());
    // Another disk under the device name, holding the filesystem asked
    // for: the plan keeps it and mounts it, unless the disk is checked.
    let other = dir.path().join("other.img");
    std::fs::File::create(&other)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    let made = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&other)
        .status();
    assert!(made.unwrap().success());
    let now = Loop::attach(&other).unwrap();
    // kubelet's staging path: the SHA-256 of the volume id
    // (kubernetes pkg/volume/csi/csi_attacher.go makeDeviceMountPath).
    let hash: String = sha2::Sha256::digest(VOL.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let parent = v
        .paths
        .root()
        .join("plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev")
        .join(hash);
    std::fs::create_dir_all(&parent).unwrap();
    let path = parent.join("globalmount");
    let staging = v
        .paths
        .place(
            "staging_path",
            &path.display().to_string(),
            &[Layout::FsStaging],
        )
        .unwrap();
    let fs = pb::Filesystem {
        fs_type: "ext4".into(),
        ..Default::default()
    };
    let err = v
        .stage_filesystem(
            VOL,
            &now.dev,
            &disk,
            &staging,
            &fs,
            false,
            None,
            &mut HashMap::new(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, HostdError::DeviceRefused { reason, .. } if reason.contains("the disk changed since it was verified")),
        "{err:?}"
    );
    let table = mounts::table().unwrap();
    assert!(
        !table.iter().any(|m| m.mount_point == path),
        "the other disk was mounted"
    );
}
