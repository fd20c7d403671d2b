//! `pvecsictl clean` on a Proxmox cluster two Kubernetes clusters share: each
//! cluster's controller creates its volumes as the external-provisioner asks
//! (naming them with the cluster id it reads from its own kube-system
//! namespace), and clean, run against either cluster, deletes only that
//! cluster's disks that nothing uses.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use callers::provisioner::{Claim, StorageClass, create_volume};
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use serde_json::{Value, json};

use testkit::requests::created;
use testkit::sim::SECRET;
const DRIVER: &str = "csi.proxmox.sinextra.dev";
const UID_A: &str = "aaaa1111-2222-4333-8444-555566667777";
const UID_B: &str = "bbbb1111-2222-4333-8444-555566667777";
/// 2020-09-13: older than any grace period.
const LONG_AGO: u64 = 1_600_000_000;

fn pvesim_yaml() -> String {
    format!(
        r#"
nodes: [{{ name: pve1 }}]
storages:
  - {{ id: local-lvm, type: lvmthin, total: 107374182400 }}
volumes:
  - {{ volid: "local-lvm:vm-9999-pvc-legacy", node: pve1, size: 1073741824, ctime: {LONG_AGO} }}
  - {{ volid: "local-lvm:vm-9999-snapshot-go1", node: pve1, size: 1073741824, ctime: {LONG_AGO} }}
users:
  - userid: kubernetes-csi@pve
    tokens: [{{ name: csi, secret: {SECRET} }}]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - {{ path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }}
"#
    )
}

/// One Kubernetes cluster: its API, its controller, its files for the CLI.
struct Cluster {
    kube: kubesim::Running,
    controller: ControllerService,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(sim: &pvesim::Running, namespace_uid: &str) -> Self {
        let kube = kubesim::start().await.unwrap();
        kube.put(
            "namespaces",
            json!({"metadata": {"name": "kube-system", "uid": namespace_uid}}),
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cloud.yaml"), testkit::sim::config_of(sim)).unwrap();
        std::fs::write(
            dir.path().join("kubeconfig"),
            testkit::kubeconfig(&kube.url, None),
        )
        .unwrap();
        let cfg = CloudConfig::load(&dir.path().join("cloud.yaml")).unwrap();
        // As the controller's startup reads it.
        let client = kube::Client::try_from(kube::Config::new(kube.url.parse().unwrap())).unwrap();
        let mut controller = Controller::from_config(
            &cfg,
            Duration::from_secs(10),
            Default::default(),
            Duration::from_secs(20),
        )
        .unwrap();
        controller.cluster_id = proxmox_csi_controller::kube::cluster_id(&client)
            .await
            .unwrap();
        assert!(controller.cluster_id.is_some());
        Self {
            kube,
            controller: ControllerService(Arc::new(controller)),
            dir,
        }
    }

    /// CreateVolume as the provisioner sends it; with `pv`, the PV it writes.
    async fn provision(&self, name: &str, pv: bool) -> String {
        let sc = StorageClass::new(&[("storage", "local-lvm")]);
        let claim = Claim::new(name, &format!("{name}-uid"), 1 << 30);
        let mut req = create_volume(&sc, &claim, None);
        req.name = name.to_string();
        let handle = created(&self.controller, req).await.volume_id;
        if pv {
            self.kube.put(
                "persistentvolumes",
                json!({"metadata": {"name": name}, "spec": {"capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
                    "csi": {"driver": DRIVER, "volumeHandle": handle}}}),
            );
        }
        handle
    }

    /// pvecsictl with this cluster's files; `global` goes before `clean`.
    fn run(&self, global: &[&str], args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_pvecsictl"))
            .arg("--config")
            .arg(self.dir.path().join("cloud.yaml"))
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .args(global)
            .arg("clean")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn cli(&self, args: &[&str]) -> (i32, String, String) {
        self.run(&[], args)
    }

    /// `clean --yes` past the grace period, told cluster `id`.
    fn yes_as(&self, id: &str, more: &[&str]) -> (i32, String, String) {
        let mut args = vec!["--yes", "--min-age-hours", "0", "--cluster-id", id];
        args.extend_from_slice(more);
        self.cli(&args)
    }

    fn json(&self, args: &[&str]) -> Vec<Value> {
        let (code, out, err) = self.run(&["-o", "json"], args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    }
}

/// What was in `before` and is not in `after`.
fn gone<'a>(before: &'a [String], after: &[String]) -> Vec<&'a String> {
    before.iter().filter(|d| !after.contains(d)).collect()
}

async fn disks(sim: &pvesim::Running) -> Vec<String> {
    let v: Value = reqwest::get(format!("http://{}/pvesim/volumes", sim.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut out: Vec<String> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["volid"].as_str().unwrap().to_string())
        .collect();
    out.sort();
    out
}

/// The verdict `clean -o json` gives the disk whose name starts with `name`.
fn verdict<'a>(rows: &'a [Value], name: &str) -> &'a Value {
    rows.iter()
        .find(|r| {
            r["volid"]
                .as_str()
                .unwrap()
                .starts_with(&format!("local-lvm:vm-9999-{name}"))
        })
        .unwrap_or_else(|| panic!("no row for {name}: {rows:#?}"))
        .get("verdict")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_deletes_only_what_this_cluster_made_and_nothing_uses() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = pvesim::Sim::new(pvesim::State::from_yaml(&pvesim_yaml()).unwrap())
        .plain_http()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let a = Cluster::start(&sim, UID_A).await;
    let b = Cluster::start(&sim, UID_B).await;

