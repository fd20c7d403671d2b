//! The rules Talos applies to a system extension (talos-extension.md §1–§2):
//! the image holds exactly `manifest.yaml` and `rootfs/`; files only under
//! the allowed paths, none world-writable, no special files; extension
//! service specs with the fields and values Talos accepts.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use serde::Deserialize;

/// Where an extension may put files (Talos `AllowedPaths`).
const ALLOWED: &[&str] = &[
    "/usr/local/",
    "/usr/lib/firmware/",
    "/usr/lib/modules/",
    "/usr/lib/udev/rules.d/",
    "/etc/cri/conf.d/",
    "/usr/lib/ld-linux-x86-64.so.2",
    "/usr/lib/ld-linux-aarch64.so.1",
    "/usr/bin/ldconfig",
    "/etc/ld.so.conf",
    "/etc/ld.so.cache",
    "/usr/bin/nvidia-",
    "/usr/bin/nvme",
    "/usr/share/glvnd",
    "/usr/share/egl",
    "/etc/vulkan",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: String,
    pub metadata: Metadata,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    pub version: String,
    pub author: String,
    pub description: String,
    #[serde(default)]
    pub compatibility: Option<Compatibility>,
    #[serde(default, rename = "extraInfo")]
    pub extra_info: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compatibility {
    pub talos: VersionRange,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionRange {
    pub version: String,
}

/// An extension service spec (Talos `services.Spec`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub name: String,
    pub container: Container,
    #[serde(default)]
    pub depends: Vec<BTreeMap<String, serde_norway::Value>>,
    #[serde(default)]
    pub restart: String,
    #[serde(default, rename = "logToConsole")]
    pub log_to_console: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Container {
    pub entrypoint: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub environment: Vec<String>,
    #[serde(default, rename = "environmentFile")]
    pub environment_file: Option<String>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub security: Security,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub source: String,
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub options: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Security {
    #[serde(default, rename = "writeableRootfs")]
    pub writeable_rootfs: bool,
    #[serde(default, rename = "writeableSysfs")]
    pub writeable_sysfs: bool,
    #[serde(default, rename = "maskedPaths")]
    pub masked_paths: Option<Vec<String>>,
    #[serde(default, rename = "readonlyPaths")]
    pub readonly_paths: Option<Vec<String>>,
    #[serde(default, rename = "rootfsPropagation")]
    pub rootfs_propagation: Option<String>,
}

const DEPENDENCY_KINDS: &[&str] = &["service", "path", "network", "time", "configuration"];
const MOUNT_OPTIONS: &[&str] = &[
    "bind", "rbind", "ro", "rw", "shared", "rshared", "slave", "rslave", "private", "rprivate",
    "nosuid", "nodev", "noexec",
];
const PROPAGATIONS: &[&str] = &[
    "shared", "rshared", "slave", "rslave", "private", "rprivate",
];

/// Every rule the tree at `root` breaks, as sentences; empty when it is a
/// valid extension.
pub fn problems(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut top: Vec<String> = match std::fs::read_dir(root) {
        Ok(d) => d
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) => return vec![format!("{}: {e}", root.display())],
    };
    top.sort();
    for name in &top {
        if name != "manifest.yaml" && name != "rootfs" {
            out.push(format!(
                "unexpected file \"{name}\" at the top of the extension"
            ));
        }
    }
    match std::fs::read_to_string(root.join("manifest.yaml")) {
        Ok(text) => out.extend(manifest_problems(&text)),
        Err(_) => out.push("extension manifest is missing".into()),
    }
    let rootfs = root.join("rootfs");
    if !rootfs.is_dir() {
        out.push("extension rootfs is missing".into());
        return out;
    }
    walk(&rootfs, &rootfs, &mut out);
    let specs = rootfs.join("usr/local/etc/containers");
    if let Ok(dir) = std::fs::read_dir(&specs) {
        for e in dir.filter_map(|e| e.ok()) {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "yaml") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                out.extend(
                    service_problems(&rootfs, &text)
                        .into_iter()
                        .map(|m| format!("{}: {m}", p.display())),
                );
            }
        }
    }
    out
}

