//! What a release supports (docs/support.md): the Proxmox VE, Kubernetes and
//! Talos versions it is tested against and the architectures it ships.
//! `tests/packaging/tests/support.rs` holds the table in docs/support.md,
//! the chart, the Talos manifests and the release workflow to these values.

/// Proxmox VE major releases: pvesim models qemu-server of both (8.4's last
/// and 9.x), and the controller warns about a cluster outside them.
pub const PROXMOX_VE_MAJORS: &[u32] = &[8, 9];

/// Kubernetes minor versions (1.x): from the first with
/// VolumeAttributesClass (beta, 1.31) to the API the driver is built
/// against (k8s-openapi's `v1_34`).
pub const KUBERNETES_MINORS: (u32, u32) = (31, 34);

/// The oldest Talos release the extension declares itself compatible with
/// (its manifest's `compatibility.talos.version`).
pub const TALOS_MIN: &str = "v1.10.0";

/// The architectures of the images and binaries a release publishes.
pub const ARCHITECTURES: &[&str] = &["amd64", "arm64"];

/// The major release in a Proxmox version string (`9.0.3`, `8.4-1`).
pub fn proxmox_major(release: &str) -> Option<u32> {
    release.split(['.', '-']).next()?.trim().parse().ok()
}

/// Whether a Proxmox VE release is one this driver supports; `None` when
/// the string is not a version.
pub fn proxmox_supported(release: &str) -> Option<bool> {
    proxmox_major(release).map(|m| PROXMOX_VE_MAJORS.contains(&m))
}

/// The supported majors as operators write them: `8.x, 9.x`.
pub fn proxmox_supported_text() -> String {
    PROXMOX_VE_MAJORS
        .iter()
        .map(|m| format!("{m}.x"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxmox_releases_are_read_by_their_major() {
        assert_eq!(proxmox_supported("9.0.3"), Some(true));
        assert_eq!(proxmox_supported("8.4.10"), Some(true));
        assert_eq!(proxmox_supported("7.4-3"), Some(false));
        assert_eq!(proxmox_supported("10.0"), Some(false));
        assert_eq!(proxmox_supported("pve"), None);
        assert_eq!(proxmox_supported_text(), "8.x, 9.x");
    }
}
