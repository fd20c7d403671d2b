//! The Kubernetes deployment: `deploy/check.py` renders the kustomize base
//! and the Helm chart, compares them, validates every object against the
//! Kubernetes schema and scans the node plugin's pod (see its docstring).
//! Its tools live in the virtualenv `scripts/pytools.sh` makes.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::process::Command;

use packaging::repo_root;

#[test]
fn deployment_renders_validates_and_keeps_the_node_plugin_unprivileged() {
    let python = packaging::tools_dir().join("bin/python");
    testkit::require!(
        python.is_file(),
        format!("{} (scripts/pytools.sh)", python.display())
    );
    let out = Command::new(&python)
        .arg(repo_root().join("deploy/check.py"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    let last = text.lines().last().unwrap_or_default();
    assert!(
        out.status.success() && last.ends_with(" passed, 0 failed"),
        "deploy/check.py: {last}"
    );
    let passed: u32 = last
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 60, "only {passed} checks ran");
    for must in [
        "the chart and the base render the same objects",
        "node plugin pod: checkov finds no privilege",
        "checkov catches each of those in a privileged pod",
    ] {
        assert!(
            text.contains(&format!("ok    {must}")),
            "{must} did not pass"
        );
    }
}
