//! Checks of what the driver ships, by the rules of its targets.

pub mod bldr;
pub mod chroot;
pub mod environment;
pub mod observability;
pub mod talos;

/// The repository root (this crate is at `tests/packaging`).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
