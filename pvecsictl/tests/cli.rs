//! pvecsictl against pvesim and a Kubernetes API stand-in. The stand-in
//! serves only what the CLI reads (lists of PersistentVolumes and Nodes); it
//! does not model watches, resourceVersion, writes or authentication.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::routing::get;
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::pve::Client;
use pvecsictl::clean::{Keep, Verdict};
use pvecsictl::doctor::{self, Severity};
use pvecsictl::state::State;
use serde_json::{Value, json};

use testkit::sim::SECRET;
const CLUSTER: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }]
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
  - { id: san, type: lvm, shared: true, total: 107374182400 }
  - { id: san-safe, type: lvm, shared: true, saferemove: true, total: 107374182400 }
vms:
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-single, scsi1: "local-lvm:vm-9999-pvc-bound,backup=0,size=1G" } }
  - { vmid: 113, node: pve2, name: worker-3, config: { scsihw: lsi, protection: "1", unused0: "local-lvm:vm-9999-pvc-unused" } }
  - { vmid: 10000, node: pve1, name: snapshot-old, config: { tags: "proxmox-csi;csi-snapshot;csi-name.snapshot-old", unused0: "local-lvm:vm-10000-disk-0" } }
  - { vmid: 10001, node: pve1, name: snapshot-new, config: { tags: "proxmox-csi;csi-snapshot;csi-name.snapshot-new", protection: "1", unused0: "local-lvm:vm-10001-disk-0" } }
volumes:
  - { volid: "local-lvm:vm-9999-pvc-bound", node: pve2, size: 1073741824 }
  - { volid: "local-lvm:vm-9999-pvc-orphan", node: pve1, size: 2147483648 }
  - { volid: "local-lvm:vm-9999-pvc-unused", node: pve2, size: 1073741824 }
  - { volid: "local-lvm:vm-9999-pvc-stray", node: pve2, size: 1073741824 }
  - { volid: "local-lvm:vm-100-disk-0", node: pve1, size: 1073741824 }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }
"#;

