//! Identity and Controller clauses, against the controller on pvesim (a
//! simulated Proxmox cluster with a running worker VM, `worker-2`/112).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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
use proxmox_csi_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use proxmox_csi_proto::csi::v1::volume_content_source::{SnapshotSource, Type as Source};
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

fn cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume { fs_type: "ext4".into(), ..Default::default() })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn topology(zone: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([
            ("topology.kubernetes.io/region".to_string(), "region-1".to_string()),
            ("topology.kubernetes.io/zone".to_string(), zone.to_string()),
        ]),
    }
}

fn create(name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
        volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
        parameters: HashMap::from([("storage".to_string(), "local-lvm".to_string())]),
        accessibility_requirements: Some(csi::TopologyRequirement { requisite: vec![topology("pve2")], preferred: vec![topology("pve2")] }),
        ..Default::default()
    }
}

fn publish(volume_id: &str, node: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node.into(),
        volume_capability: Some(cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

async fn start() -> Target {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut sim = pvesim::Sim::new(pvesim::State::from_yaml(CLUSTER).expect("cluster")).plain_http();
    let schema = pvesim::schema::default_path();
    if schema.is_file() {
        sim = sim.with_schema(pvesim::Schema::load(&schema).expect("schema"));
    }
    let sim = sim.start("127.0.0.1:0").await.expect("pvesim");
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
    let ident = Identity::new("csi.proxmox.sinextra.dev".into(), clients.clone(), Duration::from_secs(5));
    let ctl = ControllerService(Arc::new(Controller::new(clients, cfg.controller_vmid, Duration::from_secs(20))));
    Target { _sim: sim, ctl, ident }
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
    let info = ok(t.ident.get_plugin_info(Request::new(csi::GetPluginInfoRequest {})).await).map(|x| x.into_inner());
    r.clause(
        "GetPluginInfo: name MUST follow domain name notation and be at most 63 characters",
        info.as_ref().map_err(Clone::clone).and_then(|i| {
            ensure(
                i.name.len() <= 63 && i.name.contains('.') && i.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'),
                || format!("name {:?}", i.name),
            )
        }),
    );
    r.clause(
        "GetPluginInfo: vendor_version MUST be set",
        info.as_ref().map_err(Clone::clone).and_then(|i| ensure(!i.vendor_version.is_empty(), || "empty vendor_version".into())),
    );
    let probe = ok(t.ident.probe(Request::new(csi::ProbeRequest {})).await).map(|p| p.into_inner().ready);
    r.clause("Probe: answers, ready while Proxmox does", probe.and_then(|ready| ensure(ready == Some(true), || format!("ready {ready:?}"))));
    let pcaps = ok(t.ident.get_plugin_capabilities(Request::new(csi::GetPluginCapabilitiesRequest {})).await).map(|c| format!("{:?}", c.into_inner()));
    r.clause(
        "GetPluginCapabilities: CONTROLLER_SERVICE and VOLUME_ACCESSIBILITY_CONSTRAINTS, as the controller serves and volumes are topology-bound",
        pcaps.and_then(|c| ensure(c.contains("ControllerService") && c.contains("VolumeAccessibilityConstraints"), || c)),
    );
}

async fn capabilities(t: &Target, r: &mut Report) -> Vec<Rpc> {
    let caps: Vec<Rpc> = match ok(t.ctl.controller_get_capabilities(Request::new(csi::ControllerGetCapabilitiesRequest {})).await) {
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
    // Every advertised RPC is served: an empty request is refused as
    // INVALID_ARGUMENT, never UNIMPLEMENTED.
    let c = &t.ctl;
    let mut unimplemented = Vec::new();
    for rpc in &caps {
        let code = match rpc {
            Rpc::CreateDeleteVolume => c.create_volume(Request::new(Default::default())).await.err(),
            Rpc::PublishUnpublishVolume => c.controller_publish_volume(Request::new(Default::default())).await.err(),
            Rpc::ListVolumes => None,
            Rpc::GetCapacity => None,
            Rpc::CreateDeleteSnapshot => c.create_snapshot(Request::new(Default::default())).await.err(),
            Rpc::ListSnapshots => None,
            Rpc::ExpandVolume => c.controller_expand_volume(Request::new(Default::default())).await.err(),
            Rpc::GetVolume => c.controller_get_volume(Request::new(Default::default())).await.err(),
            Rpc::ModifyVolume => c.controller_modify_volume(Request::new(Default::default())).await.err(),
            Rpc::GetSnapshot => c.get_snapshot(Request::new(Default::default())).await.err(),
            _ => None,
        }
        .map(|s| s.code());
        if code == Some(Code::Unimplemented) {
            unimplemented.push(*rpc);
        }
    }
    r.clause(
        "ControllerGetCapabilities: every advertised RPC is implemented",
        ensure(!caps.is_empty() && unimplemented.is_empty(), || format!("UNIMPLEMENTED: {unimplemented:?}")),
    );
    caps
}

async fn create_volume(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let mut no_name = create("", 1 << 30);
    no_name.name.clear();
    r.clause("CreateVolume: a missing name is INVALID_ARGUMENT", expect_code(c.create_volume(Request::new(no_name)).await, Code::InvalidArgument));
    let mut no_caps = create("pvc-conf-nocaps", 1 << 30);
    no_caps.volume_capabilities.clear();
    r.clause(
        "CreateVolume: missing volume_capabilities is INVALID_ARGUMENT",
        expect_code(c.create_volume(Request::new(no_caps)).await, Code::InvalidArgument),
    );
    let mut multi = create("pvc-conf-multi", 1 << 30);
    multi.volume_capabilities = vec![cap(Mode::MultiNodeMultiWriter)];
    r.clause(
        "CreateVolume: an unsupported capability is INVALID_ARGUMENT",
        expect_code(c.create_volume(Request::new(multi)).await, Code::InvalidArgument),
    );

    let first = ok(c.create_volume(Request::new(create("pvc-conf-a", 1 << 30))).await).map(|v| v.into_inner().volume);
    let again = ok(c.create_volume(Request::new(create("pvc-conf-a", 1 << 30))).await).map(|v| v.into_inner().volume);
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
            Ok(Some(v)) => ensure(v.capacity_bytes >= 1 << 30, || format!("{} bytes", v.capacity_bytes)),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "CreateVolume: accessible_topology satisfies the requisite topology",
        match &first {
            Ok(Some(v)) => ensure(!v.accessible_topology.is_empty() && v.accessible_topology.iter().all(|x| *x == topology("pve2")), || {
                format!("{:?}", v.accessible_topology)
            }),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "CreateVolume: the same name with an incompatible capacity is ALREADY_EXISTS",
        expect_code(c.create_volume(Request::new(create("pvc-conf-a", 5 << 30))).await, Code::AlreadyExists),
    );
    let mut limited = create("pvc-conf-lim", 1 << 30);
    limited.capacity_range = Some(csi::CapacityRange { required_bytes: 600 << 20, limit_bytes: 1000 << 20 });
    r.clause(
        "CreateVolume: a capacity range the plugin cannot honour is OUT_OF_RANGE",
        expect_code(c.create_volume(Request::new(limited)).await, Code::OutOfRange),
    );
    let mut within = create("pvc-conf-within", 1 << 30);
    within.capacity_range = Some(csi::CapacityRange { required_bytes: 100 << 20, limit_bytes: 1 << 30 });
    r.clause(
        "CreateVolume: capacity_bytes is at most limit_bytes",
        ok(c.create_volume(Request::new(within)).await).and_then(|v| {
            let b = v.into_inner().volume.map(|v| v.capacity_bytes).unwrap_or(-1);
            ensure((100 << 20..=1 << 30).contains(&b), || format!("{b} bytes"))
        }),
    );
    let mut from_missing = create("pvc-conf-src", 1 << 30);
    from_missing.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(Source::Snapshot(SnapshotSource { snapshot_id: "region-1/pve2/local-lvm/snapshot-vm-777".into() })),
    });
    r.clause(
        "CreateVolume: a content source that does not exist is NOT_FOUND",
        expect_code(c.create_volume(Request::new(from_missing)).await, Code::NotFound),
    );
    let mut elsewhere = create("pvc-conf-zone", 1 << 30);
    elsewhere.accessibility_requirements = Some(csi::TopologyRequirement { requisite: vec![topology("pve9")], preferred: vec![] });
    r.clause(
        "CreateVolume: no provisioning possible in the requisite topology is RESOURCE_EXHAUSTED",
        expect_code(c.create_volume(Request::new(elsewhere)).await, Code::ResourceExhausted),
    );
}

async fn delete_volume(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let del = |id: &str| csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() };
    r.clause("DeleteVolume: a missing volume_id is INVALID_ARGUMENT", expect_code(c.delete_volume(Request::new(del(""))).await, Code::InvalidArgument));
    r.clause(
        "DeleteVolume: a volume that does not exist is deleted already (OK)",
        ok(c.delete_volume(Request::new(del("region-1/pve2/local-lvm/vm-9999-pvc-never"))).await).map(|_| ()),
    );
    let v = ok(c.create_volume(Request::new(create("pvc-conf-del", 1 << 30))).await).map(|v| v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default());
    let twice = match v {
        Ok(id) => ok(c.delete_volume(Request::new(del(&id))).await).and(ok(c.delete_volume(Request::new(del(&id))).await)).map(|_| ()),
        Err(e) => Err(e),
    };
    r.clause("DeleteVolume: deleting twice answers OK both times", twice);
    let busy = ok(c.create_volume(Request::new(create("pvc-conf-busy", 1 << 30))).await).map(|v| v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default());
    let outcome = match busy {
        Ok(id) => match ok(c.controller_publish_volume(Request::new(publish(&id, "worker-2"))).await) {
            Ok(_) => {
                let res = expect_code(c.delete_volume(Request::new(del(&id))).await, Code::FailedPrecondition);
                let _ = c.controller_unpublish_volume(Request::new(csi::ControllerUnpublishVolumeRequest { volume_id: id.clone(), node_id: "worker-2".into(), ..Default::default() })).await;
                let _ = c.delete_volume(Request::new(del(&id))).await;
                res
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    r.clause("DeleteVolume: a volume in use is FAILED_PRECONDITION", outcome);
}

async fn publish_unpublish(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let id = match ok(c.create_volume(Request::new(create("pvc-conf-pub", 1 << 30))).await) {
        Ok(v) => v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default(),
        Err(e) => {
            r.clause("ControllerPublishVolume: a volume to publish", Err(e));
            return;
        }
    };
    for (field, req) in [
        ("volume_id", csi::ControllerPublishVolumeRequest { volume_id: String::new(), ..publish(&id, "worker-2") }),
        ("node_id", csi::ControllerPublishVolumeRequest { node_id: String::new(), ..publish(&id, "worker-2") }),
        ("volume_capability", csi::ControllerPublishVolumeRequest { volume_capability: None, ..publish(&id, "worker-2") }),
    ] {
        r.clause(
            &format!("ControllerPublishVolume: a missing {field} is INVALID_ARGUMENT"),
            expect_code(c.controller_publish_volume(Request::new(req)).await, Code::InvalidArgument),
        );
    }
    r.clause(
        "ControllerPublishVolume: a volume that does not exist is NOT_FOUND",
        expect_code(c.controller_publish_volume(Request::new(publish("region-1/pve2/local-lvm/vm-9999-pvc-never", "worker-2"))).await, Code::NotFound),
    );
    r.clause(
        "ControllerPublishVolume: a node that does not exist is NOT_FOUND",
        expect_code(c.controller_publish_volume(Request::new(publish(&id, "worker-99"))).await, Code::NotFound),
    );
    let a = ok(c.controller_publish_volume(Request::new(publish(&id, "worker-2"))).await).map(|x| x.into_inner().publish_context);
    let b = ok(c.controller_publish_volume(Request::new(publish(&id, "worker-2"))).await).map(|x| x.into_inner().publish_context);
    r.clause(
        "ControllerPublishVolume: publishing again to the same node answers OK with the same publish_context",
        match (a, b) {
            (Ok(a), Ok(b)) => ensure(a == b && !a.is_empty(), || format!("{a:?} != {b:?}")),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "ControllerPublishVolume: a single-node volume published elsewhere is FAILED_PRECONDITION",
        expect_code(c.controller_publish_volume(Request::new(publish(&id, "worker-3"))).await, Code::FailedPrecondition),
    );
    let unpub = |vol: &str, node: &str| csi::ControllerUnpublishVolumeRequest { volume_id: vol.into(), node_id: node.into(), ..Default::default() };
    r.clause(
        "ControllerUnpublishVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(c.controller_unpublish_volume(Request::new(unpub("", "worker-2"))).await, Code::InvalidArgument),
    );
    r.clause(
        "ControllerUnpublishVolume: unpublishing twice answers OK both times",
        ok(c.controller_unpublish_volume(Request::new(unpub(&id, "worker-2"))).await)
            .and(ok(c.controller_unpublish_volume(Request::new(unpub(&id, "worker-2"))).await))
            .map(|_| ()),
    );
    r.clause(
        "ControllerUnpublishVolume: a node that does not exist counts as unpublished (OK)",
        ok(c.controller_unpublish_volume(Request::new(unpub(&id, "worker-99"))).await).map(|_| ()),
    );
    r.clause(
        "ControllerUnpublishVolume: a volume that does not exist counts as unpublished (OK)",
        ok(c.controller_unpublish_volume(Request::new(unpub("region-1/pve2/local-lvm/vm-9999-pvc-never", "worker-2"))).await).map(|_| ()),
    );
}

async fn validate_and_get(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let id = match ok(c.create_volume(Request::new(create("pvc-conf-val", 1 << 30))).await) {
        Ok(v) => v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default(),
        Err(e) => return r.clause("ValidateVolumeCapabilities: a volume to validate", Err(e)),
    };
    let req = |vol: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest { volume_id: vol.into(), volume_capabilities: caps, ..Default::default() };
    r.clause(
        "ValidateVolumeCapabilities: a missing volume_id is INVALID_ARGUMENT",
        expect_code(c.validate_volume_capabilities(Request::new(req("", vec![cap(Mode::SingleNodeWriter)]))).await, Code::InvalidArgument),
    );
    r.clause(
        "ValidateVolumeCapabilities: missing volume_capabilities is INVALID_ARGUMENT",
        expect_code(c.validate_volume_capabilities(Request::new(req(&id, vec![]))).await, Code::InvalidArgument),
    );
    r.clause(
        "ValidateVolumeCapabilities: a volume that does not exist is NOT_FOUND",
        expect_code(c.validate_volume_capabilities(Request::new(req("region-1/pve2/local-lvm/vm-9999-pvc-never", vec![cap(Mode::SingleNodeWriter)]))).await, Code::NotFound),
    );
    r.clause(
        "ValidateVolumeCapabilities: supported capabilities are confirmed",
        ok(c.validate_volume_capabilities(Request::new(req(&id, vec![cap(Mode::SingleNodeWriter)]))).await)
            .and_then(|x| ensure(x.into_inner().confirmed.is_some(), || "not confirmed".into())),
    );
    r.clause(
        "ValidateVolumeCapabilities: unsupported capabilities are not confirmed, with a message",
        ok(c.validate_volume_capabilities(Request::new(req(&id, vec![cap(Mode::MultiNodeMultiWriter)]))).await).and_then(|x| {
            let x = x.into_inner();
            ensure(x.confirmed.is_none() && !x.message.is_empty(), || format!("{x:?}"))
        }),
    );
    let get = |vol: &str| csi::ControllerGetVolumeRequest { volume_id: vol.into() };
    r.clause(
        "ControllerGetVolume: a volume that does not exist is NOT_FOUND",
        expect_code(c.controller_get_volume(Request::new(get("region-1/pve2/local-lvm/vm-9999-pvc-never"))).await, Code::NotFound),
    );
    r.clause(
        "ControllerGetVolume: answers the volume with its status",
        ok(c.controller_get_volume(Request::new(get(&id))).await).and_then(|x| {
            let x = x.into_inner();
            ensure(x.volume.as_ref().is_some_and(|v| v.volume_id == id) && x.status.is_some(), || format!("{x:?}"))
        }),
    );
    let modify = |vol: &str, k: &str, v: &str| csi::ControllerModifyVolumeRequest {
        volume_id: vol.into(),
        mutable_parameters: HashMap::from([(k.to_string(), v.to_string())]),
        ..Default::default()
    };
    r.clause(
        "ControllerModifyVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(c.controller_modify_volume(Request::new(modify("", "diskIOPS", "100"))).await, Code::InvalidArgument),
    );
    r.clause(
        "ControllerModifyVolume: an unsupported mutable parameter is INVALID_ARGUMENT",
        expect_code(c.controller_modify_volume(Request::new(modify(&id, "storage", "other"))).await, Code::InvalidArgument),
    );
    r.clause(
        "ControllerModifyVolume: a volume that does not exist is NOT_FOUND",
        expect_code(c.controller_modify_volume(Request::new(modify("region-1/pve2/local-lvm/vm-9999-pvc-never", "diskIOPS", "100"))).await, Code::NotFound),
    );
}

async fn list_volumes(t: &Target, r: &mut Report, caps: &[Rpc]) {
    let c = &t.ctl;
    let list = |max: i32, token: &str| csi::ListVolumesRequest { max_entries: max, starting_token: token.into() };
    let all = match ok(c.list_volumes(Request::new(list(0, ""))).await) {
        Ok(x) => x.into_inner(),
        Err(e) => return r.clause("ListVolumes: answers", Err(e)),
    };
    r.clause(
        "ListVolumes: without max_entries every volume in one answer, next_token empty",
        ensure(all.entries.len() >= 3 && all.next_token.is_empty(), || format!("{} entries, next_token {:?}", all.entries.len(), all.next_token)),
    );
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    let paged: Result<(), String> = loop {
        match ok(c.list_volumes(Request::new(list(2, &token))).await) {
            Ok(p) => {
                let p = p.into_inner();
                if p.entries.len() > 2 {
                    break Err(format!("{} entries for max_entries 2", p.entries.len()));
                }
                seen.extend(p.entries.iter().filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone())));
                pages += 1;
                if p.next_token.is_empty() || pages > 50 {
                    break Ok(());
                }
                token = p.next_token;
            }
            Err(e) => break Err(e),
        }
    };
    let mut want: Vec<String> = all.entries.iter().filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone())).collect();
    want.sort();
    seen.sort();
    r.clause(
        "ListVolumes: max_entries is honoured and the pages together hold every volume once",
        paged.and_then(|_| ensure(seen == want, || format!("pages {seen:?} != all {want:?}"))),
    );
    r.clause(
        "ListVolumes: a starting_token not given out is ABORTED",
        expect_code(c.list_volumes(Request::new(list(0, "not-a-token"))).await, Code::Aborted),
    );
    r.clause(
        "ListVolumes: a negative max_entries is INVALID_ARGUMENT",
        expect_code(c.list_volumes(Request::new(list(-1, ""))).await, Code::InvalidArgument),
    );
    if caps.contains(&Rpc::ListVolumesPublishedNodes) {
        let published = ok(c.create_volume(Request::new(create("pvc-conf-listpub", 1 << 30))).await)
            .map(|v| v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default());
        let outcome = match published {
            Ok(id) => match ok(c.controller_publish_volume(Request::new(publish(&id, "worker-2"))).await) {
                Ok(_) => ok(c.list_volumes(Request::new(list(0, ""))).await).and_then(|l| {
                    let entry = l.into_inner().entries.into_iter().find(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == id));
                    let nodes = entry.and_then(|e| e.status).map(|s| s.published_node_ids).unwrap_or_default();
                    ensure(nodes.len() == 1, || format!("published_node_ids {nodes:?}"))
                }),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        r.clause("ListVolumes: with LIST_VOLUMES_PUBLISHED_NODES, published_node_ids names the node", outcome);
    }
}

async fn capacity_and_expand(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let cap_req = csi::GetCapacityRequest {
        volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
        parameters: HashMap::from([("storage".to_string(), "local-lvm".to_string())]),
        accessible_topology: Some(topology("pve2")),
        ..Default::default()
    };
    r.clause(
        "GetCapacity: available_capacity is not negative and maximum_volume_size is at most the storage",
        ok(c.get_capacity(Request::new(cap_req)).await).and_then(|x| {
            let x = x.into_inner();
            ensure(x.available_capacity > 0 && x.maximum_volume_size.is_some_and(|m| m > 0 && m <= 107_374_182_400), || format!("{x:?}"))
        }),
    );
    let expand = |vol: &str, bytes: i64, limit: i64| csi::ControllerExpandVolumeRequest {
        volume_id: vol.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: limit }),
        ..Default::default()
    };
    r.clause(
        "ControllerExpandVolume: a missing volume_id is INVALID_ARGUMENT",
        expect_code(c.controller_expand_volume(Request::new(expand("", 2 << 30, 0))).await, Code::InvalidArgument),
    );
    r.clause(
        "ControllerExpandVolume: a missing capacity_range is INVALID_ARGUMENT",
        expect_code(
            c.controller_expand_volume(Request::new(csi::ControllerExpandVolumeRequest { volume_id: "region-1/pve2/local-lvm/vm-9999-x".into(), ..Default::default() })).await,
            Code::InvalidArgument,
        ),
    );
    r.clause(
        "ControllerExpandVolume: a volume that does not exist is NOT_FOUND",
        expect_code(c.controller_expand_volume(Request::new(expand("region-1/pve2/local-lvm/vm-9999-pvc-never", 2 << 30, 0))).await, Code::NotFound),
    );
    let id = match ok(c.create_volume(Request::new(create("pvc-conf-grow", 1 << 30))).await) {
        Ok(v) => v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default(),
        Err(e) => return r.clause("ControllerExpandVolume: a volume to grow", Err(e)),
    };
    let _ = c.controller_publish_volume(Request::new(publish(&id, "worker-2"))).await;
    let a = ok(c.controller_expand_volume(Request::new(expand(&id, 2 << 30, 0))).await).map(|x| x.into_inner().capacity_bytes);
    let b = ok(c.controller_expand_volume(Request::new(expand(&id, 2 << 30, 0))).await).map(|x| x.into_inner().capacity_bytes);
    r.clause(
        "ControllerExpandVolume: capacity_bytes is at least required_bytes, and repeating it answers the same",
        match (a, b) {
            (Ok(a), Ok(b)) => ensure(a >= 2 << 30 && a == b, || format!("{a} then {b}")),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "ControllerExpandVolume: a capacity beyond limit_bytes is OUT_OF_RANGE",
        expect_code(c.controller_expand_volume(Request::new(expand(&id, (3 << 30) + 1, 3 << 30))).await, Code::OutOfRange),
    );
}

