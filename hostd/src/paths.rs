//! Target paths a caller may name: only kubelet's CSI directories.
//!
//! A path is resolved before it is checked, so `..` and symlinks cannot lead
//! out of those directories. The last component may not exist yet (hostd
//! creates staging and target paths), but its parent must.

use std::path::{Component, Path, PathBuf};

use crate::error::HostdError;

/// kubelet's root (normally `/var/lib/kubelet`), canonicalised once.
#[derive(Debug, Clone)]
pub struct KubeletPaths {
    root: PathBuf,
}

impl KubeletPaths {
    pub fn new(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: root.canonicalize()?,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `raw` and checks that it lies in a CSI directory:
    /// `plugins/kubernetes.io/csi/…` (staging), or
    /// `pods/<uid>/volumes/kubernetes.io~csi/…` and
    /// `pods/<uid>/volumeDevices/kubernetes.io~csi/…` (publish targets).
    pub fn check(&self, field: &'static str, raw: &str) -> Result<PathBuf, HostdError> {
        if raw.is_empty() {
            return Err(HostdError::invalid(field, "is empty"));
        }
        let path = Path::new(raw);
        if !path.is_absolute() {
            return Err(HostdError::invalid(field, format!("{raw:?} is not an absolute path")));
        }
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(HostdError::invalid(field, format!("{raw:?} contains '..'")));
        }
        let name = path
            .file_name()
            .ok_or_else(|| HostdError::invalid(field, format!("{raw:?} has no final component")))?;
        let parent = path
            .parent()
            .ok_or_else(|| HostdError::invalid(field, format!("{raw:?} has no parent")))?;
        let parent = parent.canonicalize().map_err(|e| {
            HostdError::invalid(field, format!("parent of {raw:?} cannot be resolved: {e}"))
        })?;
        let resolved = parent.join(name);
        // The final component itself may be a symlink pointing elsewhere.
        if std::fs::symlink_metadata(&resolved).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(HostdError::invalid(field, format!("{raw:?} is a symlink")));
        }
        if self.is_csi_path(&resolved) {
            Ok(resolved)
        } else {
            Err(HostdError::PathOutsideKubelet {
                field,
                path: resolved,
                root: self.root.clone(),
            })
        }
    }

    fn is_csi_path(&self, p: &Path) -> bool {
        let Ok(rel) = p.strip_prefix(&self.root) else {
            return false;
        };
        let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        match parts.as_slice() {
            ["plugins", "kubernetes.io", "csi", _, ..] => true,
            ["pods", _uid, "volumes" | "volumeDevices", "kubernetes.io~csi", _, ..] => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, KubeletPaths) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("plugins/kubernetes.io/csi/drv/abc")).unwrap();
        std::fs::create_dir_all(root.join("pods/uid1/volumes/kubernetes.io~csi/pv1")).unwrap();
        std::fs::create_dir_all(root.join("pods/uid1/volumeDevices/kubernetes.io~csi")).unwrap();
        std::fs::create_dir_all(root.join("pods/uid1/etc-hosts")).unwrap();
        let k = KubeletPaths::new(root).unwrap();
        (dir, k)
    }

    #[test]
    fn accepts_kubelets_csi_directories() {
        let (dir, k) = setup();
        let r = dir.path().canonicalize().unwrap();
        for p in [
            "plugins/kubernetes.io/csi/drv/abc/globalmount",
            "pods/uid1/volumes/kubernetes.io~csi/pv1/mount",
            "pods/uid1/volumeDevices/kubernetes.io~csi/pv1",
        ] {
            let got = k.check("target_path", r.join(p).to_str().unwrap()).unwrap();
            assert_eq!(got, r.join(p));
        }
    }

    #[test]
    fn refuses_escapes_and_other_places() {
        let (dir, k) = setup();
        let r = dir.path().canonicalize().unwrap();
        let csi = r.join("plugins/kubernetes.io/csi/drv/abc");
        // `..` is refused outright, even when it would land inside.
        let e = k
            .check("target_path", &format!("{}/../abc/x", csi.display()))
            .unwrap_err();
        assert!(e.to_string().contains("contains '..'"), "{e}");
        // A symlinked parent that leads outside.
        std::os::unix::fs::symlink("/etc", csi.join("link")).unwrap();
        let e = k
            .check("target_path", csi.join("link/passwd").to_str().unwrap())
            .unwrap_err();
        assert!(matches!(e, HostdError::PathOutsideKubelet { .. }), "{e}");
        assert!(e.to_string().contains("/etc/passwd"), "{e}");
        // The final component as a symlink.
        let e = k.check("target_path", csi.join("link").to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        // Inside kubelet's root but not a CSI directory.
        let e = k
            .check("staging_path", r.join("pods/uid1/etc-hosts/x").to_str().unwrap())
            .unwrap_err();
        assert!(e.to_string().starts_with("staging_path: "), "{e}");
        assert!(matches!(e, HostdError::PathOutsideKubelet { .. }));
        for bad in ["", "relative/path", "/"] {
            assert!(k.check("target_path", bad).is_err(), "{bad}");
        }
        assert!(k.check("target_path", "/tmp/x").is_err());
    }
}
