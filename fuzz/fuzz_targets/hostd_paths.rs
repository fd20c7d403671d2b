//! hostd's check of paths it is asked to act on: no panic; an accepted path
//! lies inside kubelet's root, has one of kubelet's layouts, and has no
//! symlink, `.` or `..` on the way.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use proxmox_csi_hostd::paths::{KubeletPaths, Layout};

const DRIVER: &str = "csi.proxmox.sinextra.dev";
const HASH: &str = "0d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa";

fn root() -> &'static (tempfile::TempDir, KubeletPaths) {
    static ROOT: OnceLock<(tempfile::TempDir, KubeletPaths)> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        for d in [
            format!("plugins/kubernetes.io/csi/{DRIVER}/{HASH}/globalmount"),
            "plugins/kubernetes.io/csi/volumeDevices/staging/pv".into(),
            "plugins/kubernetes.io/csi/volumeDevices/publish/pv".into(),
            "pods/uid/volumes/kubernetes.io~csi/pv".into(),
        ] {
            std::fs::create_dir_all(dir.path().join(d)).expect("dirs");
        }
        // A symlink out of the tree, where a pod volume's directory would be.
        std::fs::create_dir_all(dir.path().join("pods/evil/volumes")).expect("dirs");
        std::os::unix::fs::symlink(
            "/etc",
            dir.path().join("pods/evil/volumes/kubernetes.io~csi"),
        )
        .expect("symlink");
        let paths = KubeletPaths::new(dir.path(), DRIVER).expect("root");
        (dir, paths)
    })
}

fuzz_target!(|raw: &str| {
    let (dir, paths) = root();
    let root = dir.path().canonicalize().expect("root");
    // Relative inputs are tried under the root as well.
    for candidate in [raw.to_string(), format!("{}/{raw}", root.display())] {
        if let Ok(p) = paths.place("staging_path", &candidate, Layout::VOLUME) {
            assert!(
                p.path.starts_with(&root),
                "{candidate:?} resolved to {}",
                p.path.display()
            );
            assert_eq!(paths.classify(&p.path), Some(p.layout), "{candidate:?}");
            assert!(
                !p.path.starts_with(root.join("pods/evil")),
                "{candidate:?} went through a symlink"
            );
        }
    }
});