fn list(kind: &str, items: Vec<Value>) -> Json<Value> {
    Json(
        json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

async fn pvs() -> Json<Value> {
    let pv = |name: &str, handle: &str| json!({"metadata": {"name": name}, "spec": {"csi": {"driver": "csi.proxmox.sinextra.dev", "volumeHandle": handle}, "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}});
    list(
        "PersistentVolumeList",
        vec![
            pv("pvc-bound", "region-1/pve2/local-lvm/vm-9999-pvc-bound"),
            pv("pvc-held", "region-1/pve1/local-lvm/vm-10003-disk-0"),
        ],
    )
}

async fn nodes() -> Json<Value> {
    let node = |name: &str, labels: Value, spec: Value, annotations: Value| json!({"metadata": {"name": name, "labels": labels, "annotations": annotations}, "spec": spec});
    let zone = |z: &str| json!({"topology.kubernetes.io/region": "region-1", "topology.kubernetes.io/zone": z});
    list(
        "NodeList",
        vec![
            node(
                "worker-2",
                zone("pve2"),
                json!({"providerID": "proxmox://region-1/112"}),
                json!({}),
            ),
            node(
                "worker-3",
                zone("pve1"),
                json!({}),
                json!({"proxmox.sinextra.dev/instance-id": "113"}),
            ),
            node("worker-9", zone("pve1"), json!({}), json!({})),
        ],
    )
}

/// The Go driver's documented classes (docs/options.md, docs/volumesnapshot.md)
/// with what such clusters carry: Go's booleans, the provisioner's legacy
/// key, a VolumeAttributesClass limit of 0 and replication keys, a snapshot
/// class `zone`; one class of another driver; one Go would fail on too.
async fn storage_classes() -> Json<Value> {
    let sc = |name: &str, provisioner: &str, params: Value| json!({"metadata": {"name": name}, "provisioner": provisioner, "parameters": params});
    list(
        "StorageClassList",
        vec![
            sc(
                "proxmox-data",
                "csi.proxmox.sinextra.dev",
                json!({"csi.storage.k8s.io/fstype": "xfs", "storage": "local-lvm", "cache": "writethrough", "ssd": "true"}),
            ),
            sc(
                "proxmox-legacy",
                "csi.proxmox.sinextra.dev",
                json!({"fstype": "ext4", "storage": "local-lvm", "ssd": "yes", "tier": "gold"}),
            ),
            sc(
                "proxmox-broken",
                "csi.proxmox.sinextra.dev",
                json!({"storage": "local-lvm", "diskIOPS": "lots"}),
            ),
            sc("other", "ebs.csi.aws.com", json!({"type": "gp3"})),
        ],
    )
}

async fn attributes_classes() -> Json<Value> {
    list(
        "VolumeAttributesClassList",
        vec![
            json!({"metadata": {"name": "unlimited"}, "driverName": "csi.proxmox.sinextra.dev", "parameters": {"diskIOPS": "0", "replicateSchedule": "*/5"}}),
        ],
    )
}

async fn snapshot_classes() -> Json<Value> {
    list(
        "VolumeSnapshotClassList",
        vec![
            json!({"metadata": {"name": "proxmox-snapshot"}, "driver": "csi.proxmox.sinextra.dev", "deletionPolicy": "Delete", "parameters": {"zone": "pve1"}}),
        ],
    )
}

struct Lab {
    sim: pvesim::Running,
    dir: tempfile::TempDir,
    kube_url: String,
}

async fn lab() -> Lab {
    lab_with(CLUSTER).await
}

/// The lab on a cluster of the caller's (holding VM 113 on pve2).
async fn lab_with(cluster: &str) -> Lab {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = pvesim::Sim::new(pvesim::State::from_yaml(cluster).unwrap())
        .plain_http()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    // A change Proxmox left pending on 113: a hot-plug that failed.
    let http = reqwest::Client::new();
    sim.set_knobs(r#"{"fail_hotplugs": 1}"#).unwrap();
    http.post(format!("{}/nodes/pve2/qemu/113/config", sim.api_url()))
        .header(
            "Authorization",
            format!("PVEAPIToken=kubernetes-csi@pve!csi={SECRET}"),
        )
        .form(&[("scsi5", "local-lvm:vm-9999-pvc-stray")])
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sim.faults().failed_hotplugs,
        1,
        "the stray change is pending"
    );
    let app = axum::Router::new()
        .route("/api/v1/persistentvolumes", get(pvs))
        .route("/api/v1/nodes", get(nodes))
        // k8s.io/apimachinery pkg/version/types.go Info, as the API server
        // serves it on /version.
        .route(
            "/version",
            get(|| async {
                Json(json!({"major": "1", "minor": "30", "gitVersion": "v1.30.14",
                    "platform": "linux/amd64"}))
            }),
        )
        .route(
            "/api/v1/namespaces/kube-system",
            get(|| async {
                Json(json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "kube-system", "uid": "1ab0c0de-0000-4000-8000-000000000000"}}))
            }),
        )
        .route(
            "/apis/storage.k8s.io/v1/storageclasses",
            get(storage_classes),
        )
        .route(
            "/apis/storage.k8s.io/v1/volumeattributesclasses",
            get(attributes_classes),
        )
        .route(
            "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses",
            get(snapshot_classes),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cloud.yaml"), testkit::sim::config_of(&sim)).unwrap();
    let kube_url = format!("http://{addr}");
    std::fs::write(
        dir.path().join("kubeconfig"),
        testkit::kubeconfig(&kube_url, None),
    )
    .unwrap();
    Lab { sim, dir, kube_url }
}

impl Lab {
    async fn state(&self) -> State {
        let cfg = CloudConfig::load(&self.dir.path().join("cloud.yaml")).unwrap();
        let clients: Vec<Arc<Client>> = cfg
            .clusters
            .into_iter()
            .map(|c| Arc::new(Client::new(c, Duration::from_secs(10), Default::default()).unwrap()))
            .collect();
        let kube =
            kube::Client::try_from(kube::Config::new(self.kube_url.parse().unwrap())).unwrap();
        State::read(
            &clients,
            &kube,
            cfg.controller_vmid,
            "csi.proxmox.sinextra.dev",
        )
        .await
        .unwrap()
    }

    fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_pvecsictl"))
            .arg("--config")
            .arg(self.dir.path().join("cloud.yaml"))
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reads_the_tag_policy_and_says_what_to_allow() {
    let finding = |findings: &[doctor::Finding]| {
        findings
            .iter()
            .find(|x| x.check == "tag policy")
            .cloned()
            .unwrap()
    };
    // The token may not read datacenter.cfg (no Sys.Audit on /): only the
    // tags it may set now, from the guests it sees.
    let t = finding(&doctor::run(&lab().await.state().await));
    assert_eq!(t.severity, Severity::Info, "{t:?}");
    assert!(
        t.finding.contains("needs Sys.Audit on /")
            && t.finding.contains("csi-holder, csi-volume, csi-replicated"),
        "{t:?}"
    );
    let audit =
        |policy: &str| CLUSTER.replace("CSI: [VM.Audit,", "CSI: [Sys.Audit, VM.Audit,") + policy;
    let lab = lab_with(&audit(
        "user-tag-access: { user-allow: list, user-allow-list: [team-a, proxmox-csi] }\n",
    ))
    .await;
    let t = finding(&doctor::run(&lab.state().await));
    assert_eq!(t.severity, Severity::Error, "{t:?}");
    assert!(
        t.finding.contains("user-tag-access is list and does not admit csi-holder, csi-snapshot, csi-volume, csi-replicated"),
        "{t:?}"
    );
    assert_eq!(
        t.remedy,
        "pvesh set /cluster/options --user-tag-access 'user-allow=list,user-allow-list=csi-holder;csi-replicated;csi-snapshot;csi-volume;proxmox-csi;team-a'"
    );
    let lab = lab_with(&audit("registered-tags: [proxmox-csi]\n")).await;
    let t = finding(&doctor::run(&lab.state().await));
    assert_eq!(t.severity, Severity::Error, "{t:?}");
    assert!(
        t.finding.contains("registered-tags holds proxmox-csi"),
        "{t:?}"
    );
    let lab = lab_with(&audit("")).await;
    let t = finding(&doctor::run(&lab.state().await));
    assert_eq!(
        (t.severity, t.finding.as_str()),
        (
            Severity::Ok,
            "user-tag-access is free: any tag not registered may be set"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_holds_proxmox_and_kubernetes_to_the_support_matrix() {
    let versions = |findings: &[doctor::Finding]| {
        findings
            .iter()
            .filter(|x| x.check == "versions")
            .map(|x| (x.subject.clone(), x.severity, x.finding.clone()))
            .collect::<Vec<_>>()
    };
    let found = versions(&doctor::run(&lab().await.state().await));
    assert_eq!(
        found,
        vec![
            (
                "region-1".to_string(),
                Severity::Ok,
                "Proxmox VE 9.0.3 (supported: 8.x, 9.x)".to_string()
            ),
            (
                "kubernetes".to_string(),
                Severity::Warning,
                "Kubernetes v1.30.14 is older than this release supports (1.31–1.34)".to_string()
            ),
        ]
    );
    let lab = lab_with(&format!("version: 7.4-3\n{CLUSTER}")).await;
    let found = versions(&doctor::run(&lab.state().await));
    assert_eq!(
        found[0],
        (
            "region-1".to_string(),
            Severity::Warning,
            "Proxmox VE 7.4-3 is outside this release's support (8.x, 9.x)".to_string()
        )
    );
}

/// The doctor's findings on the lab.
async fn doctor_on_lab() -> (Lab, Vec<doctor::Finding>) {
    let lab = lab().await;
    let findings = doctor::run(&lab.state().await);
    (lab, findings)
}

/// Whether a finding of `check` on `subject` with `severity` says `text`
/// (in its finding or remedy).
fn has(
    findings: &[doctor::Finding],
    check: &str,
    subject: &str,
    severity: Severity,
    text: &str,
) -> bool {
    findings.iter().any(|x| {
        x.check == check
            && x.subject == subject
            && x.severity == severity
            && (x.finding.contains(text) || x.remedy.contains(text))
    })
}

/// The token's role, thick LVM's saferemove, the storages each node sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_token_and_each_storage() {
    let (_lab, findings) = doctor_on_lab().await;
    assert!(
        has(
            &findings,
            "token privileges",
            "region-1",
            Severity::Ok,
            "minimal CSI role"
        ),
        "{findings:#?}"
    );
    // Thick LVM: the one without saferemove leaves deleted volumes' bytes.
    assert!(
        has(
            &findings,
            "saferemove",
            "region-1/san",
            Severity::Warning,
            "pvesm set san --saferemove 1"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "saferemove",
            "region-1/san-safe",
            Severity::Ok,
            "zeroes"
        ),
        "{findings:#?}"
    );
    assert!(
        !findings
            .iter()
            .any(|x| x.check == "saferemove" && x.subject == "region-1/local-lvm"),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "storages",
            "region-1/pve2",
            Severity::Ok,
            "available: local-lvm"
        ),
        "{findings:#?}"
    );
}

/// Topology labels and the VM each Kubernetes node runs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_maps_each_node_to_its_vm_by_its_labels() {
    let (_lab, findings) = doctor_on_lab().await;
    assert!(
        has(
            &findings,
            "topology labels",
            "worker-2",
            Severity::Ok,
            "VM 112 on pve2"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "topology labels",
            "worker-3",
            Severity::Error,
            "kubectl label node worker-3 topology.kubernetes.io/zone=pve2 --overwrite"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "node → VM",
            "worker-9",
            Severity::Error,
            "no Proxmox VM is found"
        ),
        "{findings:#?}"
    );
}

/// SCSI controllers, pending changes, protection, unused and placeholder disks, free slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_what_breaks_on_each_worker_and_own_vm() {
    let (_lab, findings) = doctor_on_lab().await;
    assert!(
        has(
            &findings,
            "SCSI controller",
            "VM 113 (worker-3)",
            Severity::Error,
            "qm set 113 --scsihw virtio-scsi-pci"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "SCSI controller",
            "VM 112 (worker-2)",
            Severity::Info,
            "every detach waits for the guest to eject"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "pending changes",
            "VM 113 (worker-3)",
            Severity::Error,
            "qm set 113 --revert scsi5"
        ),
        "{findings:#?}"
    );
    // A copy VM of an earlier version, unprotected; the new one is fine.
    assert!(
        has(
            &findings,
            "own VM protection",
            "VM 10000 (snapshot-old)",
            Severity::Warning,
            "qm set 10000 --protection 1"
        ),
        "{findings:#?}"
    );
    assert!(
        !findings.iter().any(|x| x.subject.starts_with("VM 10001")),
        "{findings:#?}"
    );

    assert!(
        has(
            &findings,
            "protection",
            "VM 113 (worker-3)",
            Severity::Warning,
            "qm set 113 --protection 0"
        ),
        "{findings:#?}"
    );
    assert!(
        !findings
            .iter()
            .any(|x| x.check == "protection" && x.subject == "VM 112 (worker-2)"),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "unused disks",
            "VM 113 (worker-3)",
            Severity::Error,
            "unused0: local-lvm:vm-9999-pvc-unused"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "placeholder-owned disks",
            "VM 112 (worker-2)",
            Severity::Info,
            "scsi1"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "free SCSI slots",
            "VM 112 (worker-2)",
            Severity::Ok,
            "29 of scsi1–scsi30 free"
        ),
        "{findings:#?}"
    );
}

/// Classes: what is taken with the Go driver's meaning is named, per key; another driver's classes are not read.
/// Clone copies: one whose claim was deleted while it copied (no PV names
/// its disk), one a PV holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_a_clone_copy_no_volume_holds() {
    let lab = lab_with(&CLUSTER.replace("volumes:\n", &format!("{COPIES}volumes:\n"))).await;
    let findings = doctor::run(&lab.state().await);
    assert!(
        has(
            &findings,
            "unclaimed copy",
            "VM 10002 (pvc-0e9d8c7b-6a5f-4e3d-2c1b-a09876543210)",
            Severity::Warning,
            "if no claim has UID 0e9d8c7b-6a5f-4e3d-2c1b-a09876543210"
        ),
        "{findings:#?}"
    );
    assert!(
        !findings.iter().any(|x| x.subject.starts_with("VM 10003")),
        "{findings:#?}"
    );
}

const COPIES: &str = r#"  - { vmid: 10002, node: pve1, name: pvc-0e9d8c7b-6a5f-4e3d-2c1b-a09876543210, config: { tags: "proxmox-csi;csi-volume", protection: "1", unused0: "local-lvm:vm-10002-disk-0" } }
  - { vmid: 10003, node: pve1, name: pvc-held, config: { tags: "proxmox-csi;csi-volume", protection: "1", unused0: "local-lvm:vm-10003-disk-0" } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reads_each_class_with_the_go_drivers_meaning() {
    let (_lab, findings) = doctor_on_lab().await;
    // Classes: what is taken with the Go driver's meaning is named, per key.
    assert!(
        has(
            &findings,
            "class parameters",
            "StorageClass proxmox-data",
            Severity::Ok,
            "read as written"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "class parameters",
            "StorageClass proxmox-legacy",
            Severity::Warning,
            "ssd: \"yes\" is not a boolean (true, false, 1, 0, t, f), taken as false as the Go driver does; \
             tier: not a parameter of this driver, ignored"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "class parameters",
            "StorageClass proxmox-broken",
            Severity::Error,
            "parameter diskIOPS: \"lots\" is not a number"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "class parameters",
            "VolumeAttributesClass unlimited",
            Severity::Warning,
            "diskIOPS: 0 or less sets no limit; the disk keeps the limit it has; replicateSchedule: accepted and not acted on"
        ),
        "{findings:#?}"
    );
    assert!(
        has(
            &findings,
            "class parameters",
            "VolumeSnapshotClass proxmox-snapshot",
            Severity::Warning,
            "zone"
        ),
        "{findings:#?}"
    );
    assert!(!findings.iter().any(|x| x.subject.contains("other")));
    assert!(doctor::failed(&findings));
}

/// The binary: a table, JSON for scripts, exit code 1 when something is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_prints_a_table_or_json_and_exits_1_on_an_error() {
    let (lab, findings) = doctor_on_lab().await;
    let (code, table, _) = lab.cli(&["doctor"]);
    assert_eq!(code, 1, "{table}");
    assert!(
        table.starts_with("STATUS")
            && table.lines().next().unwrap().contains(" CHECK ")
            && table.contains("ERROR")
            && !table.contains("\x1b["),
        "no colour off a TTY:\n{table}"
    );
    let (code, json, err) = lab.cli(&["-o", "json", "doctor"]);
    assert_eq!(code, 1, "{err}");
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v.as_array().unwrap().len(), findings.len());
    assert!(
        v.as_array()
            .unwrap()
            .iter()
            .any(|x| x["severity"] == "error" && x["check"] == "SCSI controller")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_lists_orphans_and_deletes_only_with_yes_and_never_a_referenced_disk() {
    let lab = lab().await;
    let opts = pvecsictl::clean::Options {
        include_unattributed: true,
        ..Default::default()
    };
    let orphans = pvecsictl::clean::orphans(&lab.state().await, &opts, i64::MAX / 2);
    let names: Vec<(&str, &Verdict)> = orphans
        .iter()
        .map(|o| (o.volid.as_str(), &o.verdict))
        .collect();
    assert_eq!(
        names,
        [
            ("local-lvm:vm-9999-pvc-orphan", &Verdict::Delete),
            // Only a change left pending on VM 113 names it: kept too.
            (
                "local-lvm:vm-9999-pvc-stray",
                &Verdict::Keep(Keep::AttachedTo { vmids: vec![113] })
            ),
            (
                "local-lvm:vm-9999-pvc-unused",
                &Verdict::Keep(Keep::AttachedTo { vmids: vec![113] })
            )
        ],
        "the bound disk and other VMs' disks are not orphans"
    );
    let volumes = || async {
        let v: Value = reqwest::get(format!("http://{}/pvesim/volumes", lab.sim.addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["volid"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let (code, table, err) = lab.cli(&["clean"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        table.contains("vm-9999-pvc-orphan")
            && table.contains("2.0 GiB")
            && table.contains("kept: VM [113] refers to it")
            && table.contains("kept: no cluster id in its name"),
        "{table}"
    );
    assert_eq!(volumes().await.len(), 5, "without --yes nothing is deleted");
    let (code, _, err) = lab.cli(&["clean", "--yes", "--min-age-hours", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("1 disk(s) carry no cluster id")
            || err.contains("disk(s) carry no cluster id"),
        "{err}"
    );
    assert_eq!(volumes().await.len(), 5, "a refused --yes deletes nothing");
    let told = [
        "--min-age-hours",
        "0",
        "--cluster-id",
        "1ab0c0de0000",
        "--include-unattributed",
    ];
    let (code, table, err) = lab.cli(&[&["clean"][..], &told].concat());
    assert_eq!(code, 0, "{err}");
    assert!(table.contains("delete"), "{table}");
    assert!(
        err.contains("nothing deleted; run again with --yes to delete the 1 disk(s)"),
        "{err}"
    );
    let (code, _, err) = lab.cli(&[&["clean", "--yes"][..], &told].concat());
    assert_eq!(code, 0, "{err}");
    let left = volumes().await;
    assert!(!left.iter().any(|v| v.ends_with("pvc-orphan")), "{left:?}");
    for kept in [
        "vm-9999-pvc-bound",
        "vm-9999-pvc-unused",
        "vm-9999-pvc-stray",
        "vm-100-disk-0",
    ] {
        assert!(
            left.iter().any(|v| v.ends_with(kept)),
            "{kept} must stay: {left:?}"
        );
    }
}