async fn snapshots(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let snap = |name: &str, src: &str| csi::CreateSnapshotRequest { name: name.into(), source_volume_id: src.into(), ..Default::default() };
    let src = match ok(c.create_volume(Request::new(create("pvc-conf-snap", 1 << 30))).await) {
        Ok(v) => v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default(),
        Err(e) => return r.clause("CreateSnapshot: a volume to snapshot", Err(e)),
    };
    r.clause("CreateSnapshot: a missing name is INVALID_ARGUMENT", expect_code(c.create_snapshot(Request::new(snap("", &src))).await, Code::InvalidArgument));
    r.clause(
        "CreateSnapshot: a missing source_volume_id is INVALID_ARGUMENT",
        expect_code(c.create_snapshot(Request::new(snap("snapshot-conf", ""))).await, Code::InvalidArgument),
    );
    let mut first = None;
    for _ in 0..100 {
        match ok(c.create_snapshot(Request::new(snap("snapshot-conf", &src))).await) {
            Ok(x) => {
                let s = x.into_inner().snapshot.unwrap_or_default();
                if first.is_none() {
                    first = Some(s.clone());
                }
                if s.ready_to_use {
                    first = first.map(|f| csi::Snapshot { ready_to_use: true, ..f });
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
        ensure(!s.snapshot_id.is_empty() && s.source_volume_id == src && s.creation_time.is_some(), || format!("{s:?}")),
    );
    let again = ok(c.create_snapshot(Request::new(snap("snapshot-conf", &src))).await).map(|x| x.into_inner().snapshot.unwrap_or_default());
    r.clause(
        "CreateSnapshot: the same name and source again answer the same snapshot (idempotent)",
        again.and_then(|a| ensure(a.snapshot_id == s.snapshot_id && a.ready_to_use, || format!("{a:?}"))),
    );
    let other = ok(c.create_volume(Request::new(create("pvc-conf-snap2", 1 << 30))).await).map(|v| v.into_inner().volume.map(|v| v.volume_id).unwrap_or_default());
    r.clause(
        "CreateSnapshot: the same name for another source is ALREADY_EXISTS",
        match other {
            Ok(o) => expect_code(c.create_snapshot(Request::new(snap("snapshot-conf", &o))).await, Code::AlreadyExists),
            Err(e) => Err(e),
        },
    );
    let list = |max: i32, token: &str, sid: &str| csi::ListSnapshotsRequest { max_entries: max, starting_token: token.into(), snapshot_id: sid.into(), ..Default::default() };
    r.clause(
        "ListSnapshots: a starting_token not given out is ABORTED",
        expect_code(c.list_snapshots(Request::new(list(0, "not-a-token", ""))).await, Code::Aborted),
    );
    r.clause(
        "ListSnapshots: filtering by a snapshot_id that does not exist answers an empty list, not an error",
        ok(c.list_snapshots(Request::new(list(0, "", "region-1/pve2/local-lvm/snapshot-vm-777"))).await)
            .and_then(|x| ensure(x.into_inner().entries.is_empty(), || "entries".into())),
    );
    r.clause(
        "ListSnapshots: filtering by snapshot_id answers that snapshot",
        ok(c.list_snapshots(Request::new(list(0, "", &s.snapshot_id))).await).and_then(|x| {
            let e = x.into_inner().entries;
            ensure(e.len() == 1 && e[0].snapshot.as_ref().is_some_and(|x| x.snapshot_id == s.snapshot_id), || format!("{e:?}"))
        }),
    );
    r.clause(
        "GetSnapshot: a snapshot that does not exist is NOT_FOUND",
        expect_code(c.get_snapshot(Request::new(csi::GetSnapshotRequest { snapshot_id: "region-1/pve2/local-lvm/snapshot-vm-777".into(), ..Default::default() })).await, Code::NotFound),
    );
    let mut small = create("pvc-conf-restore", 1 << 30);
    small.capacity_range = Some(csi::CapacityRange { required_bytes: 256 << 20, limit_bytes: 512 << 20 });
    small.volume_content_source = Some(csi::VolumeContentSource { r#type: Some(Source::Snapshot(SnapshotSource { snapshot_id: s.snapshot_id.clone() })) });
    r.clause(
        "CreateVolume: a volume smaller than its source snapshot is OUT_OF_RANGE",
        expect_code(c.create_volume(Request::new(small)).await, Code::OutOfRange),
    );
    let mut restore = create("pvc-conf-restore", 1 << 30);
    restore.volume_content_source = Some(csi::VolumeContentSource { r#type: Some(Source::Snapshot(SnapshotSource { snapshot_id: s.snapshot_id.clone() })) });
    r.clause(
        "CreateVolume: a volume from a snapshot echoes its content_source",
        ok(c.create_volume(Request::new(restore.clone())).await).and_then(|x| {
            let v = x.into_inner().volume.unwrap_or_default();
            ensure(v.content_source == restore.volume_content_source, || format!("{:?}", v.content_source))
        }),
    );
    let del = |sid: &str| csi::DeleteSnapshotRequest { snapshot_id: sid.into(), ..Default::default() };
    r.clause("DeleteSnapshot: a missing snapshot_id is INVALID_ARGUMENT", expect_code(c.delete_snapshot(Request::new(del(""))).await, Code::InvalidArgument));
    r.clause(
        "DeleteSnapshot: deleting twice answers OK both times",
        ok(c.delete_snapshot(Request::new(del(&s.snapshot_id))).await).and(ok(c.delete_snapshot(Request::new(del(&s.snapshot_id))).await)).map(|_| ()),
    );
}
