//! The OCI image layouts `make images` (scripts/images.sh) leaves in
//! target/images: each unpacked with umoci and its entrypoint run chrooted
//! (the plugins as uid 65532 with no capabilities), its config read with
//! skopeo, the extension checked by Talos's rules on what the image holds,
//! the deployment's image references matching the images, a second
//! assembly from the same binaries giving the same digests, every file
//! traced to a package of the declared environment's lock, and a push that
//! keeps the digest and the platform index.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use packaging::{IMAGES, VERSION, chroot, environment, repo_root, talos};

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
    testkit::skip::present(
        false,
        &format!("the image layouts in {} (make images)", dir.display()),
    );
    None
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

/// The platforms of the image index the tag names (each `os/architecture`).
fn platforms(layout: &Path) -> Vec<String> {
    let read = |digest: &str| -> serde_json::Value {
        let hex = digest.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap())
            .unwrap()
    };
    let index = read(&digest(layout));
    assert_eq!(
        index["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{index}"
    );
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let p = &m["platform"];
            let manifest = read(m["digest"].as_str().unwrap());
            let config = read(manifest["config"]["digest"].as_str().unwrap());
            assert_eq!(config["architecture"], p["architecture"], "{m}");
            format!(
                "{}/{}",
                p["os"].as_str().unwrap(),
                p["architecture"].as_str().unwrap()
            )
        })
        .collect()
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
        assert_eq!(c["architecture"], environment::debian_arch(), "{c}");
        assert_eq!(
            platforms(&dir.join(name)),
            ["linux/amd64"],
            "{name}: the tag's index names the architecture it holds"
        );
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
            purls.iter().any(|p| p.starts_with("pkg:deb/debian/libc6@")),
            "{name}: the SBOM lists no Debian package: {purls:?}"
        );
        configs.insert(name, c);
    }

    testkit::require_root!();
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
    // The image build sets file ownership.
    testkit::require_root!();
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

