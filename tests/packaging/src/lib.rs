//! Checks of what the driver ships, by the rules of its targets.

pub mod bldr;
pub mod chroot;
pub mod environment;
pub mod observability;
pub mod talos;

/// The repository root (this crate is at `tests/packaging`).
/// The release: the crate's version, the images' tag and the chart's appVersion.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The images `make images` builds (scripts/images.sh).
pub const IMAGES: [&str; 4] = [
    "proxmox-csi-controller",
    "proxmox-csi-node",
    "proxmox-csi-hostd",
    "proxmox-csi-hostd-talos",
];

/// Where scripts/pytools.sh installs the checks' tools
/// (`PROXMOX_CSI_TOOLS`, by default /opt/proxmox-csi-tools).
pub fn tools_dir() -> std::path::PathBuf {
    std::env::var_os("PROXMOX_CSI_TOOLS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/opt/proxmox-csi-tools".into())
}

pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
