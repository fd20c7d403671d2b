//! The OCI image layouts `make images` (scripts/images.sh) leaves in
//! target/images: each unpacked with umoci and its entrypoint run chrooted
//! (the plugins as uid 65532 with no capabilities), its config read with
//! skopeo, the extension checked by Talos's rules on what the image holds,
//! the deployment's image references matching the images, and a second
//! assembly from the same binaries giving the same digests.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::{Path, PathBuf};
use std::process::Command;

use packaging::{chroot, repo_root, talos};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const IMAGES: [&str; 4] = [
    "proxmox-csi-controller",
    "proxmox-csi-node",
    "proxmox-csi-hostd",
    "proxmox-csi-hostd-talos",
];

/// target/images, or None (and the test skipped) when `make images` has not
/// run outside CI.
fn layouts() -> Option<PathBuf> {
    let dir = repo_root().join("target/images");
    if IMAGES
        .iter()
        .all(|i| dir.join(i).join("index.json").is_file())
    {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} lacks the image layouts, and CI is set: run `make images`",
        dir.display()
    );
    eprintln!("SKIPPED: no image layouts in target/images (make images)");
    None
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The layout's manifest digest for tag VERSION.
fn digest(layout: &Path) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let m = &index["manifests"][0];
    assert_eq!(
        m["annotations"]["org.opencontainers.image.ref.name"], VERSION,
        "{index}"
    );
    m["digest"].as_str().unwrap().to_string()
}

