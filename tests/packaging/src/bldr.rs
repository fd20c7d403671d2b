//! A bldr recipe (`pkg.yaml`) as bldr reads it, for the recipe this project
//! contributes to siderolabs/extensions. The types and checks follow
//! siderolabs/bldr v0.6.3 (94ff870, the version siderolabs/extensions'
//! Pkgfile pins), internal/pkg/types/v1alpha2: pkg.go (`Pkg`,
//! `Pkg.Validate`), steps.go (`Step`), deps.go (`Dependency`), source.go
//! (`Source`, `Sources.Validate`), sbom.go (`SBOMStep`), types.go
//! (`Finalize`, `Install`), variant.go and network_mode.go.
//!
//! bldr ignores keys it does not know (its decoder never sets
//! KnownFields); these types refuse them, so a misspelt key is an error
//! here instead of a step silently lost there.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pkg {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub shell: Option<String>,
    #[serde(default)]
    pub build_platform: Option<String>,
    /// Alpine package names (`apk add`).
    #[serde(default)]
    pub install: Vec<String>,
    #[serde(default)]
    pub dependencies: Vec<Dependency>,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub finalize: Vec<Finalize>,
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub stage: Option<String>,
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub platform: Option<String>,
    #[serde(default)]
    pub runtime: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Step {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cache_paths: Vec<String>,
    #[serde(default)]
    pub sources: Vec<Source>,
    #[serde(default)]
    pub prepare: Vec<String>,
    #[serde(default)]
    pub build: Vec<String>,
    #[serde(default)]
    pub install: Vec<String>,
    #[serde(default)]
    pub test: Vec<String>,
    #[serde(default)]
    pub sbom: Option<SbomStep>,
    /// `none` (the zero value, bldr's default), `default` or `host`.
    #[serde(default)]
    pub network: Option<String>,
}

impl Step {
    /// The network the step runs with: bldr's default is none.
    pub fn network(&self) -> &str {
        self.network.as_deref().unwrap_or("none")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub destination: String,
    #[serde(default)]
    pub sha256: String,
    #[serde(default)]
    pub sha512: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SbomStep {
    #[serde(default)]
    pub output_path: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub cpes: Vec<String>,
    #[serde(default)]
    pub purl: String,
    #[serde(default)]
    pub licenses: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finalize {
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
}

/// A recipe directory's vars.yaml.
pub fn vars(dir: &std::path::Path) -> Result<HashMap<String, String>, String> {
    let path = dir.join("vars.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The recipe as bldr reads it: its vars.yaml, ARCH as bldr sets it
/// (x86_64), the given overrides, then pkg.yaml rendered and decoded.
pub fn recipe(dir: &std::path::Path, overrides: &HashMap<String, String>) -> Result<Pkg, String> {
    let mut vars = vars(dir)?;
    vars.insert("ARCH".into(), "x86_64".into());
    vars.extend(overrides.clone());
    let path = dir.join("pkg.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_norway::from_str(&render(&text, &vars)?).map_err(|e| format!("{}: {e}", path.display()))
}

/// Renders bldr's Go templates the recipe uses: `{{ .NAME }}` from `vars`
/// (bldr merges vars.yaml files parent directory first, and sets ARCH).
/// A variable without a value is an error: Go's text/template would write
/// `<no value>` into the recipe.
pub fn render(text: &str, vars: &HashMap<String, String>) -> Result<String, String> {
    let re = regex::Regex::new(r"\{\{\s*\.([A-Za-z0-9_]+)\s*\}\}").map_err(|e| e.to_string())?;
    let mut missing = Vec::new();
    let out = re.replace_all(text, |c: &regex::Captures<'_>| match vars.get(&c[1]) {
        Some(v) => v.clone(),
        None => {
            missing.push(c[1].to_string());
            String::new()
        }
    });
    if !missing.is_empty() {
        return Err(format!("no value for {missing:?}"));
    }
    if out.contains("{{") {
        return Err("a template this renderer does not know is left".into());
    }
    Ok(out.into_owned())
}

/// What bldr's validation refuses, in its own words (pkg.go `Validate`,
/// deps.go, source.go `Sources.Validate`, variant.go, network_mode.go).
pub fn problems(pkg: &Pkg) -> Vec<String> {
    let mut out = Vec::new();
    if pkg.name.is_empty() {
        out.push("package name can't be empty".into());
    }
    match pkg.variant.as_deref() {
        None => out.push("variant should be set".into()),
        Some("alpine" | "scratch") => {}
        Some(v) => out.push(format!("unknown variant {v:?}")),
    }
    if !pkg.steps.is_empty() && pkg.finalize.is_empty() {
        out.push("finalize steps are missing, this is going to lead to empty build".into());
    }
    for d in &pkg.dependencies {
        match (&d.image, &d.stage) {
            (Some(_), Some(_)) => out.push("dependency can't have both image & stage set".into()),
            (None, None) => {
                out.push("either image or stage should be set for the dependency".into())
            }
            _ => {}
        }
    }
    for s in &pkg.steps {
        if let Some(n) = &s.network
            && !["none", "default", "host"].contains(&n.as_str())
        {
            out.push(format!("unknown networkmode {n:?}"));
        }
        for src in &s.sources {
            if src.url.is_empty() {
                out.push("source.url can't be empty".into());
            }
            if src.destination.is_empty() {
                out.push("source.destination can't be empty".into());
            }
            if src.sha256.is_empty() {
                out.push("source.sha256 can't be empty".into());
            } else if src.sha256.len() != 64 {
                out.push("source.sha256 should be 64 chars long".into());
            }
            if src.sha512.is_empty() {
                out.push("source.sha512 can't be empty".into());
            } else if src.sha512.len() != 128 {
                out.push("source.sha512 should be 128 chars long".into());
            }
        }
    }
    out
}
