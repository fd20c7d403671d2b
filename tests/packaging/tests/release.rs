//! `make release` (scripts/release.sh) from the binaries `make images`
//! built: every file a release publishes is there and in SHA256SUMS; the
//! chart is packaged under its name and version; the rendered manifests,
//! installed into kubesim, run exactly the images built, at this version,
//! besides the pinned CSI sidecars; pvecsictl answers with its version.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use packaging::{IMAGES, VERSION, repo_root};

/// The release's recipe for siderolabs/extensions: no placeholder left,
/// the source it fetches is the release's tarball, by its checksums, and
/// that tarball holds what the recipe builds from.
fn the_siderolabs_recipe_is_complete(dir: &std::path::Path) {
    use sha2::Digest;
    let recipe = dir.join("siderolabs/storage/proxmox-csi-hostd");
    let vars = packaging::bldr::vars(&recipe).unwrap();
    for (k, v) in &vars {
        assert!(!v.contains('<'), "vars.yaml {k} is a placeholder: {v}");
    }
    assert_eq!(vars["VERSION"], VERSION);
    let cargo = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains(&format!(
            "repository = \"https://github.com/{}\"",
            vars["PROXMOX_CSI_REPOSITORY"]
        )),
        "the recipe fetches from {}, not the workspace's repository",
        vars["PROXMOX_CSI_REPOSITORY"]
    );
    let name = format!("proxmox-csi-{VERSION}.tar.gz");
    let tarball = std::fs::read(dir.join(&name)).unwrap();
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        vars["PROXMOX_CSI_SHA256"],
        hex(&sha2::Sha256::digest(&tarball))
    );
    assert_eq!(
        vars["PROXMOX_CSI_SHA512"],
        hex(&sha2::Sha512::digest(&tarball))
    );

    let arm = std::collections::HashMap::from([("ARCH".to_string(), "aarch64".to_string())]);
    let pkg = packaging::bldr::recipe(&recipe, &arm).unwrap();
    let problems = packaging::bldr::problems(&pkg);
    assert!(
        problems.is_empty(),
        "bldr refuses the release's recipe: {problems:?}"
    );
    let source = &pkg
        .steps
        .iter()
        .flat_map(|s| &s.sources)
        .next()
        .unwrap()
        .url;
    assert_eq!(
        source,
        &format!(
            "https://github.com/{}/releases/download/v{VERSION}/{name}",
            vars["PROXMOX_CSI_REPOSITORY"]
        )
    );
    let listing = Command::new("tar")
        .args(["-tzf"])
        .arg(dir.join(&name))
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for file in [
        "Cargo.lock",
        "hostd/Cargo.toml",
        "talos-extension/proxmox-csi-hostd.yaml",
    ] {
        assert!(
            listing
                .lines()
                .any(|l| l == format!("proxmox-csi-{VERSION}/{file}")),
            "the source tarball has no {file}"
        );
    }
}

/// The plural kubesim stores a kind under, as the API server names it.
fn plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if lower.ends_with('s') {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    }
}

#[tokio::test]
async fn a_release_holds_what_it_publishes_and_its_manifests_run_the_images_built() {
    let root = repo_root();
    let built = root.join("target/images-build/release/pvecsictl");
    testkit::require!(
        root.join("target/images/proxmox-csi-controller/index.json")
            .is_file()
            && built.is_file(),
        "the binaries and layouts of `make images`"
    );
    // The image build sets file ownership.
    testkit::require_root!();
    let out = Command::new(root.join("scripts/release.sh"))
        .args([VERSION, "--prebuilt"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "release.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = root.join(format!("target/release/v{VERSION}"));

    // Every file, checked against SHA256SUMS; nothing left out of it.
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let mut listed: Vec<&str> = sums
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    listed.sort();
    let mut want: Vec<String> = IMAGES.iter().map(|i| format!("{i}.cdx.json")).collect();
    want.extend([
        format!("proxmox-csi-plugin-{VERSION}.tgz"),
        "proxmox-csi.yaml".into(),
        "pvecsictl-linux-amd64".into(),
        format!("proxmox-csi-{VERSION}.tar.gz"),
    ]);
    want.sort();
    assert_eq!(listed, want);
    the_siderolabs_recipe_is_complete(&dir);
    let check = Command::new("sha256sum")
        .args(["--check", "--quiet", "SHA256SUMS"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");

    // The images, each an index tagged with the version.
    for name in IMAGES {
        let index: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("images").join(name).join("index.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"], VERSION,
            "{name}: {index}"
        );
    }

    // The chart, as `helm package` lays it out.
    let listing = Command::new("tar")
        .arg("tzf")
        .arg(dir.join(format!("proxmox-csi-plugin-{VERSION}.tgz")))
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing
            .lines()
            .any(|l| l == "proxmox-csi-plugin/Chart.yaml")
            && listing
                .lines()
                .all(|l| l.starts_with("proxmox-csi-plugin/")),
        "{listing}"
    );

    // The manifests, installed: every object stored and read back, every
    // container image one of ours at this version or a pinned sidecar.
    let kube = kubesim::start().await.unwrap();
    let text = std::fs::read_to_string(dir.join("proxmox-csi.yaml")).unwrap();
    let mut images = Vec::new();
    let mut kinds = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let obj: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
        let kind = obj["kind"].as_str().unwrap().to_string();
        let (ns, name) = (
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            obj["metadata"]["name"].as_str().unwrap().to_string(),
        );
        kube.put(&plural(&kind), obj.clone());
        let stored = kube.get(&plural(&kind), &ns, &name).unwrap();
        for c in stored["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            images.push(c["image"].as_str().unwrap().to_string());
        }
        kinds.push(kind);
    }
    for kind in ["Namespace", "CSIDriver", "Deployment", "DaemonSet"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind}: {kinds:?}");
    }
    let ours: Vec<&String> = images
        .iter()
        .filter(|i| !i.starts_with("registry.k8s.io/sig-storage/"))
        .collect();
    assert_eq!(ours.len(), 2, "{images:?}");
    for image in ours {
        let (repo, tag) = image.rsplit_once(':').unwrap();
        let name = repo.rsplit('/').next().unwrap();
        assert_eq!(tag, VERSION, "{image}");
        assert!(
            dir.join("images").join(name).join("index.json").is_file(),
            "{image} is not an image of the release"
        );
    }
    assert!(
        images
            .iter()
            .filter(|i| i.starts_with("registry.k8s.io/"))
            .all(|i| i.rsplit_once(':').is_some_and(|(_, t)| t.starts_with('v'))),
        "{images:?}"
    );

    // pvecsictl, the binary attached to the release.
    let v = Command::new(dir.join("pvecsictl-linux-amd64"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        format!("pvecsictl {VERSION}")
    );
}