pub fn manifest_problems(text: &str) -> Vec<String> {
    let m: Manifest = match serde_norway::from_str(text) {
        Ok(m) => m,
        Err(e) => return vec![format!("manifest.yaml: {e}")],
    };
    let mut out = Vec::new();
    if m.version != "v1alpha1" {
        out.push(format!("unsupported manifest version {:?}", m.version));
    }
    let semver = regex::Regex::new(r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
        .map(|r| r.is_match(&m.metadata.version));
    if semver != Ok(true) {
        out.push(format!(
            "metadata.version {:?} is not semver",
            m.metadata.version
        ));
    }
    for (field, v) in [
        ("name", &m.metadata.name),
        ("author", &m.metadata.author),
        ("description", &m.metadata.description),
    ] {
        if v.trim().is_empty() {
            out.push(format!("metadata.{field} is empty"));
        }
    }
    match &m.metadata.compatibility {
        Some(c) => {
            let range = regex::Regex::new(r"^(>=|>|<=|<|=|~|\^)?\s*v?\d+\.\d+(\.\d+)?(,\s*(>=|>|<=|<)\s*v?\d+\.\d+(\.\d+)?)*$")
                .map(|r| r.is_match(c.talos.version.trim()));
            if range != Ok(true) {
                out.push(format!(
                    "compatibility.talos.version {:?} is not a version range",
                    c.talos.version
                ));
            }
        }
        None => out.push("compatibility.talos.version is not set".into()),
    }
    out
}

pub fn service_problems(rootfs: &Path, text: &str) -> Vec<String> {
    let s: Service = match serde_norway::from_str(text) {
        Ok(s) => s,
        Err(e) => return vec![format!("service spec: {e}")],
    };
    let mut out = Vec::new();
    if !regex::Regex::new(r"^[-_a-z0-9]{1,}$").is_ok_and(|r| r.is_match(&s.name)) {
        out.push(format!(
            "name {:?} does not match ^[-_a-z0-9]{{1,}}$",
            s.name
        ));
    }
    if !matches!(s.restart.as_str(), "always" | "never" | "untilSuccess") {
        out.push(format!("restart kind is invalid: {:?}", s.restart));
    }
    for (i, d) in s.depends.iter().enumerate() {
        let kinds: Vec<&String> = d.keys().collect();
        if kinds.len() != 1 || !DEPENDENCY_KINDS.contains(&kinds[0].as_str()) {
            out.push(format!(
                "depends[{i}] must set exactly one of {DEPENDENCY_KINDS:?}, has {kinds:?}"
            ));
        }
    }
    if s.container.entrypoint.is_empty() {
        out.push("container.entrypoint is empty".into());
    } else {
        let svc = rootfs.join("usr/local/lib/containers").join(&s.name);
        let entry = svc.join(
            s.container
                .entrypoint
                .trim_start_matches("./")
                .trim_start_matches('/'),
        );
        match std::fs::metadata(&entry) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
            _ => out.push(format!(
                "entrypoint {} is not an executable file of the service's rootfs",
                entry.display()
            )),
        }
    }
    for e in &s.container.environment {
        if !e.contains('=') {
            out.push(format!("environment entry {e:?} is not KEY=value"));
        }
    }
    for m in &s.container.mounts {
        if !m.source.starts_with('/') || !m.destination.starts_with('/') {
            out.push(format!(
                "mount {} → {}: paths must be absolute",
                m.source, m.destination
            ));
        }
        if m.kind != "bind" {
            out.push(format!("mount {}: type {:?}, want bind", m.source, m.kind));
        }
        for o in &m.options {
            if !MOUNT_OPTIONS.contains(&o.as_str()) {
                out.push(format!("mount {}: unknown option {o:?}", m.source));
            }
        }
    }
    if let Some(p) = &s.container.security.rootfs_propagation
        && !PROPAGATIONS.contains(&p.as_str())
    {
        out.push(format!(
            "security.rootfsPropagation {p:?} is not one of {PROPAGATIONS:?}"
        ));
    }
    out
}

fn walk(rootfs: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let inside = format!(
            "/{}",
            path.strip_prefix(rootfs)
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        let ft = meta.file_type();
        if !ft.is_symlink() && meta.mode() & 0o002 != 0 {
            out.push(format!("{inside}: world-writeable files are not allowed"));
        }
        if ft.is_fifo() || ft.is_socket() || ft.is_block_device() || ft.is_char_device() {
            out.push(format!("{inside}: special files are not allowed"));
            continue;
        }
        if ft.is_dir() {
            walk(rootfs, &path, out);
        } else if !ALLOWED.iter().any(|a| inside.starts_with(a)) {
            out.push(format!("path {inside:?} is not allowed in extensions"));
        }
    }
}
