//! The Talos extension tree made by `talos-extension/assemble.sh`: valid by
//! Talos's rules, and self-contained (hostd and mkfs run chrooted into the
//! service's rootfs, with nothing of the host).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use packaging::{bldr, repo_root, talos};

fn hostd_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let bin = target.join("debug/proxmox-csi-hostd");
    assert!(
        bin.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        bin.display()
    );
    bin
}

fn chroot(root: &Path, args: &[&str]) -> (bool, String) {
    packaging::chroot::run(root, 0, 0, args).unwrap()
}

#[test]
fn assembled_extension_is_valid_and_self_contained() {
    let out = tempfile::tempdir().unwrap();
    let tree = out.path().join("ext");
    let status = Command::new("bash")
        .arg(repo_root().join("talos-extension/assemble.sh"))
        .arg(&tree)
        .arg(hostd_binary())
        .status()
        .unwrap();
    assert!(status.success(), "assemble.sh failed");

    let problems = talos::problems(&tree);
    assert!(
        problems.is_empty(),
        "the extension breaks Talos's rules:\n{}",
        problems.join("\n")
    );

    let spec_path = tree.join("rootfs/usr/local/etc/containers/proxmox-csi-hostd.yaml");
    let spec: talos::Service =
        serde_norway::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    assert_eq!(spec.restart, "always");
    let deps: Vec<String> = spec
        .depends
        .iter()
        .flat_map(|d| d.values().filter_map(|v| v.as_str().map(String::from)))
        .collect();
    assert_eq!(deps, ["udevd", "kubelet"]);
    assert_eq!(
        spec.container.security.rootfs_propagation.as_deref(),
        Some("shared")
    );
    let mount = |dest: &str| {
        spec.container
            .mounts
            .iter()
            .find(|m| m.destination == dest)
            .unwrap_or_else(|| panic!("no mount of {dest}"))
    };
    assert!(
        mount("/var/lib/kubelet")
            .options
            .iter()
            .any(|o| o == "rshared"),
        "kubelet mounts must propagate back"
    );
    assert!(mount("/dev").options.iter().any(|o| o == "rshared"));
    assert!(mount("/run/udev").options.iter().any(|o| o == "ro"));
    assert!(
        spec.container
            .args
            .iter()
            .any(|a| a == "--socket=/run/proxmox-csi-hostd/hostd.sock")
    );
    // What a Talos user configures comes from the environment an
    // ExtensionServiceConfig appends: an argument would override it.
    for setting in [
        "--driver-name",
        "--allow-uid",
        "--allow-gid",
        "--plugin-dir",
        "--device-wait",
        "--luks-pbkdf",
        "--luks-kdf-bounds",
        "--metrics-address",
        "--go-takeover",
        "--log-level",
    ] {
        assert!(
            !spec.container.args.iter().any(|a| a.starts_with(setting)),
            "{setting} is fixed by an argument: its PROXMOX_CSI_HOSTD_ environment entry would not apply"
        );
    }
    assert_eq!(
        mount("/run/proxmox-csi-hostd").source,
        "/run/proxmox-csi-hostd"
    );
    let manifest = std::fs::read_to_string(tree.join("manifest.yaml")).unwrap();
    assert!(
        manifest.contains(&format!("version: {}", env!("CARGO_PKG_VERSION"))),
        "{manifest}"
    );

    testkit::require_root!();
    let svc = tree.join("rootfs/usr/local/lib/containers/proxmox-csi-hostd");
    let (ok, text) = chroot(&svc, &["/usr/bin/proxmox-csi-hostd", "--version"]);
    assert!(
        ok && text.contains(&format!("proxmox-csi-hostd {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let (ok, text) = chroot(&svc, &["/usr/sbin/mkfs.ext4", "-V"]);
    assert!(ok && text.contains("mke2fs"), "{text}");
    let (ok, text) = chroot(&svc, &["/usr/sbin/mkfs.xfs", "-V"]);
    assert!(ok && text.contains("mkfs.xfs version"), "{text}");
    // A real ext4 made inside: the bundled mke2fs.conf gives ext4's features.
    std::fs::create_dir_all(svc.join("tmp")).unwrap();
    std::fs::File::create(svc.join("tmp/img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let (ok, text) = chroot(&svc, &["/usr/sbin/mkfs.ext4", "-F", "-q", "/tmp/img"]);
    assert!(ok, "{text}");
    let dump = Command::new("dumpe2fs")
        .arg("-h")
        .arg(svc.join("tmp/img"))
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("extent") && dump.contains("64bit"), "{dump}");
}

#[test]
fn the_checker_rejects_what_talos_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let svc = root.join("rootfs/usr/local/lib/containers/bad");
    std::fs::create_dir_all(&svc).unwrap();
    std::fs::create_dir_all(root.join("rootfs/usr/local/etc/containers")).unwrap();
    std::fs::create_dir_all(root.join("rootfs/usr/bin")).unwrap();
    std::fs::write(
        root.join("manifest.yaml"),
        "version: v1\nmetadata: {name: bad, version: latest, author: x, description: y}\n",
    )
    .unwrap();
    std::fs::write(root.join("usr"), "").unwrap();
    std::fs::write(root.join("rootfs/usr/bin/tool"), "").unwrap();
    let open = root.join("rootfs/usr/local/open");
    std::fs::write(&open, "").unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    nix_mkfifo(&root.join("rootfs/usr/local/fifo"));
    std::fs::write(
        root.join("rootfs/usr/local/etc/containers/bad.yaml"),
        "name: Bad\ndepends: [{service: udevd, path: /x}]\ncontainer: {entrypoint: ./missing, mounts: [{source: dev, destination: /dev, type: tmpfs, options: [shiny]}]}\n",
    )
    .unwrap();
    let found = talos::problems(root).join("\n");
    for want in [
        "unexpected file \"usr\"",
        "unsupported manifest version \"v1\"",
        "metadata.version \"latest\" is not semver",
        "compatibility.talos.version is not set",
        "path \"/usr/bin/tool\" is not allowed in extensions",
        "/usr/local/open: world-writeable files are not allowed",
        "/usr/local/fifo: special files are not allowed",
        "name \"Bad\" does not match",
        "restart kind is invalid: \"\"",
        "depends[0] must set exactly one of",
        "is not an executable file of the service's rootfs",
        "mount dev → /dev: paths must be absolute",
        "type \"tmpfs\", want bind",
        "unknown option \"shiny\"",
    ] {
        assert!(found.contains(want), "missing {want:?} in:\n{found}");
    }
    assert!(
        talos::service_problems(
            root,
            "name: x\nrestart: always\ncontainer: {entrypoint: ./x, nonsense: 1}\n"
        )[0]
        .contains("unknown field `nonsense`")
    );
}

fn nix_mkfifo(p: &Path) {
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
}

/// The recipe for siderolabs/extensions: the service spec it installs is a
/// file of its own directory (bldr copies the directory to /pkg; a symlink
/// out of it would dangle there) and the very spec this tree ships; crates
/// are fetched in the one networked step and the build runs offline.
#[test]
fn the_siderolabs_recipe_builds_offline_from_its_own_files() {
    let dir = repo_root().join("talos-extension/siderolabs/storage/proxmox-csi-hostd");
    let spec = dir.join("proxmox-csi-hostd.yaml");
    assert!(
        !std::fs::symlink_metadata(&spec)
            .unwrap()
            .file_type()
            .is_symlink(),
        "{} is a symlink",
        spec.display()
    );
    assert_eq!(
        std::fs::read_to_string(&spec).unwrap(),
        std::fs::read_to_string(repo_root().join("talos-extension/proxmox-csi-hostd.yaml"))
            .unwrap(),
        "the recipe's service spec differs from talos-extension/proxmox-csi-hostd.yaml"
    );
    let pkg = bldr::recipe(&dir, &release_sums()).unwrap();
    let problems = bldr::problems(&pkg);
    assert!(problems.is_empty(), "bldr refuses the recipe: {problems:?}");
    assert_eq!(pkg.name, "proxmox-csi-hostd");
    let networked: Vec<&bldr::Step> = pkg.steps.iter().filter(|s| s.network() != "none").collect();
    assert_eq!(networked.len(), 1, "one networked step");
    assert_eq!(networked[0].network(), "default");
    let fetch = networked[0].prepare.join("\n");
    assert!(fetch.contains("cargo fetch --locked"), "{fetch}");
    assert!(networked[0].build.is_empty(), "the networked step builds");
    let build = pkg
        .steps
        .iter()
        .find(|s| !s.build.is_empty())
        .expect("a build step");
    assert_eq!(build.network(), "none");
    assert!(build.build.join("\n").contains("--frozen"));
    let install = build.install.join("\n");
    assert!(
        install.contains("cp /pkg/proxmox-csi-hostd.yaml"),
        "{install}"
    );
    assert!(
        install.contains("command -v"),
        "tools taken from a fixed directory: {install}"
    );
    assert!(
        pkg.install.iter().any(|p| p == "cargo"),
        "no cargo in the build environment"
    );
    // Each tool the service root gets, and the Alpine package that holds it
    // (aports main/e2fsprogs 1.47.3-r0 and main/xfsprogs 7.1.1-r1, APKBUILD:
    // package() keeps mkfs.* in the main package, extra() moves
    // /usr/sbin's resize2fs and xfs_growfs into -extra).
    for (tool, package) in [
        ("mkfs.ext4", "e2fsprogs"),
        ("resize2fs", "e2fsprogs-extra"),
        ("mkfs.xfs", "xfsprogs"),
        ("xfs_growfs", "xfsprogs-extra"),
    ] {
        assert!(install.contains(tool), "the recipe does not copy {tool}");
        assert!(
            pkg.install.iter().any(|p| p == package),
            "{tool} is in Alpine's {package}, which the recipe does not install"
        );
    }
    // The SBOM goes where siderolabs/extensions' recipes put theirs.
    let sbom = build.sbom.as_ref().expect("an sbom step");
    assert_eq!(
        sbom.output_path,
        "/rootfs/usr/local/share/spdx/proxmox-csi-hostd.spdx.json"
    );

    // vars.yaml leaves the source tarball's sums to `make release`, which
    // writes them into the release's recipe (tests/packaging/tests/release.rs
    // checks that one): the template alone does not render, naming them.
    let unfilled = bldr::recipe(&dir, &HashMap::new()).unwrap_err();
    assert!(
        unfilled.contains("PROXMOX_CSI_SHA256") && unfilled.contains("PROXMOX_CSI_SHA512"),
        "{unfilled}"
    );
}

/// Release sums of the right shape, as a release fills them into vars.yaml.
fn release_sums() -> HashMap<String, String> {
    HashMap::from([
        ("PROXMOX_CSI_SHA256".to_string(), "a".repeat(64)),
        ("PROXMOX_CSI_SHA512".to_string(), "b".repeat(128)),
    ])
}

/// bldr's checks, and keys bldr would silently drop, are refused.
#[test]
fn the_recipe_check_refuses_what_bldr_refuses_or_drops() {
    let bad: Result<bldr::Pkg, _> =
        serde_norway::from_str("name: x\nvariant: alpine\nsteps: [{biuld: [make]}]\n");
    assert!(
        bad.unwrap_err()
            .to_string()
            .contains("unknown field `biuld`"),
        "a misspelt step key"
    );
    let pkg: bldr::Pkg = serde_norway::from_str(
        "variant: debian\ndependencies: [{stage: a, image: b}, {from: /}]\n\
         steps: [{network: open, sources: [{url: u, destination: d, sha256: abc, sha512: ''}]}]\n",
    )
    .unwrap();
    let found = bldr::problems(&pkg);
    for want in [
        "package name can't be empty",
        "unknown variant \"debian\"",
        "finalize steps are missing, this is going to lead to empty build",
        "dependency can't have both image & stage set",
        "either image or stage should be set for the dependency",
        "unknown networkmode \"open\"",
        "source.sha256 should be 64 chars long",
        "source.sha512 can't be empty",
    ] {
        assert!(
            found.iter().any(|f| f == want),
            "missing {want:?} in {found:?}"
        );
    }
    assert!(bldr::render("{{ .NOPE }}", &HashMap::new()).is_err());
}
