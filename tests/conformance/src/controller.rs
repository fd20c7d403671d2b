//! Identity and Controller clauses, against the controller on pvesim (a
//! simulated Proxmox cluster with a running worker VM, `worker-2`/112).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use callers::{PersistentVolume, attacher, health, provisioner, resizer, sanity, snapshotter};
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::csi::identity::Identity;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_controller::pve;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use proxmox_csi_proto::csi::v1::identity_server::Identity as _;
use proxmox_csi_proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::{Code, Request};

use crate::{Report, ensure, expect_code, ok};

const SECRET: &str = "5f0c6e8a-1234-4b5c-9d7e-0123456789ab";
const CLUSTER: &str = r#"
cluster: lab
nodes: [{ name: pve1 }, { name: pve2 }]
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
vms:
  - { vmid: 112, node: pve2, name: worker-2, config: { scsihw: virtio-scsi-pci } }
  - { vmid: 113, node: pve2, name: worker-3, config: { scsihw: virtio-scsi-pci } }
users:
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Clone, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }
"#;

/// The controller under test and the simulator it talks to.
struct Target {
    _sim: pvesim::Running,
    ctl: ControllerService,
    ident: Identity,
}

/// A volume id the driver never gave out: the one field the NOT_FOUND
/// clauses change in a request built for a real volume.
const NEVER: &str = "region-1/pve2/local-lvm/vm-9999-pvc-never";

/// The StorageClass of every volume here: local-lvm, ext4.
fn class() -> provisioner::StorageClass {
    provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ])
}

/// The claim behind a volume named `name` (`pvc-<uid>`, as the provisioner
/// names volumes).
fn claim(name: &str, bytes: i64) -> provisioner::Claim {
    provisioner::Claim::new(name, name.strip_prefix("pvc-").unwrap_or(name), bytes)
}

fn topology(zone: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([
            (
                "topology.kubernetes.io/region".to_string(),
                "region-1".to_string(),
            ),
            ("topology.kubernetes.io/zone".to_string(), zone.to_string()),
        ]),
    }
}

/// The provisioner's topology requirement with the pod's node in `zone`.
fn requirement(zone: &str) -> csi::TopologyRequirement {
    provisioner::requirement(
        &[&[
            ("topology.kubernetes.io/region", "region-1"),
            ("topology.kubernetes.io/zone", zone),
        ]],
        0,
    )
}

/// CreateVolume as the external-provisioner sends it for `claim`, the pod's node on pve2.
fn create_for(claim: &provisioner::Claim) -> csi::CreateVolumeRequest {
    provisioner::create_volume(&class(), claim, Some(requirement("pve2")))
}

fn create(name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    create_for(&claim(name, bytes))
}

/// The claim `name` provisioned: CreateVolume as the provisioner sends it,
/// then the PersistentVolume it writes from the answer.
async fn provision(c: &ControllerService, name: &str) -> Result<PersistentVolume, String> {
    let claim = claim(name, 1 << 30);
    let volume = ok(c.create_volume(Request::new(create_for(&claim))).await)?
        .into_inner()
        .volume
        .unwrap_or_default();
    Ok(provisioner::persistent_volume(&class(), &claim, &volume))
}

// Without its pvesim and controller the suite cannot run at all: stop there.
#[allow(clippy::expect_used)]
async fn start() -> Target {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = pvesim::Sim::new(pvesim::State::from_yaml(CLUSTER).expect("cluster"))
        .plain_http()
        .start("127.0.0.1:0")
        .await
        .expect("pvesim");
    let cfg = CloudConfig::parse(&format!(
        "clusters:\n  - url: {}\n    token_id: kubernetes-csi@pve!csi\n    token_secret: {SECRET}\n    region: region-1\n",
        sim.api_url()
    ))
    .expect("cloud config");
    let clients: Vec<Arc<pve::Client>> = cfg
        .clusters
        .into_iter()
        .map(|c| pve::Client::new(c, Duration::from_secs(10), Default::default()).map(Arc::new))
        .collect::<Result<_, _>>()
        .expect("clients");
    let ident = Identity::new(
        "csi.proxmox.sinextra.dev".into(),
        clients.clone(),
        Duration::from_secs(5),
    );
    let ctl = ControllerService(Arc::new(Controller::new(
        clients,
        cfg.controller_vmid,
        Duration::from_secs(20),
    )));
    Target {
        _sim: sim,
        ctl,
        ident,
    }
}

