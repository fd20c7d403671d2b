//! csi-sanity's Node specs against the node plugin and hostd in the guest
//! VM: the controller binary on pvesim hot-plugs each disk into the guest
//! over QMP, the guest's udev announces it, hostd stages it. csi-sanity runs
//! on this host; the directories it makes and checks are made and checked
//! in the guest, through its path commands (`--csi.createmountpathcmd` and
//! the others), which this test serves from the guest's console.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::Path;
use std::sync::Arc;

use conformance::sanity::{self, Outcome};
use e2e::guest::{Guest, SECRET, guest_cluster, qemu_present};
use pvesim::{Sim, State};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// Serves one shell command per connection in the guest: the answer is its
/// exit code on the first line, then its output.
async fn serve_guest_commands(guest: Arc<Mutex<Guest>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(read).read_line(&mut line).await.is_err() {
                continue;
            }
            let answer = match guest.lock().await.sh_status(line.trim()).await {
                Ok((code, out)) => format!("{code}\n{out}\n"),
                Err(e) => format!("1\n{e}\n"),
            };
            let _ = write.write_all(answer.as_bytes()).await;
        }
    });
    port
}

/// A path command for csi-sanity: `printf_line` is a printf format of the
/// guest command, its `%s` each the path csi-sanity passes.
fn path_command(dir: &Path, name: &str, port: u16, printf_line: &str, uses: usize) -> String {
    let args = vec!["\"$1\""; uses].join(" ");
    let script = format!(
        "#!/bin/bash\n# Runs one command in the guest VM, through the test's console.\nexec 3<>/dev/tcp/127.0.0.1/{port} || exit 1\nprintf '{printf_line}\\n' {args} >&3\nIFS= read -r rc <&3\ncat <&3\nexit \"$rc\"\n"
    );
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_node_specs_in_the_guest() {
    let sanity_bin = match sanity::build() {
        Ok(Some(b)) => b,
        Ok(None) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "../shared/tools/csi-sanity is missing, and CI is set"
            );
            eprintln!("SKIPPED: ../shared/tools/csi-sanity is not beside the repository");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    if !qemu_present() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let guest = Guest::boot().await.expect("guest boots");
    let csi_port = guest.csi_port;
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    let role = "VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Clone, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit";
    let state = guest_cluster(&guest.qmp, role);
    let sim = Sim::new(State::from_yaml(&state).unwrap())
        .plain_http()
        .volume_dir(images)
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let config = dir.path().join("cloud-config.yaml");
    std::fs::write(
        &config,
        format!("clusters:\n  - url: {}\n    token_id: kubernetes-csi@pve!csi\n    token_secret: {SECRET}\n    region: region-1\n", sim.api_url()),
    )
    .unwrap();
    let ctl_sock = dir.path().join("controller.sock");
    let controller = conformance::node::spawn(
        &conformance::node::bin("proxmox-csi-controller"),
        &[
            "--csi-address",
            &format!("unix://{}", ctl_sock.display()),
            "--cloud-config",
            &config.display().to_string(),
        ],
        &dir.path().join("controller.log"),
    )
    .unwrap();
    let controller = sanity::Killed(controller);
    conformance::node::wait_for(&ctl_sock).await.unwrap();

    let guest = Arc::new(Mutex::new(guest));
    let port = serve_guest_commands(guest.clone()).await;
    let create = path_command(dir.path(), "create.sh", port, "mkdir -p %s && echo %s", 2);
    let check = path_command(
        dir.path(),
        "check.sh",
        port,
        "if [ -d %s ]; then echo directory; elif [ -f %s ]; then echo file; elif [ -e %s ]; then echo other; else echo not_found; fi",
        3,
    );
    let remove = path_command(dir.path(), "remove.sh", port, "rm -rf %s", 1);
    let params = dir.path().join("parameters.yaml");
    std::fs::write(&params, "storage: local-lvm\n").unwrap();

    let mut cmd = tokio::process::Command::new(&sanity_bin);
    cmd.arg(format!("--csi.endpoint=dns:///127.0.0.1:{csi_port}"))
        .arg(format!("--csi.controllerendpoint=unix://{}", ctl_sock.display()))
        // kubelet's layouts in the guest.
        .arg("--csi.stagingdir=/var/lib/kubelet/plugins/kubernetes.io/csi/csi.proxmox.sinextra.dev/0d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa/globalmount")
        .arg("--csi.mountdir=/var/lib/kubelet/pods/3c2b1a09-8f7e-4d6c-b5a4-93827160f5e4/volumes/kubernetes.io~csi/pvc-sanity")
        .arg(format!("--csi.createmountpathcmd={create}"))
        .arg(format!("--csi.createstagingpathcmd={create}"))
        .arg(format!("--csi.checkpathcmd={check}"))
        .arg(format!("--csi.removemountpathcmd={remove}"))
        .arg(format!("--csi.removestagingpathcmd={remove}"))
        .arg(format!("--csi.testvolumeparameters={}", params.display()))
        .arg("--csi.testvolumesize=536870912")
        .arg("--csi.testvolumeexpandsize=1073741824")
        .arg("--ginkgo.focus=Node Service")
        .arg("--ginkgo.no-color")
        .arg("--ginkgo.timeout=20m");
    let outcome: Outcome = sanity::execute(cmd, &sanity_bin).await.unwrap();
    println!("csi-sanity Node specs in the guest: {}", outcome.summary);
    drop(controller);
    if !outcome.passed {
        let log = std::fs::read_to_string(dir.path().join("controller.log")).unwrap_or_default();
        let node_log = guest
            .lock()
            .await
            .sh("cat /run/node.log; tail -n 40 /run/hostd.log")
            .await
            .unwrap_or_default();
        panic!(
            "csi-sanity failed in the guest:\n{}\n--- controller.log\n{log}\n--- guest\n{node_log}",
            outcome.output
        );
    }
}