/// Every file of an image that is not the driver's own is, byte for byte, a
/// file of a package the environment's lock pins, and that package is
/// recorded for the SBOM, which names it at its locked version: nothing
/// comes from the build host.
#[test]
fn every_file_not_the_drivers_comes_from_a_locked_package() {
    let Some(dir) = layouts() else { return };
    testkit::require_root!();
    let repo = repo_root();
    let scratch = tempfile::tempdir().unwrap();
    let contents = environment::Contents::of(
        &repo,
        &repo.join("target/environment/debs"),
        &scratch.path().join("debs"),
    );
    let locked: HashMap<String, String> = environment::lock(&repo)
        .into_iter()
        .map(|l| (l.package, l.version))
        .collect();
    // The driver's own files: its binaries, the accounts, the loader's
    // configuration, the extension's manifest and service spec, and the
    // records of the packages themselves.
    let ours = |path: &str| {
        [
            "/usr/local/bin/proxmox-csi-controller",
            "/usr/local/bin/proxmox-csi-node",
            "/usr/bin/proxmox-csi-hostd",
            "/etc/passwd",
            "/etc/group",
            "/etc/ld.so.conf",
            "/etc/ld.so.cache",
            "/etc/ssl/certs/ca-certificates.crt",
            "/manifest.yaml",
            "/rootfs/usr/local/etc/containers/proxmox-csi-hostd.yaml",
            "/rootfs/usr/local/share/spdx/proxmox-csi-hostd.spdx.json",
        ]
        .contains(&path)
            || path.starts_with("/var/lib/dpkg/status.d/")
    };
    for name in IMAGES {
        let image = unpack(&dir.join(name), &scratch.path().join(name));
        // Where the image's files live: the extension's are in the service's root.
        let root = if name == "proxmox-csi-hostd-talos" {
            image.join("rootfs/usr/local/lib/containers/proxmox-csi-hostd")
        } else {
            image.clone()
        };
        let recorded = environment::recorded(&root);
        for (package, version) in &recorded {
            assert_eq!(
                locked.get(package),
                Some(version),
                "{name}: {package} {version} is not the locked version"
            );
        }
        let mut files = 0;
        for file in environment::regular_files(&image) {
            let in_image = format!("/{}", file.strip_prefix(&image).unwrap().display());
            let in_root = format!("/{}", file.strip_prefix(&root).unwrap_or(&file).display());
            if ours(&in_image) || ours(&in_root) {
                continue;
            }
            let holders = contents.holders(&std::fs::read(&file).unwrap());
            assert!(
                !holders.is_empty(),
                "{name}: {in_image} is no file of a locked package"
            );
            assert!(
                holders.iter().any(|(p, _)| recorded.contains_key(p)),
                "{name}: {in_image} comes from {holders:?}, which the image does not record"
            );
            files += 1;
        }
        assert!(files > 3, "{name}: only {files} package files");

        // The SBOM names each recorded package at its locked version.
        let sbom: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.cdx.json"))).unwrap())
                .unwrap();
        let debs: HashMap<String, String> = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["purl"].as_str())
            .filter_map(|p| p.strip_prefix("pkg:deb/debian/"))
            .filter_map(|p| {
                let (n, rest) = p.split_once('@')?;
                let v = rest
                    .split('?')
                    .next()?
                    .replace("%3A", ":")
                    .replace("%2B", "+");
                Some((n.to_string(), v))
            })
            .collect();
        for (package, version) in &recorded {
            assert_eq!(
                debs.get(package),
                Some(version),
                "{name}: the SBOM does not name {package} {version}"
            );
        }
    }

    // The CA bundle is the package's certificates, every one of them.
    let bundle = std::fs::read_to_string(
        scratch
            .path()
            .join("proxmox-csi-controller/rootfs/etc/ssl/certs/ca-certificates.crt"),
    )
    .unwrap();
    let certs: Vec<_> = environment::regular_files(
        &scratch
            .path()
            .join("debs/ca-certificates/usr/share/ca-certificates"),
    )
    .into_iter()
    .filter(|f| f.extension().is_some_and(|e| e == "crt"))
    .collect();
    assert!(certs.len() > 100, "{} certificates", certs.len());
    for c in &certs {
        let pem = std::fs::read_to_string(c).unwrap();
        assert!(
            bundle.contains(pem.trim()),
            "{} is not in the bundle",
            c.display()
        );
    }
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), certs.len());
}

/// Pushed as docs/images.md says (`skopeo copy --all --preserve-digests`),
/// to another OCI layout standing in for a registry: the tag serves the
/// same bytes (the digest make images printed), an image index with the
/// image's platform, and a pull for another architecture is refused.
#[test]
fn pushing_keeps_the_digest_and_the_platform() {
    let Some(dir) = layouts() else { return };
    let registry = tempfile::tempdir().unwrap();
    for name in IMAGES {
        let to = format!("oci:{}:{VERSION}", registry.path().join(name).display());
        let out = Command::new("skopeo")
            .args(["copy", "--quiet", "--all", "--preserve-digests"])
            .arg(format!("oci:{}:{VERSION}", dir.join(name).display()))
            .arg(&to)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let raw = Command::new("skopeo")
            .args(["inspect", "--raw", &to])
            .output()
            .unwrap();
        assert!(raw.status.success(), "{name}: skopeo inspect --raw");
        assert_eq!(
            format!("sha256:{}", environment::sha256(&raw.stdout)),
            digest(&dir.join(name)),
            "{name}: the pushed tag serves other bytes"
        );
        let index: serde_json::Value = serde_json::from_slice(&raw.stdout).unwrap();
        assert_eq!(
            index["manifests"][0]["platform"]["architecture"],
            environment::debian_arch()
        );
        let arm = Command::new("skopeo")
            .args(["--override-arch", "arm64", "inspect", &to])
            .output()
            .unwrap();
        assert!(
            !arm.status.success(),
            "{name}: an arm64 pull was given the amd64 image"
        );
    }
}
