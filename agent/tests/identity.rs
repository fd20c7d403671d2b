//! The node plugin answers Identity, and its Probe follows hostd's health.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::{Path, PathBuf};
use std::process::Command;

use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use testkit::process::Proc;
use tonic::transport::Channel;

fn spawn(bin: &str, args: &[&str], log: &Path) -> Proc {
    let name = Path::new(bin).file_name().unwrap().to_string_lossy();
    Proc::spawn(&name, bin, args, log).unwrap()
}

async fn wait_for(path: &Path) {
    testkit::wait_for(path).await.unwrap();
}

async fn connect(socket: PathBuf) -> IdentityClient<Channel> {
    wait_for(&socket).await;
    let channel = proxmox_csi_common::client::unix_channel(socket.clone())
        .await
        .unwrap();
    IdentityClient::new(channel)
}

#[tokio::test]
async fn probe_is_ready_only_while_hostd_answers() {
    let dir = tempfile::tempdir().unwrap();
    let hostd_sock = dir.path().join("hostd.sock");
    let csi_sock = dir.path().join("csi.sock");
    let health = dir.path().join("health.json");
    let hostd_sock_s = hostd_sock.to_str().unwrap().to_string();
    let hostd_args = [
        "--socket",
        hostd_sock_s.as_str(),
        "--health-file",
        health.to_str().unwrap(),
        "--kubelet-root",
        dir.path().to_str().unwrap(),
    ];
    let hostd_bin =
        env!("CARGO_BIN_EXE_proxmox-csi-node").replace("proxmox-csi-node", "proxmox-csi-hostd");
    assert!(
        Path::new(&hostd_bin).exists(),
        "build hostd first: {hostd_bin}"
    );
    let hostd = spawn(&hostd_bin, &hostd_args, &dir.path().join("hostd.log"));
    wait_for(&hostd_sock).await;
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&hostd_sock).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o660);

    // The Go driver's node arguments (docs/deploy manifests, Helm chart:
    // `-v=5 --csi-address=… --node-id=$(NODE_NAME)`) with ours.
    let _agent = spawn(
        env!("CARGO_BIN_EXE_proxmox-csi-node"),
        &[
            "-v=5",
            &format!("--csi-address=unix://{}", csi_sock.display()),
            "--node-id=worker-1",
            "-logtostderr=true",
            "--hostd-socket",
            &hostd_sock_s,
            "--region",
            "r1",
            "--zone",
            "pve1",
        ],
        &dir.path().join("agent.log"),
    );
    let mut client = connect(csi_sock).await;
    let info = client
        .get_plugin_info(callers::identity::get_plugin_info())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.proxmox.sinextra.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let probe = client
        .probe(callers::identity::probe())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    // hostd writes its health file for `talosctl read`.
    wait_for(&health).await;
    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(&health).unwrap()).unwrap();
    assert_eq!(h["version"], env!("CARGO_PKG_VERSION"));

    drop(hostd);
    let probe = client
        .probe(callers::identity::probe())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false));
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    assert!(
        log.contains("probe: not ready: hostd did not answer Health"),
        "{log}"
    );
    assert!(log.contains("-logtostderr=true: klog's"), "{log}");
}

#[test]
fn every_binary_reports_its_version() {
    let node = env!("CARGO_BIN_EXE_proxmox-csi-node");
    for bin in ["proxmox-csi-node", "proxmox-csi-hostd"] {
        let path = node.replace("proxmox-csi-node", bin);
        let out = Command::new(&path).arg("--version").output().unwrap();
        assert!(out.status.success(), "{bin}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{bin} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

/// hostd refuses callers outside its allow-list (SO_PEERCRED), and the
/// unprivileged agent (uid 65534) is let in once its uid is allowed.
#[tokio::test]
async fn hostd_checks_the_callers_credentials() {
    testkit::require_root!();
    for (allowed, want_ready) in [("12345", false), ("65534", true)] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let hostd_sock = dir.path().join("hostd.sock");
        let csi_sock = dir.path().join("csi.sock");
        let hostd_bin =
            env!("CARGO_BIN_EXE_proxmox-csi-node").replace("proxmox-csi-node", "proxmox-csi-hostd");
        let _hostd = spawn(
            &hostd_bin,
            &[
                "--socket",
                hostd_sock.to_str().unwrap(),
                "--socket-mode",
                "666",
                "--allow-uid",
                allowed,
                "--kubelet-root",
                dir.path().to_str().unwrap(),
                "--health-file",
                dir.path().join("health.json").to_str().unwrap(),
            ],
            &dir.path().join("hostd.log"),
        );
        wait_for(&hostd_sock).await;
        let _agent = spawn(
            "setpriv",
            &[
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                env!("CARGO_BIN_EXE_proxmox-csi-node"),
                "--csi-address",
                &format!("unix://{}", csi_sock.display()),
                "--hostd-socket",
                hostd_sock.to_str().unwrap(),
                "--node-id",
                "worker-1",
                "--region",
                "r1",
                "--zone",
                "pve1",
            ],
            &dir.path().join("agent.log"),
        );
        let mut client = connect(csi_sock).await;
        let probe = client
            .probe(callers::identity::probe())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(probe.ready, Some(want_ready), "allowed uid {allowed}");
        if !want_ready {
            let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
            assert!(
                log.contains("caller uid 65534 gid 65534 is not allowed"),
                "{log}"
            );
        }
    }
}