    let a_bound = a.provision("pvc-a-bound", true).await;
    assert!(
        a_bound.ends_with("/vm-9999-pvc-a-bound.csf-aaaa11112222"),
        "the disk name carries cluster A's id: {a_bound}"
    );
    a.provision("pvc-a-orphan", false).await;
    // A VolumeAttachment whose PV is already gone still names its volume.
    a.provision("pvc-a-attached", false).await;
    a.kube.put(
        "volumeattachments",
        json!({"metadata": {"name": "csi-0123"}, "spec": {"attacher": DRIVER, "nodeName": "worker-1",
            "source": {"persistentVolumeName": "pvc-a-attached"}}}),
    );
    // The Go driver's snapshot: a volume that only a VolumeSnapshotContent names.
    a.kube.put(
        "volumesnapshotcontents",
        json!({"metadata": {"name": "snapcontent-1"}, "spec": {"driver": DRIVER, "deletionPolicy": "Delete",
            "source": {"volumeHandle": a_bound}, "volumeSnapshotRef": {"name": "s", "namespace": "default"}},
            "status": {"snapshotHandle": "region-1/pve1/local-lvm/vm-9999-snapshot-go1", "readyToUse": true}}),
    );
    // A PV of a second install (another driver name) whose handle spells
    // the region and storage otherwise (one VG or export, two storage ids).
    let other = a.provision("pvc-a-other-install", false).await;
    let disk = other.rsplit('/').next().unwrap().to_string();
    a.kube.put(
        "persistentvolumes",
        json!({"metadata": {"name": "pvc-a-other-install"}, "spec": {"capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": "csi-b.proxmox.sinextra.dev", "volumeHandle": format!("Region-One/pve1/lvm-alias/{disk}")}}}),
    );
    b.provision("pvc-b-bound", true).await;
    b.provision("pvc-b-detached", false).await;
    let before = disks(&sim).await;
    assert_eq!(before.len(), 8, "{before:?}");

    // Listed, each with what --yes would do; the grace period keeps new disks.
    let rows = a.json(&[]);
    assert_eq!(verdict(&rows, "pvc-a-orphan")["reason"], "young");
    assert_eq!(verdict(&rows, "pvc-b-detached")["reason"], "other-cluster");
    assert_eq!(verdict(&rows, "pvc-b-bound")["reason"], "other-cluster");
    assert_eq!(verdict(&rows, "pvc-legacy")["reason"], "unattributed");
    assert_eq!(verdict(&rows, "snapshot-go1")["reason"], "named-by");
    assert_eq!(
        verdict(&rows, "snapshot-go1")["kind"],
        "VolumeSnapshotContent"
    );
    assert_eq!(verdict(&rows, "pvc-a-attached")["kind"], "VolumeAttachment");
    for named in ["pvc-a-bound", "pvc-a-other-install"] {
        assert!(
            !rows
                .iter()
                .any(|r| r["volid"].as_str().unwrap().contains(named)),
            "a disk a PV names is not listed: {rows:#?}"
        );
    }

    // --yes refuses while it sees a disk it cannot attribute and was not told
    // which cluster this is, and when told a cluster that is not this one.
    let (code, _, err) = a.cli(&["--yes", "--min-age-hours", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("1 disk(s) carry no cluster id") && err.contains("nothing deleted"),
        "{err}"
    );
    let (code, _, err) = a.yes_as("bbbb11112222", &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("is not this Kubernetes cluster's id (aaaa11112222"),
        "{err}"
    );
    let (code, _, err) = a.cli(&["--yes", "--cluster-id", "Not-An-Id"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("1 to 16 lower-case letters and digits"),
        "{err}"
    );
    assert_eq!(
        disks(&sim).await,
        before,
        "nothing deleted by a refused run"
    );

    // Told, past the grace period: only A's unused disk goes.
    let (code, _, err) = a.yes_as("aaaa11112222", &[]);
    assert_eq!(code, 0, "{err}");
    let after_a = disks(&sim).await;
    assert_eq!(
        gone(&before, &after_a),
        ["local-lvm:vm-9999-pvc-a-orphan.csf-aaaa11112222"],
        "{err}"
    );

    // B's run: B's detached volume goes, A's stay.
    let (code, _, err) = b.yes_as("bbbb11112222", &[]);
    assert_eq!(code, 0, "{err}");
    let after_b = disks(&sim).await;
    assert_eq!(
        gone(&after_a, &after_b),
        ["local-lvm:vm-9999-pvc-b-detached.csf-bbbb11112222"]
    );

    // Go volumes only when asked, and never one a VolumeSnapshotContent names.
    let (code, _, err) = a.yes_as("aaaa11112222", &["--include-unattributed"]);
    assert_eq!(code, 0, "{err}");
    let after = disks(&sim).await;
    assert_eq!(gone(&after_b, &after), ["local-lvm:vm-9999-pvc-legacy"]);
    for kept in [
        "vm-9999-pvc-a-bound",
        "vm-9999-pvc-a-other-install",
        "vm-9999-pvc-a-attached",
        "vm-9999-snapshot-go1",
        "vm-9999-pvc-b-bound",
    ] {
        assert!(after.iter().any(|d| d.contains(kept)), "{kept}: {after:?}");
    }
}