/// Runs every Identity and Controller clause.
pub async fn run(report: &mut Report) {
    let t = start().await;
    identity(&t, report).await;
    let caps = capabilities(&t, report).await;
    create_volume(&t, report).await;
    delete_volume(&t, report).await;
    publish_unpublish(&t, report).await;
    validate_and_get(&t, report).await;
    list_volumes(&t, report, &caps).await;
    capacity_and_expand(&t, report).await;
    snapshots(&t, report).await;
}

async fn identity(t: &Target, r: &mut Report) {
    let info = ok(t
        .ident
        .get_plugin_info(Request::new(callers::identity::get_plugin_info()))
        .await)
    .map(|x| x.into_inner());
    r.clause(
        "GetPluginInfo: name MUST follow domain name notation and be at most 63 characters",
        info.as_ref().map_err(Clone::clone).and_then(|i| {
            ensure(
                i.name.len() <= 63
                    && i.name.contains('.')
                    && i.name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'),
                || format!("name {:?}", i.name),
            )
        }),
    );
    r.clause(
        "GetPluginInfo: vendor_version MUST be set",
        info.as_ref().map_err(Clone::clone).and_then(|i| {
            ensure(!i.vendor_version.is_empty(), || {
                "empty vendor_version".into()
            })
        }),
    );
    let probe = ok(t
        .ident
        .probe(Request::new(callers::identity::probe()))
        .await)
    .map(|p| p.into_inner().ready);
    r.clause(
        "Probe: answers, ready while Proxmox does",
        probe.and_then(|ready| ensure(ready == Some(true), || format!("ready {ready:?}"))),
    );
    let pcaps = ok(t
        .ident
        .get_plugin_capabilities(Request::new(callers::identity::get_plugin_capabilities()))
        .await)
    .map(|c| format!("{:?}", c.into_inner()));
    r.clause(
        "GetPluginCapabilities: CONTROLLER_SERVICE and VOLUME_ACCESSIBILITY_CONSTRAINTS, as the controller serves and volumes are topology-bound",
        pcaps.and_then(|c| ensure(c.contains("ControllerService") && c.contains("VolumeAccessibilityConstraints"), || c)),
    );
}

