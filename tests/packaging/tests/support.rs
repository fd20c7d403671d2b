//! docs/support.md's table against what the code and the artifacts hold:
//! the support constants (`common/src/support.rs`), the chart's
//! `kubeVersion`, the Kubernetes API the driver is built against, both
//! Talos extension manifests, the images' environment and the release
//! workflow's architectures.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::BTreeMap;

use packaging::repo_root;
use proxmox_csi_common::support;
use serde_norway::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The first table of docs/support.md: component → supported.
fn table() -> BTreeMap<String, String> {
    read("docs/support.md")
        .lines()
        .skip_while(|l| !l.starts_with("| component"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (cells[0].to_string(), cells[1].to_string())
        })
        .collect()
}

#[test]
fn the_support_table_is_what_the_code_and_the_artifacts_hold() {
    let t = table();
    assert_eq!(
        t.keys().collect::<Vec<_>>(),
        ["Architectures", "Kubernetes", "Proxmox VE", "Talos"],
        "{t:?}"
    );

    assert_eq!(t["Proxmox VE"], support::proxmox_supported_text());

    let (lo, hi) = support::KUBERNETES_MINORS;
    assert_eq!(t["Kubernetes"], format!("1.{lo}–1.{hi}"));
    let chart = yaml("deploy/helm/proxmox-csi-plugin/Chart.yaml");
    assert_eq!(
        chart["kubeVersion"].as_str(),
        Some(format!(">= 1.{lo}.0-0").as_str()),
        "the chart's kubeVersion"
    );
    let cargo = read("Cargo.toml");
    let k8s = cargo
        .lines()
        .find(|l| l.starts_with("k8s-openapi"))
        .unwrap();
    assert!(
        k8s.contains(&format!("\"v1_{hi}\"")),
        "the driver is built against another Kubernetes API than 1.{hi}: {k8s}"
    );

    assert_eq!(t["Talos"], format!("{} and later", support::TALOS_MIN));
    let lower_bound = format!(">= {}", support::TALOS_MIN);
    for manifest in [
        "talos-extension/manifest.yaml",
        "talos-extension/siderolabs/storage/proxmox-csi-hostd/manifest.yaml.tmpl",
    ] {
        // The template's `{{ … }}` values are quoted strings: plain YAML.
        let m = yaml(manifest);
        assert_eq!(
            m["metadata"]["compatibility"]["talos"]["version"].as_str(),
            Some(lower_bound.as_str()),
            "{manifest}"
        );
    }

    assert_eq!(t["Architectures"], support::ARCHITECTURES.join(", "));
    let env_arch: Vec<String> = read("deploy/images/environment.list")
        .lines()
        .filter_map(|l| l.strip_prefix("architectures "))
        .flat_map(|a| a.split_whitespace().map(str::to_string))
        .collect();
    assert_eq!(env_arch, support::ARCHITECTURES, "environment.list");
    let workflow = yaml(".github/workflows/release.yml");
    let matrix: Vec<&str> = workflow["jobs"]["build"]["strategy"]["matrix"]["include"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| e["arch"].as_str().unwrap())
        .collect();
    assert_eq!(
        matrix,
        support::ARCHITECTURES,
        "the release workflow's matrix"
    );
}
