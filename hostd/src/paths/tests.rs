use super::*;

const DRIVER: &str = "csi.proxmox.sinextra.dev";
const HASH: &str = "0d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa";

fn setup() -> (tempfile::TempDir, KubeletPaths) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in [
        format!("plugins/kubernetes.io/csi/{DRIVER}/{HASH}/globalmount"),
        format!("plugins/kubernetes.io/csi/other.driver/{HASH}/globalmount"),
        "plugins/kubernetes.io/csi/volumeDevices/staging/pv1".into(),
        "plugins/kubernetes.io/csi/volumeDevices/publish/pv1".into(),
        "pods/uid1/volumes/kubernetes.io~csi/pv1".into(),
        "pods/uid1/volumes/kubernetes.io~secret/token".into(),
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let k = KubeletPaths::new(root, DRIVER).unwrap();
    (dir, k)
}

#[test]
fn accepts_kubelets_exact_layouts() {
    let (dir, k) = setup();
    let r = dir.path().canonicalize().unwrap();
    for (p, layout) in [
        (
            format!("plugins/kubernetes.io/csi/{DRIVER}/{HASH}/globalmount"),
            Layout::FsStaging,
        ),
        (
            "plugins/kubernetes.io/csi/volumeDevices/staging/pv1".into(),
            Layout::BlockStaging,
        ),
        (
            "pods/uid1/volumes/kubernetes.io~csi/pv1/mount".into(),
            Layout::FsTarget,
        ),
        (
            "plugins/kubernetes.io/csi/volumeDevices/publish/pv1/uid1".into(),
            Layout::BlockTarget,
        ),
    ] {
        let got = k
            .place("target_path", r.join(&p).to_str().unwrap(), Layout::VOLUME)
            .unwrap();
        assert_eq!((got.path, got.layout), (r.join(&p), layout));
    }
}

#[test]
fn refuses_other_drivers_other_depths_and_other_places() {
    let (dir, k) = setup();
    let r = dir.path().canonicalize().unwrap();
    for p in [
        format!("plugins/kubernetes.io/csi/other.driver/{HASH}/globalmount"),
        format!("plugins/kubernetes.io/csi/{DRIVER}/{HASH}/globalmount/deeper"),
        format!("plugins/kubernetes.io/csi/{DRIVER}/not-a-hash/globalmount"),
        "pods/uid1/volumes/kubernetes.io~csi/pv1/mount/d".into(),
        "pods/uid1/volumes/kubernetes.io~secret/token/mount".into(),
        "pods/uid1/volumes/kubernetes.io~csi/pv1".into(),
        "plugins/kubernetes.io/csi/volumeDevices/staging/pv1/device".into(),
    ] {
        let e = k
            .place("staging_path", r.join(&p).to_str().unwrap(), Layout::VOLUME)
            .unwrap_err();
        assert!(
            matches!(e, HostdError::PathOutsideKubelet { .. }),
            "{p}: {e}"
        );
        assert!(e.to_string().starts_with("staging_path: "), "{e}");
    }
    // A target is not a staging path, and the other way round.
    let target = r.join("pods/uid1/volumes/kubernetes.io~csi/pv1/mount");
    assert!(
        k.place("staging_path", target.to_str().unwrap(), Layout::STAGING)
            .is_err()
    );
    for bad in ["", "relative/path", "/", "/tmp/x"] {
        assert!(
            k.place("target_path", bad, Layout::VOLUME).is_err(),
            "{bad}"
        );
    }
    // A component with a character kubelet never writes is refused, not
    // skipped (requests are proto strings: nothing but UTF-8 arrives).
    let odd = format!(
        "{}/pods/uid1/volumes/kubernetes.io~csi/pv\u{fffd}/mount",
        r.display()
    );
    assert!(k.place("target_path", &odd, Layout::TARGET).is_err());
}

#[test]
fn refuses_symlinks_anywhere_on_the_way() {
    let (dir, k) = setup();
    let r = dir.path().canonicalize().unwrap();
    // `..` is refused outright, even when it would land inside.
    let e = k
        .place(
            "target_path",
            &format!(
                "{}/pods/uid1/../uid1/volumes/kubernetes.io~csi/pv1/mount",
                r.display()
            ),
            Layout::TARGET,
        )
        .unwrap_err();
    assert!(e.to_string().contains("contains '..'"), "{e}");
    // A symlinked parent that leads outside: refused when opened.
    std::fs::create_dir_all(r.join("pods/uid2/volumes")).unwrap();
    std::os::unix::fs::symlink("/etc", r.join("pods/uid2/volumes/kubernetes.io~csi")).unwrap();
    let e = k
        .place(
            "target_path",
            r.join("pods/uid2/volumes/kubernetes.io~csi/pv1/mount")
                .to_str()
                .unwrap(),
            Layout::TARGET,
        )
        .unwrap_err();
    assert!(e.to_string().contains("is a symlink"), "{e}");
    // The last component as a symlink.
    let link = r.join("pods/uid1/volumes/kubernetes.io~csi/pv1/mount");
    std::os::unix::fs::symlink("/usr/sbin", &link).unwrap();
    let e = k
        .place("target_path", link.to_str().unwrap(), Layout::TARGET)
        .unwrap_err();
    assert!(e.to_string().contains("is a symlink"), "{e}");
}

#[test]
fn acts_on_the_directory_it_checked() {
    let (dir, k) = setup();
    let r = dir.path().canonicalize().unwrap();
    let target = r.join("pods/uid1/volumes/kubernetes.io~csi/pv1/mount");
    let place = k
        .place("target_path", target.to_str().unwrap(), Layout::TARGET)
        .unwrap();
    // The pod volume's directory is swapped for a symlink after the
    // check: the place still makes its directory in the one it opened.
    let pv = r.join("pods/uid1/volumes/kubernetes.io~csi/pv1");
    std::fs::rename(&pv, r.join("moved")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), &pv).unwrap();
    place.ensure_dir().unwrap();
    assert!(r.join("moved/mount").is_dir());
    assert!(!elsewhere.path().join("mount").exists());
    // Only what publish makes there is removed: a directory, not a file.
    assert!(place.remove_only(Kind::File).is_err());
    assert!(r.join("moved/mount").is_dir());
    place.remove_only(Kind::Dir).unwrap();
    assert!(!r.join("moved/mount").exists());
}

#[test]
fn kubelets_volume_record_is_never_a_target() {
    let (dir, k) = setup();
    let r = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(r.join("pods/uid1/volumes/kubernetes.io~csi/pv1")).unwrap();
    let record = r.join("pods/uid1/volumes/kubernetes.io~csi/pv1/vol_data.json");
    let e = k
        .place("target_path", record.to_str().unwrap(), Layout::TARGET)
        .unwrap_err();
    assert!(matches!(e, HostdError::PathOutsideKubelet { .. }), "{e}");
}