async fn capabilities(t: &Target, r: &mut Report) -> Vec<Rpc> {
    let caps: Vec<Rpc> = match ok(t
        .ctl
        .controller_get_capabilities(Request::new(
            callers::identity::controller_get_capabilities(),
        ))
        .await)
    {
        Ok(c) => c
            .into_inner()
            .capabilities
            .iter()
            .filter_map(|c| {
                c.r#type
                    .as_ref()
                    .map(|csi::controller_service_capability::Type::Rpc(x)| x.r#type())
            })
            .collect(),
        Err(e) => {
            r.clause("ControllerGetCapabilities: answers", Err(e));
            return Vec::new();
        }
    };
    // Every advertised RPC is served: its sender's request with the name or
    // id it is about removed is refused as INVALID_ARGUMENT, never
    // UNIMPLEMENTED (and creates nothing).
    let c = &t.ctl;
    let pv = provisioner::persistent_volume(
        &class(),
        &claim("pvc-conf-probe", 1 << 30),
        &csi::Volume {
            volume_id: NEVER.into(),
            ..Default::default()
        },
    );
    let mut unimplemented = Vec::new();
    for rpc in &caps {
        let code = match rpc {
            Rpc::CreateDeleteVolume => c
                .create_volume(Request::new({
                    let mut q = create("pvc-conf-probe", 1 << 30);
                    q.name.clear();
                    q
                }))
                .await
                .err(),
            Rpc::PublishUnpublishVolume => c
                .controller_publish_volume(Request::new({
                    let mut q = attacher::controller_publish(&pv, "worker-2");
                    q.volume_id.clear();
                    q
                }))
                .await
                .err(),
            Rpc::ListVolumes => None,
            Rpc::GetCapacity => None,
            Rpc::CreateDeleteSnapshot => c
                .create_snapshot(Request::new({
                    let mut q = snapshotter::create_snapshot("conf-probe", "conf-probe", &pv, &[]);
                    q.source_volume_id.clear();
                    q
                }))
                .await
                .err(),
            Rpc::ListSnapshots => None,
            Rpc::ExpandVolume => c
                .controller_expand_volume(Request::new({
                    let mut q = resizer::controller_expand(&pv, 2 << 30);
                    q.volume_id.clear();
                    q
                }))
                .await
                .err(),
            Rpc::GetVolume => c
                .controller_get_volume(Request::new({
                    let mut q = health::controller_get_volume(&pv);
                    q.volume_id.clear();
                    q
                }))
                .await
                .err(),
            Rpc::ModifyVolume => c
                .controller_modify_volume(Request::new({
                    let mut q = resizer::controller_modify(&pv, &[("diskIOPS", "100")]);
                    q.volume_id.clear();
                    q
                }))
                .await
                .err(),
            Rpc::GetSnapshot => c
                .get_snapshot(Request::new({
                    let mut q = sanity::get_snapshot("region-1/pve2/local-lvm/snapshot-vm-777");
                    q.snapshot_id.clear();
                    q
                }))
                .await
                .err(),
            _ => None,
        }
        .map(|s| s.code());
        if code == Some(Code::Unimplemented) {
            unimplemented.push(*rpc);
        }
    }
    r.clause(
        "ControllerGetCapabilities: every advertised RPC is implemented",
        ensure(!caps.is_empty() && unimplemented.is_empty(), || {
            format!("UNIMPLEMENTED: {unimplemented:?}")
        }),
    );
    caps
}

async fn create_volume(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let mut no_name = create("pvc-conf-noname", 1 << 30);
    no_name.name.clear(); // the spec's missing-name case
    r.clause(
        "CreateVolume: a missing name is INVALID_ARGUMENT",
        expect_code(
            c.create_volume(Request::new(no_name)).await,
            Code::InvalidArgument,
        ),
    );
    let mut no_caps = create("pvc-conf-nocaps", 1 << 30);
    no_caps.volume_capabilities.clear(); // the spec's missing-capabilities case
    r.clause(
        "CreateVolume: missing volume_capabilities is INVALID_ARGUMENT",
        expect_code(
            c.create_volume(Request::new(no_caps)).await,
            Code::InvalidArgument,
        ),
    );
    // A ReadWriteMany claim: the provisioner asks for MULTI_NODE_MULTI_WRITER.
    let multi =
        create_for(&claim("pvc-conf-multi", 1 << 30).access(&[callers::AccessMode::ReadWriteMany]));
    r.clause(
        "CreateVolume: an unsupported capability is INVALID_ARGUMENT",
        expect_code(
            c.create_volume(Request::new(multi)).await,
            Code::InvalidArgument,
        ),
    );

    let first = ok(c
        .create_volume(Request::new(create("pvc-conf-a", 1 << 30)))
        .await)
    .map(|v| v.into_inner().volume);
    let again = ok(c
        .create_volume(Request::new(create("pvc-conf-a", 1 << 30)))
        .await)
    .map(|v| v.into_inner().volume);
    r.clause(
        "CreateVolume: the same name and parameters again answer the same volume (idempotent)",
        match (&first, &again) {
            (Ok(Some(a)), Ok(Some(b))) => ensure(a == b, || format!("{a:?} != {b:?}")),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "CreateVolume: capacity_bytes is at least required_bytes",
        match &first {
            Ok(Some(v)) => ensure(v.capacity_bytes >= 1 << 30, || {
                format!("{} bytes", v.capacity_bytes)
            }),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "CreateVolume: accessible_topology satisfies the requisite topology",
        match &first {
            Ok(Some(v)) => ensure(
                !v.accessible_topology.is_empty()
                    && v.accessible_topology.iter().all(|x| *x == topology("pve2")),
                || format!("{:?}", v.accessible_topology),
            ),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "CreateVolume: the same name with an incompatible capacity is ALREADY_EXISTS",
        expect_code(
            c.create_volume(Request::new(create("pvc-conf-a", 5 << 30)))
                .await,
            Code::AlreadyExists,
        ),
    );
    let mut limited = create("pvc-conf-lim", 600 << 20);
    if let Some(range) = limited.capacity_range.as_mut() {
        range.limit_bytes = 1000 << 20; // the provisioner sends no limit; the spec allows one
    }
    r.clause(
        "CreateVolume: a capacity range the plugin cannot honour is OUT_OF_RANGE",
        expect_code(
            c.create_volume(Request::new(limited)).await,
            Code::OutOfRange,
        ),
    );
    let mut within = create("pvc-conf-within", 100 << 20);
    if let Some(range) = within.capacity_range.as_mut() {
        range.limit_bytes = 1 << 30; // the provisioner sends no limit; the spec allows one
    }
    r.clause(
        "CreateVolume: capacity_bytes is at most limit_bytes",
        ok(c.create_volume(Request::new(within)).await).and_then(|v| {
            let b = v
                .into_inner()
                .volume
                .map(|v| v.capacity_bytes)
                .unwrap_or(-1);
            ensure((100 << 20..=1 << 30).contains(&b), || format!("{b} bytes"))
        }),
    );
    // A claim whose dataSource is a VolumeSnapshot with a handle that names no snapshot.
    let from_missing = create_for(
        &claim("pvc-conf-src", 1 << 30).from_snapshot("region-1/pve2/local-lvm/snapshot-vm-777"),
    );
    r.clause(
        "CreateVolume: a content source that does not exist is NOT_FOUND",
        expect_code(
            c.create_volume(Request::new(from_missing)).await,
            Code::NotFound,
        ),
    );
    // The pod's node in a zone without any Proxmox node.
    let elsewhere = provisioner::create_volume(
        &class(),
        &claim("pvc-conf-zone", 1 << 30),
        Some(requirement("pve9")),
    );
    r.clause(
        "CreateVolume: no provisioning possible in the requisite topology is RESOURCE_EXHAUSTED",
        expect_code(
            c.create_volume(Request::new(elsewhere)).await,
            Code::ResourceExhausted,
        ),
    );
}

async fn delete_volume(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let pv = match provision(c, "pvc-conf-del").await {
        Ok(pv) => pv,
        Err(e) => return r.clause("DeleteVolume: a volume to delete", Err(e)),
    };
    let mut no_id = provisioner::delete_volume(&pv);
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "DeleteVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(
            c.delete_volume(Request::new(no_id)).await,
            Code::InvalidArgument,
        ),
    );
    let mut unknown = provisioner::delete_volume(&pv);
    unknown.volume_id = NEVER.into(); // a volume that does not exist
    r.clause(
        "DeleteVolume: a volume that does not exist is deleted already (OK)",
        ok(c.delete_volume(Request::new(unknown)).await).map(|_| ()),
    );
    let twice = ok(c
        .delete_volume(Request::new(provisioner::delete_volume(&pv)))
        .await)
    .and(ok(c
        .delete_volume(Request::new(provisioner::delete_volume(&pv)))
        .await))
    .map(|_| ());
    r.clause("DeleteVolume: deleting twice answers OK both times", twice);
    let outcome = match provision(c, "pvc-conf-busy").await {
        Ok(pv) => match ok(c
            .controller_publish_volume(Request::new(attacher::controller_publish(&pv, "worker-2")))
            .await)
        {
            Ok(_) => {
                let res = expect_code(
                    c.delete_volume(Request::new(provisioner::delete_volume(&pv)))
                        .await,
                    Code::FailedPrecondition,
                );
                let _ = c
                    .controller_unpublish_volume(Request::new(attacher::controller_unpublish(
                        &pv, "worker-2",
                    )))
                    .await;
                let _ = c
                    .delete_volume(Request::new(provisioner::delete_volume(&pv)))
                    .await;
                res
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    r.clause(
        "DeleteVolume: a volume in use is FAILED_PRECONDITION",
        outcome,
    );
}

async fn publish_unpublish(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let pv = match provision(c, "pvc-conf-pub").await {
        Ok(pv) => pv,
        Err(e) => {
            r.clause("ControllerPublishVolume: a volume to publish", Err(e));
            return;
        }
    };
    let publish = |node: &str| attacher::controller_publish(&pv, node);
    // The spec's missing-field cases: the attacher's request, one field then removed.
    for (field, req) in [
        ("volume_id", {
            let mut q = publish("worker-2");
            q.volume_id.clear();
            q
        }),
        ("node_id", {
            let mut q = publish("worker-2");
            q.node_id.clear();
            q
        }),
        ("volume_capability", {
            let mut q = publish("worker-2");
            q.volume_capability = None;
            q
        }),
    ] {
        r.clause(
            &format!("ControllerPublishVolume: a missing {field} is INVALID_ARGUMENT"),
            expect_code(
                c.controller_publish_volume(Request::new(req)).await,
                Code::InvalidArgument,
            ),
        );
    }
    let mut unknown = publish("worker-2");
    unknown.volume_id = NEVER.into(); // a volume that does not exist
    r.clause(
        "ControllerPublishVolume: a volume that does not exist is NOT_FOUND",
        expect_code(
            c.controller_publish_volume(Request::new(unknown)).await,
            Code::NotFound,
        ),
    );
    r.clause(
        "ControllerPublishVolume: a node that does not exist is NOT_FOUND",
        expect_code(
            c.controller_publish_volume(Request::new(publish("worker-99")))
                .await,
            Code::NotFound,
        ),
    );
    let a = ok(c
        .controller_publish_volume(Request::new(publish("worker-2")))
        .await)
    .map(|x| x.into_inner().publish_context);
    let b = ok(c
        .controller_publish_volume(Request::new(publish("worker-2")))
        .await)
    .map(|x| x.into_inner().publish_context);
    r.clause(
        "ControllerPublishVolume: publishing again to the same node answers OK with the same publish_context",
        match (a, b) {
            (Ok(a), Ok(b)) => ensure(a == b && !a.is_empty(), || format!("{a:?} != {b:?}")),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "ControllerPublishVolume: a single-node volume published elsewhere is FAILED_PRECONDITION",
        expect_code(
            c.controller_publish_volume(Request::new(publish("worker-3")))
                .await,
            Code::FailedPrecondition,
        ),
    );
    let unpub = |node: &str| attacher::controller_unpublish(&pv, node);
    let mut no_id = unpub("worker-2");
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "ControllerUnpublishVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(
            c.controller_unpublish_volume(Request::new(no_id)).await,
            Code::InvalidArgument,
        ),
    );
    r.clause(
        "ControllerUnpublishVolume: unpublishing twice answers OK both times",
        ok(
            c.controller_unpublish_volume(Request::new(unpub("worker-2")))
                .await,
        )
        .and(ok(c
            .controller_unpublish_volume(Request::new(unpub("worker-2")))
            .await))
        .map(|_| ()),
    );
    r.clause(
        "ControllerUnpublishVolume: a node that does not exist counts as unpublished (OK)",
        ok(
            c.controller_unpublish_volume(Request::new(unpub("worker-99")))
                .await,
        )
        .map(|_| ()),
    );
    let mut unknown = unpub("worker-2");
    unknown.volume_id = NEVER.into(); // a volume that does not exist
    r.clause(
        "ControllerUnpublishVolume: a volume that does not exist counts as unpublished (OK)",
        ok(c.controller_unpublish_volume(Request::new(unknown)).await).map(|_| ()),
    );
}

async fn validate_and_get(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let pv = match provision(c, "pvc-conf-val").await {
        Ok(pv) => pv,
        Err(e) => return r.clause("ValidateVolumeCapabilities: a volume to validate", Err(e)),
    };
    let id = pv.handle.clone();
    let validate = || sanity::validate_volume_capabilities(&pv);
    let mut no_id = validate();
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "ValidateVolumeCapabilities: a missing volume_id is INVALID_ARGUMENT",
        expect_code(
            c.validate_volume_capabilities(Request::new(no_id)).await,
            Code::InvalidArgument,
        ),
    );
    let mut no_caps = validate();
    no_caps.volume_capabilities.clear(); // the spec's missing-capabilities case
    r.clause(
        "ValidateVolumeCapabilities: missing volume_capabilities is INVALID_ARGUMENT",
        expect_code(
            c.validate_volume_capabilities(Request::new(no_caps)).await,
            Code::InvalidArgument,
        ),
    );
    let mut unknown = validate();
    unknown.volume_id = NEVER.into(); // a volume that does not exist
    r.clause(
        "ValidateVolumeCapabilities: a volume that does not exist is NOT_FOUND",
        expect_code(
            c.validate_volume_capabilities(Request::new(unknown)).await,
            Code::NotFound,
        ),
    );
    r.clause(
        "ValidateVolumeCapabilities: supported capabilities are confirmed",
        ok(c.validate_volume_capabilities(Request::new(validate()))
            .await)
        .and_then(|x| {
            ensure(x.into_inner().confirmed.is_some(), || {
                "not confirmed".into()
            })
        }),
    );
    let mut multi = validate();
    // A capability the driver does not support, in place of the volume's own.
    multi.volume_capabilities = vec![callers::capability(
        Mode::MultiNodeMultiWriter,
        pv.volume_mode,
        &pv.fs_type,
        &pv.mount_options,
    )];
    r.clause(
        "ValidateVolumeCapabilities: unsupported capabilities are not confirmed, with a message",
        ok(c.validate_volume_capabilities(Request::new(multi)).await).and_then(|x| {
            let x = x.into_inner();
            ensure(x.confirmed.is_none() && !x.message.is_empty(), || {
                format!("{x:?}")
            })
        }),
    );
    let mut unknown = health::controller_get_volume(&pv);
    unknown.volume_id = NEVER.into(); // a volume that does not exist
    r.clause(
        "ControllerGetVolume: a volume that does not exist is NOT_FOUND",
        expect_code(
            c.controller_get_volume(Request::new(unknown)).await,
            Code::NotFound,
        ),
    );
    r.clause(
        "ControllerGetVolume: answers the volume with its status",
        ok(
            c.controller_get_volume(Request::new(health::controller_get_volume(&pv)))
                .await,
        )
        .and_then(|x| {
            let x = x.into_inner();
            ensure(
                x.volume.as_ref().is_some_and(|v| v.volume_id == id) && x.status.is_some(),
                || format!("{x:?}"),
            )
        }),
    );
    let modify = |k: &str, v: &str| resizer::controller_modify(&pv, &[(k, v)]);
    let mut no_id = modify("diskIOPS", "100");
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "ControllerModifyVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(
            c.controller_modify_volume(Request::new(no_id)).await,
            Code::InvalidArgument,
        ),
    );
    r.clause(
        "ControllerModifyVolume: an unsupported mutable parameter is INVALID_ARGUMENT",
        expect_code(
            c.controller_modify_volume(Request::new(modify("storage", "other")))
                .await,
            Code::InvalidArgument,
        ),
    );
    let mut unknown = modify("diskIOPS", "100");
    unknown.volume_id = NEVER.into(); // a volume that does not exist
    r.clause(
        "ControllerModifyVolume: a volume that does not exist is NOT_FOUND",
        expect_code(
            c.controller_modify_volume(Request::new(unknown)).await,
            Code::NotFound,
        ),
    );
}

async fn list_volumes(t: &Target, r: &mut Report, caps: &[Rpc]) {
    let c = &t.ctl;
    // The health monitor's sweep: no page size.
    let all = match ok(c.list_volumes(Request::new(health::list_volumes(""))).await) {
        Ok(x) => x.into_inner(),
        Err(e) => return r.clause("ListVolumes: answers", Err(e)),
    };
    r.clause(
        "ListVolumes: without max_entries every volume in one answer, next_token empty",
        ensure(all.entries.len() >= 3 && all.next_token.is_empty(), || {
            format!(
                "{} entries, next_token {:?}",
                all.entries.len(),
                all.next_token
            )
        }),
    );
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    let paged: Result<(), String> = loop {
        match ok(c
            .list_volumes(Request::new(sanity::list_volumes(2, &token)))
            .await)
        {
            Ok(p) => {
                let p = p.into_inner();
                if p.entries.len() > 2 {
                    break Err(format!("{} entries for max_entries 2", p.entries.len()));
                }
                seen.extend(
                    p.entries
                        .iter()
                        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone())),
                );
                pages += 1;
                if p.next_token.is_empty() || pages > 50 {
                    break Ok(());
                }
                token = p.next_token;
            }
            Err(e) => break Err(e),
        }
    };
    let mut want: Vec<String> = all
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect();
    want.sort();
    seen.sort();
    r.clause(
        "ListVolumes: max_entries is honoured and the pages together hold every volume once",
        paged.and_then(|_| ensure(seen == want, || format!("pages {seen:?} != all {want:?}"))),
    );
    r.clause(
        "ListVolumes: a starting_token not given out is ABORTED",
        expect_code(
            c.list_volumes(Request::new(sanity::list_volumes(0, "not-a-token")))
                .await,
            Code::Aborted,
        ), // a token never given out
    );
    let mut negative = sanity::list_volumes(2, "");
    negative.max_entries = -1; // a negative page size, which no caller sends
    r.clause(
        "ListVolumes: a negative max_entries is INVALID_ARGUMENT",
        expect_code(
            c.list_volumes(Request::new(negative)).await,
            Code::InvalidArgument,
        ),
    );
    if caps.contains(&Rpc::ListVolumesPublishedNodes) {
        let outcome = match provision(c, "pvc-conf-listpub").await {
            Ok(pv) => match ok(c
                .controller_publish_volume(Request::new(attacher::controller_publish(
                    &pv, "worker-2",
                )))
                .await)
            {
                // The attacher's reconcile.
                Ok(_) => {
                    ok(c.list_volumes(Request::new(attacher::list_volumes("")))
                        .await)
                    .and_then(|l| {
                        let entry =
                            l.into_inner().entries.into_iter().find(|e| {
                                e.volume.as_ref().is_some_and(|v| v.volume_id == pv.handle)
                            });
                        let nodes = entry
                            .and_then(|e| e.status)
                            .map(|s| s.published_node_ids)
                            .unwrap_or_default();
                        ensure(nodes.len() == 1, || format!("published_node_ids {nodes:?}"))
                    })
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        r.clause(
            "ListVolumes: with LIST_VOLUMES_PUBLISHED_NODES, published_node_ids names the node",
            outcome,
        );
    }
}

async fn capacity_and_expand(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    // The provisioner's capacity controller, for the CSIStorageCapacity of the class in pve2.
    let cap_req = provisioner::get_capacity(
        &class(),
        Some(&[
            ("topology.kubernetes.io/region", "region-1"),
            ("topology.kubernetes.io/zone", "pve2"),
        ]),
    );
    r.clause(
        "GetCapacity: available_capacity is not negative and maximum_volume_size is at most the storage",
        ok(c.get_capacity(Request::new(cap_req)).await).and_then(|x| {
            let x = x.into_inner();
            ensure(x.available_capacity > 0 && x.maximum_volume_size.is_some_and(|m| m > 0 && m <= 107_374_182_400), || format!("{x:?}"))
        }),
    );
    let pv = match provision(c, "pvc-conf-grow").await {
        Ok(pv) => pv,
        Err(e) => return r.clause("ControllerExpandVolume: a volume to grow", Err(e)),
    };
    let expand = |bytes: i64| resizer::controller_expand(&pv, bytes);
    let mut no_id = expand(2 << 30);
    no_id.volume_id.clear(); // the spec's missing-id case
    r.clause(
        "ControllerExpandVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(
            c.controller_expand_volume(Request::new(no_id)).await,
            Code::InvalidArgument,
        ),
    );
    let mut no_range = expand(2 << 30);
    no_range.capacity_range = None; // the spec's missing-capacity case
    r.clause(
        "ControllerExpandVolume: a missing capacity_range is INVALID_ARGUMENT",
        expect_code(
            c.controller_expand_volume(Request::new(no_range)).await,
            Code::InvalidArgument,
        ),
    );
    let mut unknown = expand(2 << 30);
    unknown.volume_id = NEVER.into(); // a volume that does not exist
    r.clause(
        "ControllerExpandVolume: a volume that does not exist is NOT_FOUND",
        expect_code(
            c.controller_expand_volume(Request::new(unknown)).await,
            Code::NotFound,
        ),
    );
    let _ = c
        .controller_publish_volume(Request::new(attacher::controller_publish(&pv, "worker-2")))
        .await;
    let a = ok(c
        .controller_expand_volume(Request::new(expand(2 << 30)))
        .await)
    .map(|x| x.into_inner().capacity_bytes);
    let b = ok(c
        .controller_expand_volume(Request::new(expand(2 << 30)))
        .await)
    .map(|x| x.into_inner().capacity_bytes);
    r.clause(
        "ControllerExpandVolume: capacity_bytes is at least required_bytes, and repeating it answers the same",
        match (a, b) {
            (Ok(a), Ok(b)) => ensure(a >= 2 << 30 && a == b, || format!("{a} then {b}")),
            other => Err(format!("{other:?}")),
        },
    );
    let mut beyond = expand((3 << 30) + 1);
    if let Some(range) = beyond.capacity_range.as_mut() {
        range.limit_bytes = 3 << 30; // the resizer sends no limit; the spec allows one
    }
    r.clause(
        "ControllerExpandVolume: a capacity beyond limit_bytes is OUT_OF_RANGE",
        expect_code(
            c.controller_expand_volume(Request::new(beyond)).await,
            Code::OutOfRange,
        ),
    );
}

async fn snapshots(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    // The snapshotter's request for the VolumeSnapshot `conf` (uid `conf`, so `snapshot-conf`) of `pv`.
    let snap = |pv: &PersistentVolume| snapshotter::create_snapshot("conf", "conf", pv, &[]);
    let src = match provision(c, "pvc-conf-snap").await {
        Ok(pv) => pv,
        Err(e) => return r.clause("CreateSnapshot: a volume to snapshot", Err(e)),
    };
    let mut no_name = snap(&src);
    no_name.name.clear(); // the spec's missing-name case
    r.clause(
        "CreateSnapshot: a missing name is INVALID_ARGUMENT",
        expect_code(
            c.create_snapshot(Request::new(no_name)).await,
            Code::InvalidArgument,
        ),
    );
    let mut no_source = snap(&src);
    no_source.source_volume_id.clear(); // the spec's missing-source case
    r.clause(
        "CreateSnapshot: a missing source_volume_id is INVALID_ARGUMENT",
        expect_code(
            c.create_snapshot(Request::new(no_source)).await,
            Code::InvalidArgument,
        ),
    );
    let mut first = None;
    for _ in 0..100 {
        match ok(c.create_snapshot(Request::new(snap(&src))).await) {
            Ok(x) => {
                let s = x.into_inner().snapshot.unwrap_or_default();
                if first.is_none() {
                    first = Some(s.clone());
                }
                if s.ready_to_use {
                    first = first.map(|f| csi::Snapshot {
                        ready_to_use: true,
                        ..f
                    });
                    break;
                }
            }
            Err(e) => {
                r.clause("CreateSnapshot: answers", Err(e));
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = first.unwrap_or_default();
    r.clause(
        "CreateSnapshot: snapshot_id, source_volume_id and creation_time are set",
        ensure(
            !s.snapshot_id.is_empty()
                && s.source_volume_id == src.handle
                && s.creation_time.is_some(),
            || format!("{s:?}"),
        ),
    );
    let again = ok(c.create_snapshot(Request::new(snap(&src))).await)
        .map(|x| x.into_inner().snapshot.unwrap_or_default());
    r.clause(
        "CreateSnapshot: the same name and source again answer the same snapshot (idempotent)",
        again.and_then(|a| {
            ensure(a.snapshot_id == s.snapshot_id && a.ready_to_use, || {
                format!("{a:?}")
            })
        }),
    );
    r.clause(
        "CreateSnapshot: the same name for another source is ALREADY_EXISTS",
        match provision(c, "pvc-conf-snap2").await {
            Ok(other) => expect_code(
                c.create_snapshot(Request::new(snap(&other))).await,
                Code::AlreadyExists,
            ),
            Err(e) => Err(e),
        },
    );
    r.clause(
        "ListSnapshots: a starting_token not given out is ABORTED",
        expect_code(
            c.list_snapshots(Request::new(sanity::list_snapshots(
                0,
                "not-a-token",
                "",
                "",
            )))
            .await,
            Code::Aborted,
        ), // a token never given out
    );
    let mut negative = sanity::list_snapshots(2, "", "", "");
    negative.max_entries = -1; // a negative page size, which no caller sends
    r.clause(
        "ListSnapshots: a negative max_entries is INVALID_ARGUMENT",
        expect_code(
            c.list_snapshots(Request::new(negative)).await,
            Code::InvalidArgument,
        ),
    );
    // The snapshotter's status check of a pre-provisioned VolumeSnapshotContent whose handle names no snapshot.
    r.clause(
        "ListSnapshots: filtering by a snapshot_id that does not exist answers an empty list, not an error",
        ok(c.list_snapshots(Request::new(snapshotter::list_snapshot("region-1/pve2/local-lvm/snapshot-vm-777"))).await)
            .and_then(|x| ensure(x.into_inner().entries.is_empty(), || "entries".into())),
    );
    r.clause(
        "ListSnapshots: filtering by snapshot_id answers that snapshot",
        ok(
            c.list_snapshots(Request::new(snapshotter::list_snapshot(&s.snapshot_id)))
                .await,
        )
        .and_then(|x| {
            let e = x.into_inner().entries;
            ensure(
                e.len() == 1
                    && e[0]
                        .snapshot
                        .as_ref()
                        .is_some_and(|x| x.snapshot_id == s.snapshot_id),
                || format!("{e:?}"),
            )
        }),
    );
    r.clause(
        "GetSnapshot: a snapshot that does not exist is NOT_FOUND",
        expect_code(
            c.get_snapshot(Request::new(sanity::get_snapshot(
                "region-1/pve2/local-lvm/snapshot-vm-777",
            )))
            .await,
            Code::NotFound,
        ),
    );
    let mut small = create_for(&claim("pvc-conf-restore", 256 << 20).from_snapshot(&s.snapshot_id));
    if let Some(range) = small.capacity_range.as_mut() {
        range.limit_bytes = 512 << 20; // a limit below the snapshot's size: the provisioner sends none, the spec allows one
    }
    r.clause(
        "CreateVolume: a volume smaller than its source snapshot is OUT_OF_RANGE",
        expect_code(c.create_volume(Request::new(small)).await, Code::OutOfRange),
    );
    let restore = create_for(&claim("pvc-conf-restore", 1 << 30).from_snapshot(&s.snapshot_id));
    r.clause(
        "CreateVolume: a volume from a snapshot echoes its content_source",
        ok(c.create_volume(Request::new(restore.clone())).await).and_then(|x| {
            let v = x.into_inner().volume.unwrap_or_default();
            ensure(v.content_source == restore.volume_content_source, || {
                format!("{:?}", v.content_source)
            })
        }),
    );
    let mut no_id = snapshotter::delete_snapshot(&s.snapshot_id);
    no_id.snapshot_id.clear(); // the spec's missing-id case
    r.clause(
        "DeleteSnapshot: a missing snapshot_id is INVALID_ARGUMENT",
        expect_code(
            c.delete_snapshot(Request::new(no_id)).await,
            Code::InvalidArgument,
        ),
    );
    r.clause(
        "DeleteSnapshot: deleting twice answers OK both times",
        ok(
            c.delete_snapshot(Request::new(snapshotter::delete_snapshot(&s.snapshot_id)))
                .await,
        )
        .and(ok(c
            .delete_snapshot(Request::new(snapshotter::delete_snapshot(&s.snapshot_id)))
            .await))
        .map(|_| ()),
    );
}
