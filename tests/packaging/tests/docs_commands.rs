//! The commands README.md and docs/ show an operator, taken out of their
//! `sh` blocks and checked or run where this machine can: every file and
//! `make` target they name exists, each `helm install`/`upgrade`/`template`
//! renders the chart with the values it sets (Helm's engine, deploy/check.py),
//! each `kubectl apply -k` base renders (`kubectl kustomize`), each local
//! manifest they apply parses, and every release URL and image they name is
//! an artifact the release makes (scripts/release.sh, `make images`).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::process::Command;

use packaging::{IMAGES, VERSION, repo_root, tools_dir};
use serde_json::{Map, Value, json};

const RELEASES: &str = "https://github.com/proxmox-csi-rs/proxmox-csi/releases/download/";
const CHART: &str = "oci://ghcr.io/proxmox-csi-rs/charts/proxmox-csi-plugin";
const IMAGE_PREFIX: &str = "ghcr.io/proxmox-csi-rs/";

/// The documents an operator reads.
fn documents() -> Vec<(String, String)> {
    let root = repo_root();
    let mut out = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, std::fs::read_to_string(&p).unwrap()));
    }
    out
}

/// The commands of a document's `sh` blocks: continuation lines joined,
/// comments dropped, pipelines and `&&` lists split.
fn commands(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut cur = String::new();
    for line in md.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = match t.find(" #") {
            Some(i) => &t[..i],
            None if t.starts_with('#') => "",
            None => t,
        };
        match code.strip_suffix('\\') {
            Some(head) => cur.push_str(head),
            None => {
                cur.push_str(code);
                for part in cur.split(" | ").flat_map(|p| p.split(" && ")) {
                    if !part.trim().is_empty() {
                        out.push(part.trim().to_string());
                    }
                }
                cur.clear();
            }
        }
    }
    out
}

