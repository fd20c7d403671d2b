//! The controller binary, started with a cloud config and a unix socket,
//! answers Identity over gRPC; Probe reflects whether Proxmox answers.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proxmox_csi_proto::csi::v1::identity_client::IdentityClient;
use pvesim::{Sim, State};
use testkit::process::Proc;
use testkit::sim::SECRET as TOKEN_SECRET;
use tonic::transport::Channel;

fn state() -> State {
    State::from_yaml(&format!(
        "users:\n  - userid: kubernetes-csi@pve\n    tokens:\n      - name: csi\n        secret: {TOKEN_SECRET}\n"
    ))
    .unwrap()
}

struct Controller {
    proc: Proc,
    socket: PathBuf,
    log: PathBuf,
}

fn start_controller(dir: &Path, config: &str, extra: &[&str]) -> Controller {
    let socket = dir.join("csi.sock");
    let cfg = dir.join("cloud-config.yaml");
    let mut args = vec![
        "--csi-address".to_string(),
        format!("unix://{}", socket.display()),
        "--cloud-config".into(),
        cfg.display().to_string(),
        "--log-level".into(),
        "debug".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    start_controller_with(dir, config, &args)
}

/// The controller with exactly `args`; the cloud config is written to
/// `<dir>/cloud-config.yaml` and the socket is `<dir>/csi.sock`.
fn start_controller_with(dir: &Path, config: &str, args: &[String]) -> Controller {
    std::fs::write(dir.join("cloud-config.yaml"), config).unwrap();
    let log = dir.join("controller.log");
    let proc = Proc::spawn(
        "controller",
        env!("CARGO_BIN_EXE_proxmox-csi-controller"),
        args,
        &log,
    )
    .unwrap();
    Controller {
        proc,
        socket: dir.join("csi.sock"),
        log,
    }
}

async fn connect(socket: &Path) -> IdentityClient<Channel> {
    testkit::wait_for(socket).await.unwrap();
    let socket = socket.to_path_buf();
    let channel = proxmox_csi_common::client::unix_channel(socket.clone())
        .await
        .unwrap();
    IdentityClient::new(channel)
}

/// The token's cloud config on `url`, with `secret` in place of its own.
fn cluster_config(url: &str, ca: Option<&Path>, secret: &str) -> String {
    testkit::sim::cloud_config(url, ca, "").replace(TOKEN_SECRET, secret)
}

#[tokio::test]
async fn answers_plugin_info_and_a_real_probe_over_tls() {
    let (sim, _dir, ctl) = over_tls(
        state(),
        &[
            "--driver-name",
            "csi.example.test",
            "--cluster-check-interval",
            "1",
        ],
    )
    .await;
    let mut client = connect(&ctl.socket).await;

    let info = client
        .get_plugin_info(callers::identity::get_plugin_info())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.example.test");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));

    let caps = client
        .get_plugin_capabilities(callers::identity::get_plugin_capabilities())
        .await
        .unwrap()
        .into_inner();
    assert!(!caps.capabilities.is_empty());

    let probe = client
        .probe(callers::identity::probe())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    // Proxmox goes away: the log says so, with the region and the cause;
    // the controller stays ready (a region's outage is no restart).
    drop(sim);
    let log = log_with(&ctl.log, "Proxmox cluster not reachable").await;
    assert!(
        log.contains("region=region-1") && log.contains("Proxmox cluster region-1: GET /version"),
        "{log}"
    );
    let probe = client
        .probe(callers::identity::probe())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    assert!(
        !log.contains(TOKEN_SECRET),
        "the token secret reached the log:\n{log}"
    );
}

/// A cluster on a Proxmox release outside docs/support.md is served, and
/// the log says once which release and what is supported; a supported one
/// says nothing.
#[tokio::test]
async fn a_proxmox_release_outside_the_support_matrix_is_warned_about_once() {
    let mut old = state();
    old.version = "7.4-3".into();
    let (_sim, _dir, ctl) = over_tls(old, &["--cluster-check-interval", "1"]).await;
    let text = "Proxmox VE release outside this driver's support";
    let log = log_with(&ctl.log, text).await;
    assert!(
        log.contains("release=7.4-3") && log.contains("supported=8.x, 9.x"),
        "{log}"
    );
    // Three more checks, no second warning.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let log = std::fs::read_to_string(&ctl.log).unwrap();
    assert_eq!(log.matches(text).count(), 1, "{log}");

    let (_sim, _dir, ctl) = over_tls(state(), &["--cluster-check-interval", "1"]).await;
    let mut client = connect(&ctl.socket).await;
    let probe = client.probe(callers::identity::probe()).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = std::fs::read_to_string(&ctl.log).unwrap();
    assert!(!log.contains(text), "{log}");
}

/// pvesim serving `state` over TLS, and the controller started with
/// `extra` on it, trusting its CA; the directory holds the socket and log.
async fn over_tls(
    state: State,
    extra: &[&str],
) -> (pvesim::Running, tempfile::TempDir, Controller) {
    let sim = Sim::new(state).start("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, sim.ca_pem.as_ref().unwrap()).unwrap();
    let ctl = start_controller(
        dir.path(),
        &cluster_config(&sim.api_url(), Some(&ca), TOKEN_SECRET),
        extra,
    );
    (sim, dir, ctl)
}

/// The log once it holds `text` (the clusters are checked apart from the
/// calls), within 10 s.
async fn log_with(log: &Path, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = std::fs::read_to_string(log).unwrap_or_default();
        if now.contains(text) {
            return now;
        }
        assert!(Instant::now() < deadline, "no {text:?} in the log:\n{now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_wrong_token_or_an_untrusted_tls_is_logged_and_probe_stays_ready() {
    let sim = Sim::new(state()).start("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, sim.ca_pem.as_ref().unwrap()).unwrap();

    let wrong = tempfile::tempdir().unwrap();
    let ctl = start_controller(
        wrong.path(),
        &cluster_config(&sim.api_url(), Some(&ca), "not-the-secret"),
        &[],
    );
    let mut client = connect(&ctl.socket).await;
    let probe = client
        .probe(callers::identity::probe())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    log_with(&ctl.log, "GET /version: Authentication failed!").await;

    // No CA given: the system roots do not trust pvesim's CA.
    let untrusted = tempfile::tempdir().unwrap();
    let ctl = start_controller(
        untrusted.path(),
        &cluster_config(&sim.api_url(), None, TOKEN_SECRET),
        &[],
    );
    let mut client = connect(&ctl.socket).await;
    let probe = client
        .probe(callers::identity::probe())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    let log = log_with(&ctl.log, "Proxmox cluster not reachable").await;
    assert!(log.contains("TLS") || log.contains("certificate"), "{log}");
}

#[tokio::test]
async fn serves_metrics_and_stops_on_sigterm() {
    let (sim, dir, port) = plain_sim_and_port().await;
    let ctl = start_controller(
        dir.path(),
        &cluster_config(&sim.api_url(), None, TOKEN_SECRET),
        &["--metrics-address", &format!("127.0.0.1:{port}")],
    );
    let mut client = connect(&ctl.socket).await;
    assert_eq!(
        client
            .probe(callers::identity::probe())
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    // A class taken with the Go driver's meaning is counted, key by key
    // (the create itself may fail on this empty cluster: the count is of
    // the class, read first).
    let channel = proxmox_csi_common::client::unix_channel(ctl.socket.clone())
        .await
        .unwrap();
    let sc = callers::provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("ssd", "yes"),
        ("tier", "gold"),
    ]);
    let claim = callers::provisioner::Claim::new("w", "w", 1 << 30);
    let _ = proxmox_csi_proto::csi::v1::controller_client::ControllerClient::new(channel)
        .create_volume(callers::provisioner::create_volume(&sc, &claim, None))
        .await;
    let body = http_get(port, "/metrics").await;
    for line in [
        "proxmox_csi_class_parameter_warnings_total{class=\"StorageClass\",key=\"ssd\",reason=\"not_a_boolean\"} 1",
        "proxmox_csi_class_parameter_warnings_total{class=\"StorageClass\",key=\"tier\",reason=\"unknown_key\"} 1",
    ] {
        assert!(body.contains(line), "{line} in\n{body}");
    }
    assert!(
        body.contains("proxmox_csi_build_info{component=\"controller\""),
        "{body}"
    );
    assert!(
        body.contains("proxmox_csi_grpc_requests_total{method=\"Probe\",code=\"Ok\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("proxmox_csi_proxmox_cluster_up{region=\"region-1\"} 1"),
        "{body}"
    );

    let status = ctl.proc.stop().await.unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!ctl.socket.exists(), "socket left behind after shutdown");
}

/// The Go driver's Helm chart (charts/proxmox-csi-plugin/templates/
/// controller-deployment.yaml, metrics enabled) passes `-v=5`,
/// `--csi-address=…`, `--cloud-config=…` and `--metrics-address=:PORT`;
/// its binary also takes klog's flags, `--kubeconfig` and `--metrics-path`
/// (cmd/controller/main.go). An image swap keeps those arguments.
#[tokio::test]
async fn starts_with_the_go_charts_arguments() {
    let (sim, dir, port) = plain_sim_and_port().await;
    // A kubeconfig naming an API server that does not answer.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
         users:\n- name: u\n  user: {}\n",
    )
    .unwrap();
    let d = dir.path().display();
    let ctl = start_controller_with(
        dir.path(),
        &cluster_config(&sim.api_url(), None, TOKEN_SECRET),
        &[
            "-v=5".into(),
            format!("--csi-address=unix://{d}/csi.sock"),
            format!("--cloud-config={d}/cloud-config.yaml"),
            format!("--metrics-address=:{port}"),
            "--metrics-path=/metrics".into(),
            "-logtostderr=true".into(),
            format!("-kubeconfig={}", kubeconfig.display()),
        ],
    );
    let mut client = connect(&ctl.socket).await;
    let probe = client.probe(callers::identity::probe()).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    assert!(
        http_get(port, "/metrics")
            .await
            .contains("proxmox_csi_build_info")
    );
    // The kubeconfig was the one read: its server is the one that failed.
    let log = log_with(&ctl.log, "server=http://127.0.0.1:9/").await;
    assert!(
        log.contains("-logtostderr=true: klog's") && log.contains("has no effect"),
        "{log}"
    );
    // -v=5 is the Go manifests' everyday level: info, not debug.
    assert!(!log.contains("DEBUG"), "{log}");
}

/// pvesim over plain HTTP, a scratch directory, and a free port for metrics.
async fn plain_sim_and_port() -> (pvesim::Running, tempfile::TempDir, u16) {
    let sim = Sim::new(state())
        .plain_http()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    (sim, tempfile::tempdir().unwrap(), port)
}

async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[test]
fn a_bad_cluster_entry_stops_startup_naming_the_entry_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = "clusters:\n  - url: https://pve1:8006/api2/json\n    token_id: a@pve!b\n    token_secret: c\n    region: r1\n  - url: https://pve2:8006/api2/json\n    token_id: a@pve!b\n    token_secret: c\n";
    let mut ctl = start_controller(dir.path(), config, &[]);
    let status = ctl.proc.wait().unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(&ctl.log).unwrap();
    assert!(
        log.contains("cluster #1: region: missing PVE region in cloud config"),
        "{log}"
    );
}