/// The image config, as skopeo reads it from the layout.
fn config(layout: &Path) -> serde_json::Value {
    let out = Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(format!("oci:{}:{VERSION}", layout.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn unpack(layout: &Path, into: &Path) -> PathBuf {
    let status = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{VERSION}", layout.display()))
        .arg(into)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "umoci unpack {}", layout.display());
    into.join("rootfs")
}

fn run_in(root: &Path, uid: u32, gid: u32, args: &[&str]) -> (bool, String) {
    chroot::run(root, uid, gid, args).unwrap()
}

#[test]
fn each_image_holds_what_it_runs_and_says_what_it_is() {
    let Some(dir) = layouts() else { return };
    let mut configs = std::collections::HashMap::new();
    for name in IMAGES {
        let c = config(&dir.join(name));
        let labels = &c["config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], VERSION, "{c}");
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
        for key in [
            "org.opencontainers.image.source",
            "org.opencontainers.image.revision",
        ] {
            assert!(
                labels[key].as_str().is_some_and(|v| !v.is_empty()),
                "{key}: {c}"
            );
        }
        assert_eq!(c["os"], "linux");
        assert_eq!(c["architecture"], "amd64", "{c}");
        let user = c["config"]["User"].as_str().unwrap_or_default();
        match name {
            "proxmox-csi-controller" | "proxmox-csi-node" => assert_eq!(user, "65532:65532"),
            _ => assert_eq!(user, "0:0"),
        }
        let sbom: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.cdx.json"))).unwrap())
                .unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX");
        let purls: Vec<&str> = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["purl"].as_str())
            .collect();
        assert!(
            purls.iter().any(|p| p.starts_with("pkg:cargo/tokio@")),
            "{name}: the SBOM lists no crate"
        );
        assert!(
            purls.iter().any(|p| p.starts_with("pkg:deb/debian/libc6@"))
                || name == "proxmox-csi-hostd-talos",
            "{name}: the SBOM lists no Debian package: {purls:?}"
        );
        configs.insert(name, c);
    }

    if !is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "unpacking and chroot need root, and CI is set"
        );
        eprintln!("SKIPPED: unpacking and chroot need root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let want = |bin: &str| format!("{bin} {VERSION}");
    for name in ["proxmox-csi-controller", "proxmox-csi-node"] {
        let entry: Vec<&str> = configs[name]["config"]["Entrypoint"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(entry, [format!("/usr/local/bin/{name}")]);
        let root = unpack(&dir.join(name), &tmp.path().join(name));
        let (ok, text) = run_in(&root, 65532, 65532, &[entry[0], "--version"]);
        assert!(ok && text.contains(&want(name)), "{name}: {text}");
    }
    // The controller trusts public CAs for the Proxmox API.
    let bundle = tmp
        .path()
        .join("proxmox-csi-controller/rootfs/etc/ssl/certs/ca-certificates.crt");
    assert!(
        std::fs::read_to_string(&bundle)
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );

    let root = unpack(&dir.join("proxmox-csi-hostd"), &tmp.path().join("hostd"));
    for (args, says) in [
        (
            vec!["/usr/bin/proxmox-csi-hostd", "--version"],
            want("proxmox-csi-hostd"),
        ),
        (vec!["mkfs.ext4", "-V"], "mke2fs".to_string()),
        (vec!["mkfs.xfs", "-V"], "mkfs.xfs version".to_string()),
        (vec!["resize2fs"], "resize2fs".to_string()),
    ] {
        let (_, text) = run_in(&root, 0, 0, &args);
        assert!(text.contains(&says), "{args:?}: {text}");
    }

    // The extension as Talos unpacks it: its rules on the image's own files.
    let ext = unpack(
        &dir.join("proxmox-csi-hostd-talos"),
        &tmp.path().join("ext"),
    );
    let problems = talos::problems(&ext);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let svc = ext.join("rootfs/usr/local/lib/containers/proxmox-csi-hostd");
    let (ok, text) = run_in(&svc, 0, 0, &["/usr/bin/proxmox-csi-hostd", "--version"]);
    assert!(ok && text.contains(&want("proxmox-csi-hostd")), "{text}");
}

#[test]
fn the_deployment_names_the_images_built() {
    let Some(dir) = layouts() else { return };
    let root = repo_root();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let chart: serde_norway::Value =
        serde_norway::from_str(&read("deploy/helm/proxmox-csi-plugin/Chart.yaml")).unwrap();
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(VERSION),
        "Chart.yaml appVersion"
    );
    let values: serde_norway::Value =
        serde_norway::from_str(&read("deploy/helm/proxmox-csi-plugin/values.yaml")).unwrap();
    let mut refs = Vec::new();
    for side in ["controller", "node"] {
        let image = &values[side]["plugin"]["image"];
        assert_eq!(
            image["tag"].as_str(),
            Some(""),
            "{side}: the tag is appVersion"
        );
        refs.push(format!(
            "{}:{VERSION}",
            image["repository"].as_str().unwrap()
        ));
    }
    let registry = refs[0].rsplit_once('/').unwrap().0.to_string();
    refs.push(format!("{registry}/proxmox-csi-hostd:{VERSION}"));
    for (r, file) in refs.iter().zip([
        "deploy/kustomize/controller.yaml",
        "deploy/kustomize/node.yaml",
        "deploy/hostd/daemonset.yaml",
    ]) {
        assert!(
            read(file).contains(&format!("image: {r}\n")),
            "{file} does not run {r}"
        );
        let name = r.rsplit_once('/').unwrap().1.split(':').next().unwrap();
        assert!(
            dir.join(name).join("index.json").is_file(),
            "{name} is not built"
        );
    }
}

/// Two builds from the same binaries, at different times, with different
/// umasks and temporary directories, give the same digests.
#[test]
fn the_same_binaries_give_the_same_digests() {
    if layouts().is_none() {
        return;
    }
    if !is_root() {
        eprintln!("SKIPPED: the image build needs root (file ownership)");
        return;
    }
    let build = |umask: &str| {
        let out = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let status = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "umask {umask} && exec \"$0\" --prebuilt --out \"$1\""
            ))
            .arg(repo_root().join("scripts/images.sh"))
            .arg(out.path())
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "scripts/images.sh --prebuilt failed");
        out
    };
    let (a, b) = (build("022"), build("077"));
    for name in IMAGES {
        assert_eq!(
            digest(&a.path().join(name)),
            digest(&b.path().join(name)),
            "{name} differs between two builds"
        );
    }
}
