//! The chart's alerts under Prometheus's own rule engine (promtool, from
//! Debian's prometheus package: scripts/pytools.sh), fed with what the
//! controller binary really serves. deploy/check.py holds the rendered
//! PrometheusRule's spec to `files/alerts.yaml` and the PodMonitor to the
//! ports named here; this test evaluates that file.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use packaging::observability::{self, Sample};
use packaging::{repo_root, tools_dir};
use testkit::process::Proc;

/// The labels prometheus-operator gives a PodMonitor's targets
/// (pkg/prometheus/promcfg.go generatePodMonitorConfig: namespace, pod,
/// container, endpoint (the port's name), job `<namespace>/<name>`), with
/// an instance, for the chart installed as proxmox-csi-plugin in
/// csi-proxmox.
fn target(pod: &str, container: &str, port: u16) -> Vec<(String, String)> {
    [
        ("namespace", "csi-proxmox".to_string()),
        ("pod", pod.to_string()),
        ("container", container.to_string()),
        ("endpoint", "metrics".to_string()),
        ("job", "csi-proxmox/proxmox-csi-plugin".to_string()),
        ("instance", format!("10.244.1.7:{port}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// promtool's `input_series` for each served sample with the target's
/// labels added, holding its value for `minutes`.
fn input_series(samples: &[Sample], target: &[(String, String)], minutes: u32) -> String {
    let mut out = String::new();
    for (name, labels, value) in samples {
        let labels: Vec<String> = labels
            .iter()
            .chain(target)
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        let series = format!("{name}{{{}}}", labels.join(","));
        // Single quotes keep YAML from reading the label quotes; a quote
        // inside is doubled.
        writeln!(
            out,
            "      - series: '{}'\n        values: '{value}+0x{minutes}'",
            series.replace('\'', "''")
        )
        .unwrap();
    }
    out
}

/// No alert at 5 minutes (the rule's `for` is 10).
const QUIET_AT_5M: &str =
    "      - {eval_time: 5m, alertname: ProxmoxCSIControllerAbsent, exp_alerts: []}\n";

/// The alert at 15 minutes, naming the controller.
const FIRING_AT_15M: &str = "      - eval_time: 15m\n        alertname: ProxmoxCSIControllerAbsent\n        \
     exp_alerts:\n          - exp_labels: {severity: critical, component: controller}\n";

/// Runs promtool's rule unit test of `cases` (its `alert_rule_test` list)
/// over the `series` scraped, against the chart's alerts; its verdict and
/// output.
fn promtool(dir: &Path, series: &str, cases: &str) -> (bool, String) {
    let body =
        format!("  - interval: 1m\n    input_series:\n{series}    alert_rule_test:\n{cases}");
    let file = dir.join("alerts_test.yaml");
    let rules = repo_root().join("deploy/helm/proxmox-csi-plugin/files/alerts.yaml");
    std::fs::write(
        &file,
        format!(
            "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n{body}",
            rules.display()
        ),
    )
    .unwrap();
    let out = Command::new(tools_dir().join("prometheus/usr/bin/promtool"))
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (scripts/pytools.sh extracts it)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn controller_absent_fires_only_when_no_controller_is_scraped() {
    let sim = testkit::sim::plain(&testkit::sim::storage_cluster(
        "local-lvm",
        "lvmthin",
        100 << 30,
        &["pve1", "pve2"],
    ))
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cloud.yaml"), testkit::sim::config_of(&sim)).unwrap();
    let [port] = testkit::free_ports::<1>().unwrap();
    let log = dir.path().join("controller.log");
    let socket = dir.path().join("csi.sock");
    let _controller = Proc::spawn(
        "controller",
        testkit::bin("proxmox-csi-controller"),
        &[
            format!("--csi-address=unix://{}", socket.display()),
            format!("--cloud-config={}", dir.path().join("cloud.yaml").display()),
            format!("--metrics-address=127.0.0.1:{port}"),
        ],
        &log,
    )
    .unwrap();
    testkit::wait_for(&socket).await.unwrap();
    let mut served = Err(String::new());
    for _ in 0..50 {
        served = observability::scrape(port);
        if served.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served = served.unwrap();
    let mut exposed = observability::Exposed::default();
    exposed.add(&served).unwrap();
    assert_eq!(
        exposed.target_label_clashes(),
        Vec::<String>::new(),
        "labels Prometheus renames when scraping through prometheus-operator"
    );
    let controller = observability::samples(&served).unwrap();
    assert!(
        controller
            .iter()
            .any(|(n, l, _)| n == "proxmox_csi_build_info"
                && l.contains(&("component".into(), "controller".into()))),
        "the controller serves no build_info: {controller:?}"
    );

    // A correct install: the controller's pod is scraped through the
    // PodMonitor. No alert, before or after the rule's `for`.
    let scraped = input_series(
        &controller,
        &target(
            "proxmox-csi-plugin-controller-6d9f7c-x2x8q",
            "proxmox-csi-plugin-controller",
            port,
        ),
        30,
    );
    let quiet_at_25m = QUIET_AT_5M.replace("5m", "25m");
    let (ok, out) = promtool(
        dir.path(),
        &scraped,
        &format!("{QUIET_AT_5M}{quiet_at_25m}"),
    );
    assert!(ok, "the alert fires on a correct install:\n{out}");
    // The test can fail: promtool refuses the alert on that install.
    let (ok, _) = promtool(dir.path(), &scraped, FIRING_AT_15M);
    assert!(!ok, "promtool accepted an alert that cannot fire");

    // Only a node plugin scraped: the alert fires once its 10 minutes
    // have passed, naming the controller, and not before.
    let node: Vec<Sample> = controller
        .iter()
        .filter(|(n, _, _)| n == "proxmox_csi_build_info")
        .map(|(n, l, v)| {
            let l = l
                .iter()
                .map(|(k, val)| {
                    let val = if k == "component" { "node" } else { val };
                    (k.clone(), val.to_string())
                })
                .collect();
            (n.clone(), l, v.clone())
        })
        .collect();
    let scraped = input_series(
        &node,
        &target(
            "proxmox-csi-plugin-node-7xkq2",
            "proxmox-csi-plugin-node",
            8081,
        ),
        30,
    );
    let annotations = "            exp_annotations:\n              \
        summary: No Proxmox CSI controller is scraped\n              \
        description: Volumes are neither created, attached nor deleted while no controller runs.\n";
    let (ok, out) = promtool(
        dir.path(),
        &scraped,
        &format!("{QUIET_AT_5M}{FIRING_AT_15M}{annotations}"),
    );
    assert!(ok, "the alert does not fire without a controller:\n{out}");
}
