//! migrate against pvesim and kubesim, with the API token only: the disk
//! reaches the other Proxmox node in a carrier VM, the volume is made again
//! with its new handle and zone, and the controller publishes and deletes
//! the moved volume like any other.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::sync::Arc;
use std::time::Duration;

use proxmox_csi_controller::config::{CloudConfig, VmIds};
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::pve::Client;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use pvecsictl::migrate;
use pvecsictl::rebind::Options;
use pvecsictl::rebind::{Kube, OPERATION};
use serde_json::{Value, json};
use tonic::Request;

const HOURS: Duration = Duration::from_secs(3600);
const CLUSTER: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }]
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
vms:
  - { vmid: 111, node: pve1, name: worker-1, config: { scsihw: virtio-scsi-pci } }
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci } }
volumes:
  - { volid: "local-lvm:vm-9999-pvc-m", node: pve2, size: 1073741824 }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Migrate, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }
"#;

async fn admin(sim: &pvesim::Running, path: &str) -> Value {
    let v: Value = reqwest::get(format!("http://{}/pvesim/{path}", sim.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"].clone()
}

/// pvesim with the migration cluster, and the clients of a cloud config
/// pointing at it.
/// The token's Proxmox clients on `sim` (10 s a call).
fn clients_of(sim: &pvesim::Running) -> Vec<Arc<Client>> {
    let cfg = CloudConfig::parse(&testkit::sim::config_of(sim)).unwrap();
    cfg.clusters
        .into_iter()
        .map(|c| Arc::new(Client::new(c, Duration::from_secs(10), Default::default()).unwrap()))
        .collect()
}

async fn proxmox() -> (pvesim::Running, Vec<Arc<Client>>) {
    let sim = testkit::sim::plain(CLUSTER).await.unwrap();
    let clients = clients_of(&sim);
    (sim, clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_moves_a_local_volume_with_the_token() {
    let (sim, clients) = proxmox().await;
    let ks = kubesim::start().await.unwrap();
    ks.put("persistentvolumes", json!({"metadata": {"name": "pvc-m"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete",
        "csi": {"driver": "csi.proxmox.sinextra.dev", "volumeHandle": "region-1/pve2/local-lvm/vm-9999-pvc-m", "fsType": "ext4"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["pve2"]}]}]}},
        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data"}}}));
    ks.put("persistentvolumeclaims", json!({"metadata": {"name": "data", "namespace": "apps"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pvc-m"}}));
    let k = Kube {
        client: kube::Client::try_from(kube::Config::new(ks.url.parse().unwrap())).unwrap(),
        namespace: "apps".into(),
    };

    let plan = migrate::run(
        &k,
        &clients,
        VmIds::new(9999),
        "data",
        "pve1",
        Options {
            dry_run: true,
            ..Default::default()
        },
        HOURS,
    )
    .await
    .unwrap();
    assert!(
        plan.iter()
            .any(|s| s.contains("migrate the carrier VM offline from pve2 to pve1")),
        "{plan:?}"
    );
    assert!(
        admin(&sim, "vms").await.as_array().unwrap().len() == 2,
        "a dry run changes nothing"
    );
    let err = migrate::run(
        &k,
        &clients,
        VmIds::new(9999),
        "data",
        "pve2",
        Options::default(),
        HOURS,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("is on pve2 already"), "{err}");

    let steps = migrate::run(
        &k,
        &clients,
        VmIds::new(9999),
        "data",
        "pve1",
        Options::default(),
        HOURS,
    )
    .await
    .unwrap();
    println!("{steps:#?}");
    let vms = admin(&sim, "vms").await;
    let carrier = vms
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["config"]["name"] == "pvc-m-moved")
        .cloned()
        .expect("a carrier VM");
    let cid = carrier["vmid"].as_u64().unwrap();
    assert!(cid > 9999, "above controllerVmID: {carrier}");
    assert_eq!(carrier["node"], "pve1");
    // Protected again after its scsi0 became unused0.
    assert_eq!(carrier["config"]["protection"], "1", "{carrier}");
    assert_eq!(carrier["config"]["tags"], "proxmox-csi;csi-volume");
    assert_eq!(
        carrier["config"]["unused0"],
        format!("local-lvm:vm-{cid}-disk-0")
    );
    assert_eq!(carrier["pending"], json!({}));
    let vols = admin(&sim, "volumes").await;
    let placed: Vec<(String, String)> = vols
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["volid"].as_str().unwrap().to_string(),
                v["node"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        placed.contains(&(format!("local-lvm:vm-{cid}-disk-0"), "pve1".to_string())),
        "{placed:?}"
    );
    assert!(
        !placed.iter().any(|(v, _)| v.ends_with("vm-9999-pvc-m")),
        "the old disk is gone: {placed:?}"
    );
    let holder = vms
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["config"]["name"] == "proxmox-csi-holder-pve2")
        .cloned()
        .unwrap();
    assert!(
        !holder["config"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("scsi") && k != "scsihw"),
        "{holder}"
    );

    let pv = ks.get("persistentvolumes", "", "pvc-m").unwrap();
    let handle = format!("region-1/pve1/local-lvm/vm-{cid}-disk-0");
    assert_eq!(pv["spec"]["csi"]["volumeHandle"], handle);
    assert_eq!(pv["spec"]["csi"]["fsType"], "ext4");
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert!(
        pv["spec"]["nodeAffinity"].to_string().contains("\"pve1\""),
        "{pv}"
    );
    assert!(
        pv["metadata"]
            .get("annotations")
            .and_then(|a| a.get(OPERATION))
            .is_none()
    );
    assert_eq!(
        ks.get("persistentvolumeclaims", "apps", "data").unwrap()["status"]["phase"],
        "Bound"
    );

    // The controller takes the moved volume as any other.
    let ctl = ControllerService(Arc::new(Controller::new(
        clients.clone(),
        9999,
        Duration::from_secs(20),
    )));
    // Requests as the attacher and provisioner send them for the PV pvecsictl wrote.
    let moved = callers::PersistentVolume::from_json(&pv);
    ctl.controller_publish_volume(Request::new(callers::attacher::controller_publish(
        &moved,
        "worker-1/111",
    )))
    .await
    .unwrap();
    ctl.controller_unpublish_volume(Request::new(callers::attacher::controller_unpublish(
        &moved,
        "worker-1/111",
    )))
    .await
    .unwrap();
    ctl.delete_volume(Request::new(callers::provisioner::delete_volume(&moved)))
        .await
        .unwrap();
    assert!(
        admin(&sim, &format!("vms/{cid}")).await.is_null(),
        "the carrier goes with the volume"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_migration_is_resumed_or_rolled_back() {
    for rollback in [true, false] {
        let (_sim, clients) = proxmox().await;
        let ks = kubesim::start().await.unwrap();
        let pv = json!({"metadata": {"name": "pvc-m"}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete",
            "csi": {"driver": "csi.proxmox.sinextra.dev", "volumeHandle": "region-1/pve2/local-lvm/vm-9999-pvc-m"},
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data"}}});
        ks.put("persistentvolumes", pv.clone());
        ks.put("persistentvolumeclaims", json!({"metadata": {"name": "data", "namespace": "apps"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pvc-m"}}));
        // A run that stopped right after recording its plan.
        let plan = json!({"op": "migrate", "namespace": "apps", "claim_name": "data", "from": "pve2", "to": "pve1", "reclaim": "Delete",
            "volume": pv, "claim": ks.get("persistentvolumeclaims", "apps", "data").unwrap(), "cordoned": []});
        let mut stopped = ks.get("persistentvolumes", "", "pvc-m").unwrap();
        stopped["metadata"]["annotations"] = json!({OPERATION: plan.to_string()});
        stopped["spec"]["persistentVolumeReclaimPolicy"] = json!("Retain");
        ks.put("persistentvolumes", stopped);
        let k = Kube {
            client: kube::Client::try_from(kube::Config::new(ks.url.parse().unwrap())).unwrap(),
            namespace: "apps".into(),
        };

        let err = migrate::run(
            &k,
            &clients,
            VmIds::new(9999),
            "data",
            "pve1",
            Options::default(),
            HOURS,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--resume") && err.contains("--rollback"),
            "{err}"
        );
        let opts = Options {
            resume: !rollback,
            rollback,
            ..Default::default()
        };
        let steps = migrate::run(&k, &clients, VmIds::new(9999), "data", "pve1", opts, HOURS)
            .await
            .unwrap();
        let pv = ks.get("persistentvolumes", "", "pvc-m").unwrap();
        assert_eq!(
            pv["spec"]["persistentVolumeReclaimPolicy"], "Delete",
            "rollback={rollback}"
        );
        assert!(
            pv["metadata"]
                .get("annotations")
                .and_then(|a| a.get(OPERATION))
                .is_none(),
            "rollback={rollback}"
        );
        let handle = pv["spec"]["csi"]["volumeHandle"]
            .as_str()
            .unwrap()
            .to_string();
        if rollback {
            assert_eq!(
                steps,
                ["nothing had moved; restored pvc-m reclaimPolicy Delete"]
            );
            assert_eq!(handle, "region-1/pve2/local-lvm/vm-9999-pvc-m");
        } else {
            assert!(
                handle.starts_with("region-1/pve1/local-lvm/vm-"),
                "{handle}"
            );
            assert_eq!(
                ks.get("persistentvolumeclaims", "apps", "data").unwrap()["status"]["phase"],
                "Bound"
            );
        }
    }
}

/// Polls `f` for up to 10 s.
async fn until(mut f: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    while !f() {
        if started.elapsed() > Duration::from_secs(10) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Research §5 points 3 and 5: the volume made again is pre-bound (claimRef
/// without uid), so it is never Released and restoring `Delete` at once is
/// safe even while the binder lags; the old volume's DELETE waits for
/// pv-protection and for the attacher's finalizer until its
/// VolumeAttachment is gone, and only then is its name reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_keeps_the_disk_with_finalizers_an_attachment_and_a_lagging_binder() {
    let (sim, clients) = proxmox().await;
    let ks = kubesim::start().await.unwrap();
    let old_handle = "region-1/pve2/local-lvm/vm-9999-pvc-m";
    ks.put("persistentvolumes", json!({"metadata": {"name": "pvc-m"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete",
        "csi": {"driver": kubesim::DRIVER, "volumeHandle": old_handle},
        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data"}}}));
    ks.put("persistentvolumeclaims", json!({"metadata": {"name": "data", "namespace": "apps"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pvc-m"}}));
    // The volume was attached to worker-2: the attacher added its finalizer.
    let va = kubesim::attachment_name(old_handle, kubesim::DRIVER, "worker-2");
    ks.put(
        "volumeattachments",
        json!({"metadata": {"name": va}, "spec": {"attacher": kubesim::DRIVER,
        "nodeName": "worker-2", "source": {"persistentVolumeName": "pvc-m"}}}),
    );
    assert!(
        until(
            || ks.get("persistentvolumes", "", "pvc-m").unwrap()["metadata"]["finalizers"]
                == json!([kubesim::PV_PROTECTION, kubesim::ATTACHER_FINALIZER])
        )
        .await
    );
    assert_eq!(
        ks.get("persistentvolumes", "", "pvc-m").unwrap()["status"]["phase"],
        "Bound"
    );
    ks.set_binder_delay(Duration::from_millis(300));

    // The attach/detach controller: the attachment goes a second after the
    // volume is marked for deletion.
    let (ks2, url) = (ks.clone(), ks.url.clone());
    let detach = tokio::spawn(async move {
        let deleting = until(|| {
            ks2.get("persistentvolumes", "", "pvc-m")
                .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let held = ks2
            .get("persistentvolumes", "", "pvc-m")
            .is_some_and(|p| p["spec"]["csi"]["volumeHandle"] == old_handle);
        reqwest::Client::new()
            .delete(format!(
                "{url}/apis/storage.k8s.io/v1/volumeattachments/{va}"
            ))
            .send()
            .await
            .unwrap();
        (deleting, held)
    });
    let k = Kube {
        client: kube::Client::try_from(kube::Config::new(ks.url.parse().unwrap())).unwrap(),
        namespace: "apps".into(),
    };
    let steps = migrate::run(
        &k,
        &clients,
        VmIds::new(9999),
        "data",
        "pve1",
        Options::default(),
        HOURS,
    )
    .await
    .unwrap();
    let (deleting, held) = detach.await.unwrap();
    assert!(deleting, "the old volume was deleted: {steps:?}");
    assert!(held, "the attacher's finalizer held the old volume");
    assert!(
        steps.contains(&"deleted volume pvc-m (Retain: the disk stays)".to_string()),
        "{steps:?}"
    );

    let bound = until(|| {
        ks.get("persistentvolumeclaims", "apps", "data").unwrap()["status"]["phase"] == "Bound"
            || ks.get("persistentvolumes", "", "pvc-m").is_none()
    })
    .await;
    // Ticks enough for the provisioner to act on anything it would.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        ks.deleted_volumes(),
        Vec::<String>::new(),
        "no disk deleted"
    );
    assert!(bound, "the claim is not Bound after 10 s");
    let pv = ks.get("persistentvolumes", "", "pvc-m").unwrap();
    let claim = ks.get("persistentvolumeclaims", "apps", "data").unwrap();
    assert!(
        pv["spec"]["csi"]["volumeHandle"]
            .as_str()
            .unwrap()
            .starts_with("region-1/pve1/local-lvm/vm-"),
        "{pv}"
    );
    assert_eq!(pv["status"]["phase"], "Bound");
    assert_eq!(pv["spec"]["claimRef"]["uid"], claim["metadata"]["uid"]);
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(
        pv["metadata"]["finalizers"],
        json!([kubesim::PV_PROTECTION])
    );
    assert_eq!(claim["spec"]["volumeName"], "pvc-m");
    // The old volume went only after its attachment.
    let rv_deleted = |plural: &str| {
        ks.events(plural)
            .into_iter()
            .find(|(t, _)| t == "DELETED")
            .map(|(_, o)| {
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .unwrap()
    };
    assert!(rv_deleted("volumeattachments") < rv_deleted("persistentvolumes"));
    // The disk is on pve1, in the carrier.
    let vols = admin(&sim, "volumes").await;
    let handle = pv["spec"]["csi"]["volumeHandle"].as_str().unwrap();
    let disk = handle.rsplit('/').next().unwrap();
    assert!(
        vols.as_array()
            .unwrap()
            .iter()
            .any(|v| v["volid"] == format!("local-lvm:{disk}") && v["node"] == "pve1"),
        "{vols}"
    );
}