/// Shell words, with single and double quotes.
fn words(cmd: &str) -> Vec<String> {
    let (mut out, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in cmd.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (_, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `a.b=c` into `values`, as Helm's --set (booleans and integers typed)
/// or --set-json (the value is JSON).
fn set(values: &mut Map<String, Value>, assignment: &str, as_json: bool) {
    let (key, v) = assignment.split_once('=').unwrap();
    let v = if as_json {
        serde_json::from_str(v).unwrap_or_else(|e| panic!("--set-json {assignment}: {e}"))
    } else if let Ok(b) = v.parse::<bool>() {
        json!(b)
    } else if let Ok(n) = v.parse::<i64>() {
        json!(n)
    } else {
        json!(v)
    };
    let path: Vec<&str> = key.split('.').collect();
    let mut at = values;
    for p in &path[..path.len() - 1] {
        at = at
            .entry(p.to_string())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .unwrap();
    }
    at.insert(path[path.len() - 1].to_string(), v);
}

/// Renders the chart once per values object; the failures, by place.
fn render_all(renders: &[(String, Value)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("renders.json");
    std::fs::write(
        &input,
        serde_json::to_string(&renders.iter().map(|(_, v)| v).collect::<Vec<_>>()).unwrap(),
    )
    .unwrap();
    let script = "import json, sys\n\
        sys.path.insert(0, 'deploy')\n\
        import check\n\
        for i, values in enumerate(json.load(open(sys.argv[1]))):\n\
        \x20   try:\n\
        \x20       check.helm(values)\n\
        \x20   except Exception as e:\n\
        \x20       print(f'{i}\\t{e}'.replace('\\n', ' '))\n";
    let out = Command::new(tools_dir().join("bin/python"))
        .args(["-c", script])
        .arg(&input)
        .current_dir(repo_root())
        .output()
        .expect("the tools' Python (scripts/pytools.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let (i, e) = l.split_once('\t').unwrap();
            format!("{}: {e}", renders[i.parse::<usize>().unwrap()].0)
        })
        .collect()
}

/// What the release publishes beside its images (scripts/release.sh, on
/// each architecture of the release workflow's matrix).
fn release_files() -> Vec<String> {
    vec![
        "proxmox-csi.yaml".into(),
        format!("proxmox-csi-plugin-{VERSION}.tgz"),
        "pvecsictl-linux-amd64".into(),
        "pvecsictl-linux-arm64".into(),
        format!("proxmox-csi-{VERSION}.tar.gz"),
        "SHA256SUMS".into(),
    ]
}

#[test]
fn the_documented_commands_name_real_things_and_run() {
    let root = repo_root();
    let makefile = std::fs::read_to_string(root.join("Makefile")).unwrap();
    let mut problems = Vec::new();
    let mut renders: Vec<(String, Value)> = Vec::new();
    let (mut helm, mut kustomized, mut applied) = (0, 0, 0);
    for (doc, text) in documents() {
        // Release URLs and images wherever they are written, not only in sh.
        for url in text
            .split_whitespace()
            .filter_map(|w| w.find(RELEASES).map(|i| &w[i..]))
        {
            let url = url.trim_end_matches(|c: char| !c.is_alphanumeric());
            let file = url.rsplit('/').next().unwrap();
            let tag = url[RELEASES.len()..].split('/').next().unwrap();
            if tag != format!("v{VERSION}") || !release_files().iter().any(|f| f == file) {
                problems.push(format!(
                    "{doc}: {url} is not an artifact of release v{VERSION}"
                ));
            }
        }
        for image in text
            .split(|c: char| c.is_whitespace() || c == '`')
            .filter_map(|w| w.strip_prefix(IMAGE_PREFIX))
        {
            let (name, tag) = image.split_once(':').unwrap_or((image, ""));
            if name.starts_with("charts/") || name.contains('<') {
                continue;
            }
            if !IMAGES.contains(&name) || !(tag.is_empty() || tag.starts_with(VERSION)) {
                problems.push(format!(
                    "{doc}: {IMAGE_PREFIX}{image} is not an image the release makes"
                ));
            }
        }
        for cmd in commands(&text) {
            let w = words(&cmd);
            let place = format!("{doc}: `{cmd}`");
            for word in &w {
                let path = word.split_once('=').map_or(word.as_str(), |(_, v)| v);
                let path = path.trim_end_matches([',', ')', ';']);
                if ["deploy/", "docs/", "scripts/", "talos-extension/", "tests/"]
                    .iter()
                    .any(|p| path.starts_with(p))
                    && !path.contains('<')
                    && !root.join(path).exists()
                {
                    problems.push(format!("{place}: {path} does not exist"));
                }
            }
            match w.first().map(String::as_str) {
                Some("make") => {
                    if let Some(target) = w.get(1).filter(|t| !t.contains('='))
                        && !makefile
                            .lines()
                            .any(|l| l.starts_with(&format!("{target}:")))
                    {
                        problems.push(format!("{place}: the Makefile has no target {target}"));
                    }
                }
                Some("helm") => {
                    let mut positional = Vec::new();
                    let mut values = Map::new();
                    let mut version = None;
                    let mut i = 1;
                    while i < w.len() {
                        match w[i].as_str() {
                            "--set" => set(&mut values, &w[i + 1], false),
                            "--set-json" => set(&mut values, &w[i + 1], true),
                            "--version" => version = Some(w[i + 1].clone()),
                            "-n" | "--namespace" | "-f" | "--values" => {}
                            a if a.starts_with('-') => {
                                i += 1;
                                continue;
                            }
                            a => {
                                positional.push(a.to_string());
                                i += 1;
                                continue;
                            }
                        }
                        i += 2;
                    }
                    let sub = positional.first().map(String::as_str);
                    if !matches!(sub, Some("install" | "upgrade" | "template")) {
                        continue;
                    }
                    match positional.get(2).map(String::as_str) {
                        Some(CHART) if version.as_deref() != Some(VERSION) => problems.push(
                            format!("{place}: the release's chart without --version {VERSION}"),
                        ),
                        Some(CHART) | Some("deploy/helm/proxmox-csi-plugin") | None => {}
                        Some(other) => {
                            problems.push(format!("{place}: {other} is not this driver's chart"))
                        }
                    }
                    helm += 1;
                    renders.push((place, Value::Object(values)));
                }
                Some("kubectl") if w.get(1).map(String::as_str) == Some("apply") => {
                    let target = w.get(3).cloned().unwrap_or_default();
                    match w.get(2).map(String::as_str) {
                        Some("-k") => {
                            let out = Command::new("kubectl")
                                .args(["kustomize", &target])
                                .current_dir(&root)
                                .output()
                                .unwrap();
                            if !out.status.success() {
                                problems.push(format!(
                                    "{place}: {}",
                                    String::from_utf8_lossy(&out.stderr)
                                ));
                            }
                            kustomized += 1;
                        }
                        Some("-f") if !target.starts_with("https://") => {
                            let text =
                                std::fs::read_to_string(root.join(&target)).unwrap_or_default();
                            let docs: Vec<serde_norway::Value> =
                                serde_norway::Deserializer::from_str(&text)
                                    .map(serde::Deserialize::deserialize)
                                    .collect::<Result<_, _>>()
                                    .unwrap_or_default();
                            if docs.iter().all(|d| d["kind"].as_str().is_none()) {
                                problems.push(format!("{place}: {target} holds no object"));
                            }
                            applied += 1;
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }
    problems.extend(render_all(&renders));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The checks ran on what the install sections show.
    assert!(
        helm >= 6 && kustomized >= 1 && applied >= 2,
        "helm {helm}, kustomize {kustomized}, apply {applied}"
    );
}

#[test]
fn commands_words_and_values_are_read_as_the_shell_and_helm_read_them() {
    let cmds = commands(
        "```sh\nhelm install x deploy/helm/proxmox-csi-plugin \\\n  --set-json 'a.b={\"c.d\":\"e\"}' --set f=true # note\nmake nothing | cat\n```\n",
    );
    assert_eq!(
        cmds,
        [
            "helm install x deploy/helm/proxmox-csi-plugin --set-json 'a.b={\"c.d\":\"e\"}' --set f=true",
            "make nothing",
            "cat"
        ]
    );
    let w = words(&cmds[0]);
    assert_eq!(w[5], "a.b={\"c.d\":\"e\"}");
    let mut v = Map::new();
    set(&mut v, &w[5], true);
    set(&mut v, &w[7], false);
    assert_eq!(
        Value::Object(v),
        json!({"a": {"b": {"c.d": "e"}}, "f": true})
    );
    // A value the chart refuses fails its render, naming it.
    let failed = render_all(&[("here".into(), json!({"prometheusRule": {"enabled": true}}))]);
    assert!(
        failed.len() == 1 && failed[0].contains("metrics.type=podmonitor"),
        "{failed:?}"
    );
}
