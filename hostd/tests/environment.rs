//! hostd configured from its environment alone, as a Talos
//! ExtensionServiceConfig configures it (environment entries, no
//! arguments): socket, mode, allowed uid, health file, device events, driver
//! name and LUKS key derivation all taken from PROXMOX_CSI_HOSTD_*.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proxmox_csi_proto::hostd::v1 as pb;
use sha2::{Digest, Sha256};
use support::{NODE_PLUGIN_UID, connect_as};

#[tokio::test]
async fn every_setting_comes_from_the_environment() {
    testkit::require_root!();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("env.sock");
    let health = dir.path().join("env-health.json");
    let root = dir.path().join("kubelet");
    std::fs::create_dir_all(&root).unwrap();
    let mut hostd = Command::new(env!("CARGO_BIN_EXE_proxmox-csi-hostd"))
        .env_clear()
        .env("PROXMOX_CSI_HOSTD_SOCKET", &socket)
        .env("PROXMOX_CSI_HOSTD_SOCKET_MODE", "666")
        .env("PROXMOX_CSI_HOSTD_ALLOW_UID", NODE_PLUGIN_UID.to_string())
        .env("PROXMOX_CSI_HOSTD_HEALTH_FILE", &health)
        .env("PROXMOX_CSI_HOSTD_HEALTH_INTERVAL", "1")
        .env("PROXMOX_CSI_HOSTD_KUBELET_ROOT", &root)
        .env("PROXMOX_CSI_HOSTD_LOOP_DIR", dir.path())
        .env("PROXMOX_CSI_HOSTD_DEVICE_EVENTS", "kernel")
        .env("PROXMOX_CSI_HOSTD_DEVICE_WAIT", "3")
        .env("PROXMOX_CSI_HOSTD_DRIVER_NAME", "csi.example.org")
        .env("PROXMOX_CSI_HOSTD_LUKS_PBKDF", "pbkdf2:1000")
        .env("PROXMOX_CSI_HOSTD_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "no socket at the environment's path"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The allowed uid and the socket's mode came from the environment: the
    // node plugin's uid is served, another is refused.
    let mut plugin = connect_as(&socket, NODE_PLUGIN_UID).await;
    let h = plugin
        .health(pb::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.version, env!("CARGO_PKG_VERSION"));
    let mut other = connect_as(&socket, NODE_PLUGIN_UID - 1).await;
    let refused = other.health(pb::HealthRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    while !health.exists() {
        assert!(
            Instant::now() < deadline,
            "no health file at the environment's path"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The driver name came from the environment: kubelet's staging path of
    // that driver is this driver's, the default driver's is not.
    let vol = "region-1/pve2/local-lvm/vm-9999-pvc-env";
    let hash = format!("{:x}", Sha256::digest(vol.as_bytes()));
    let stage = |driver: &str| {
        let dir = root.join(format!("plugins/kubernetes.io/csi/{driver}/{hash}"));
        std::fs::create_dir_all(&dir).unwrap();
        support::stage_req(vol, "0x5000000000000001", &dir.join("globalmount"), "ext4")
    };
    let default = plugin
        .stage(stage("csi.proxmox.sinextra.dev"))
        .await
        .unwrap_err();
    assert!(
        default
            .message()
            .contains("is not one of kubelet's CSI paths"),
        "{default:?}"
    );
    let named = plugin.stage(stage("csi.example.org")).await.unwrap_err();
    assert!(
        !named
            .message()
            .contains("is not one of kubelet's CSI paths"),
        "{named:?}"
    );
    hostd.kill().unwrap();
    let out = hostd.wait_with_output().unwrap();
    // JSON logs, as the environment asked.
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.lines().next().is_some_and(|l| l.starts_with('{')),
        "{log}"
    );
}
