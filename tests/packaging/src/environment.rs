//! The images' declared environment as its lock pins it for this machine's
//! architecture (deploy/images/environment.<arch>.lock, the one
//! `make images` builds from here): the locked .deb files, checked against
//! their SHA-256, and the contents of every file they hold, so an image's
//! files can be traced to the package they came from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// One line of the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locked {
    pub package: String,
    pub architecture: String,
    pub version: String,
    pub sha256: String,
}

/// This machine's architecture as Debian names it.
pub fn debian_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The lock's packages, for this machine's architecture.
pub fn lock(repo: &Path) -> Vec<Locked> {
    let name = format!("deploy/images/environment.{}.lock", debian_arch());
    let text = std::fs::read_to_string(repo.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "lock line {l:?}");
            Locked {
                package: f[0].into(),
                architecture: f[1].into(),
                version: f[2].into(),
                sha256: f[3].into(),
            }
        })
        .collect()
}

pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every regular file of the locked packages, by the SHA-256 of its
/// contents: the packages holding a file with those bytes.
#[derive(Debug)]
pub struct Contents {
    by_hash: HashMap<String, Vec<(String, PathBuf)>>,
}

impl Contents {
    /// Extracts each locked .deb of `debs` (scripts/environment.sh's cache,
    /// target/environment/debs) into `scratch`, after checking it against
    /// the lock's SHA-256.
    pub fn of(repo: &Path, debs: &Path, scratch: &Path) -> Contents {
        let mut by_hash: HashMap<String, Vec<(String, PathBuf)>> = HashMap::new();
        for l in lock(repo) {
            let deb = debs.join(format!("{}_{}_{}.deb", l.package, l.architecture, l.sha256));
            let bytes = std::fs::read(&deb).unwrap_or_else(|e| panic!("{}: {e}", deb.display()));
            assert_eq!(
                sha256(&bytes),
                l.sha256,
                "{} is not the locked file",
                deb.display()
            );
            let into = scratch.join(&l.package);
            std::fs::create_dir_all(&into).unwrap_or_else(|e| panic!("{}: {e}", into.display()));
            let ok = Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(&into)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "dpkg-deb -x {}", deb.display());
            for file in regular_files(&into) {
                let bytes = std::fs::read(&file).unwrap_or_default();
                let path = PathBuf::from("/").join(file.strip_prefix(&into).unwrap_or(&file));
                by_hash
                    .entry(sha256(&bytes))
                    .or_default()
                    .push((l.package.clone(), path));
            }
        }
        Contents { by_hash }
    }

    /// The packages holding a file with these bytes, and that file's path.
    pub fn holders(&self, bytes: &[u8]) -> &[(String, PathBuf)] {
        self.by_hash
            .get(&sha256(bytes))
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// The packages an image root records in var/lib/dpkg/status.d (the
/// distroless layout), each with its version.
pub fn recorded(root: &Path) -> HashMap<String, String> {
    regular_files(&root.join("var/lib/dpkg/status.d"))
        .iter()
        .map(|f| {
            let control = std::fs::read_to_string(f).unwrap_or_default();
            let field = |k: &str| {
                control
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{k}: ")))
                    .unwrap_or_default()
                    .to_string()
            };
            (field("Package"), field("Version"))
        })
        .collect()
}

/// The regular files under `dir` (symbolic links are not followed).
pub fn regular_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}
