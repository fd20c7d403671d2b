//! hostd's check of paths it is asked to mount at: no panic; an accepted
//! path resolves inside kubelet's CSI directories.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use proxmox_csi_hostd::paths::KubeletPaths;

fn root() -> &'static (tempfile::TempDir, KubeletPaths) {
    static ROOT: OnceLock<(tempfile::TempDir, KubeletPaths)> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["plugins/kubernetes.io/csi/drv/vol", "pods/uid/volumes/kubernetes.io~csi/pv", "pods/uid/volumeDevices/kubernetes.io~csi"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("dirs");
        }
        let paths = KubeletPaths::new(dir.path()).expect("root");
        (dir, paths)
    })
}

fuzz_target!(|raw: &str| {
    let (dir, paths) = root();
    // Relative inputs are tried under the root as well.
    for candidate in [raw.to_string(), format!("{}/{raw}", dir.path().display())] {
        if let Ok(p) = paths.check("staging_path", &candidate) {
            let root = dir.path().canonicalize().expect("root");
            assert!(p.starts_with(&root), "{candidate:?} resolved to {}", p.display());
        }
    }
});
