//! Identity and Controller clauses, against the controller on pvesim (a
//! simulated Proxmox cluster with running worker VMs, `worker-2`/112 and
//! `worker-3`/113), with volumes on one storage of a type pvesim models.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use callers::{PersistentVolume, attacher, health, provisioner, resizer, sanity, snapshotter};
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::csi::identity::Identity;
use proxmox_csi_controller::ctl::Controller;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use proxmox_csi_proto::csi::v1::identity_server::Identity as _;
use proxmox_csi_proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::{Code, Request};

use crate::{Report, ensure, expect_code, ok};

/// The simulated cluster: two Proxmox nodes, the workers 112 and 113 on
/// pve2, and 100 GiB of `storage`, a pvesim storage of type `kind`.
fn cluster(storage: &str, kind: &str) -> String {
    testkit::sim::storage_cluster(storage, kind, STORAGE_BYTES as u64, &["pve1", "pve2"])
}

/// The size of the storage (100 GiB).
const STORAGE_BYTES: i64 = 107_374_182_400;

/// The controller under test, the simulator it talks to, and the storage
/// every volume is made on.
struct Target {
    sim: pvesim::Running,
    ctl: ControllerService,
    ident: Identity,
    storage: String,
    kind: String,
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

impl Target {
    /// Whether the storage is shared (its volumes' handles have no zone).
    fn shared(&self) -> bool {
        matches!(self.kind.as_str(), "rbd" | "nfs")
    }

    /// The StorageClass of every volume here: the storage, ext4.
    fn class(&self) -> provisioner::StorageClass {
        provisioner::StorageClass::new(&[
            ("storage", self.storage.as_str()),
            ("csi.storage.k8s.io/fstype", "ext4"),
        ])
    }

    /// A volume id the driver never gave out, in the form of its own on
    /// this storage: the one field the NOT_FOUND clauses change in a
    /// request built for a real volume.
    fn never(&self) -> String {
        let zone = if self.shared() { "" } else { "pve2" };
        let disk = match self.kind.as_str() {
            // Proxmox keeps file volumes in a directory per owner VMID.
            "dir" | "nfs" => "9999/vm-9999-pvc-never.raw",
            _ => "vm-9999-pvc-never",
        };
        format!("region-1/{zone}/{}/{disk}", self.storage)
    }

    /// A snapshot id the driver never gave out (its copy VM 777 does not exist).
    fn never_snapshot(&self) -> String {
        let zone = if self.shared() { "" } else { "pve2" };
        format!("region-1/{zone}/{}/snapshot-vm-777", self.storage)
    }

    /// CreateVolume as the external-provisioner sends it for `claim`, the
    /// pod's node on pve2.
    fn create_for(&self, claim: &provisioner::Claim) -> csi::CreateVolumeRequest {
        provisioner::create_volume(&self.class(), claim, Some(requirement("pve2")))
    }

    fn create(&self, name: &str, bytes: i64) -> csi::CreateVolumeRequest {
        self.create_for(&claim(name, bytes))
    }

    /// CreateVolume as the provisioner sends it for `claim`, again while
    /// the answer is retryable (a copy still running): the volume.
    async fn create_until_done(&self, claim: &provisioner::Claim) -> Result<csi::Volume, String> {
        let req = self.create_for(claim);
        for _ in 0..300 {
            match self.ctl.create_volume(Request::new(req.clone())).await {
                Ok(v) => return Ok(v.into_inner().volume.unwrap_or_default()),
                Err(s) if matches!(s.code(), Code::Aborted | Code::Unavailable) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(s) => return Err(format!("answered {:?}: {}", s.code(), s.message())),
            }
        }
        Err(format!(
            "CreateVolume of {} never finished",
            claim.volume_name()
        ))
    }

    /// The claim provisioned, and the PersistentVolume the provisioner
    /// writes from the answer.
    async fn provision_claim(
        &self,
        claim: &provisioner::Claim,
    ) -> Result<PersistentVolume, String> {
        let volume = self.create_until_done(claim).await?;
        Ok(provisioner::persistent_volume(
            &self.class(),
            claim,
            &volume,
        ))
    }

    /// The claim `name` of 1 GiB, provisioned.
    async fn provision(&self, name: &str) -> Result<PersistentVolume, String> {
        self.provision_claim(&claim(name, 1 << 30)).await
    }
}

// Without its pvesim and controller the suite cannot run at all: stop there.
#[allow(clippy::expect_used)]
async fn start(storage: &str, kind: &str) -> Target {
    let sim = testkit::sim::plain(&cluster(storage, kind))
        .await
        .expect("pvesim");
    let cfg = CloudConfig::parse(&testkit::sim::config_of(&sim)).expect("cloud config");
    let ident = Identity::new("csi.proxmox.sinextra.dev".into());
    let ctl = ControllerService(Arc::new(
        Controller::from_config(
            &cfg,
            Duration::from_secs(10),
            Default::default(),
            Duration::from_secs(20),
        )
        .expect("clients"),
    ));
    Target {
        sim,
        ctl,
        ident,
        storage: storage.into(),
        kind: kind.into(),
    }
}

/// Runs every Identity and Controller clause with volumes on local-lvm
/// (lvm-thin, the Proxmox installer's default storage).
pub async fn run(report: &mut Report) {
    run_on("local-lvm", "lvmthin", report).await;
}

/// Runs every Identity and Controller clause with volumes on `storage`, a
/// pvesim storage of type `kind` (`lvmthin`, `lvm`, `zfspool`, `rbd`,
/// `dir`, `nfs`).
pub async fn run_on(storage: &str, kind: &str, report: &mut Report) {
    let t = start(storage, kind).await;
    identity(&t, report).await;
    let caps = capabilities(&t, report).await;
    create_volume(&t, report, &caps).await;
    delete_volume(&t, report).await;
    publish_unpublish(&t, report).await;
    attach_limit(&t, report).await;
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
        info.as_ref()
            .map_err(Clone::clone)
            .and_then(|i| crate::check_plugin_name(&i.name)),
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
    .map(|c| c.into_inner().capabilities);
    r.clause(
        "GetPluginCapabilities: CONTROLLER_SERVICE and VOLUME_ACCESSIBILITY_CONSTRAINTS, as the controller serves and volumes are topology-bound",
        pcaps.as_ref().map_err(Clone::clone).and_then(|c| {
            let c = format!("{c:?}");
            ensure(c.contains("ControllerService") && c.contains("VolumeAccessibilityConstraints"), || c)
        }),
    );
    r.clause(
        "GetPluginCapabilities: every capability is a service or volume expansion type the spec defines",
        pcaps.and_then(|c| crate::check_plugin_capabilities(&c)),
    );
}

async fn capabilities(t: &Target, r: &mut Report) -> Vec<Rpc> {
    // Each capability's RPC type as sent, a number.
    let raw: Vec<Option<i32>> = match ok(t
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
            .map(|c| {
                c.r#type
                    .as_ref()
                    .map(|csi::controller_service_capability::Type::Rpc(x)| x.r#type)
            })
            .collect(),
        Err(e) => {
            r.clause("ControllerGetCapabilities: answers", Err(e));
            return Vec::new();
        }
    };
    let unknown: Vec<&Option<i32>> = raw
        .iter()
        .filter(|t| !t.is_some_and(|n| Rpc::try_from(n).is_ok_and(|x| x != Rpc::Unknown)))
        .collect();
    r.clause(
        "ControllerGetCapabilities: every capability is an RPC type the spec defines",
        ensure(unknown.is_empty(), || format!("unknown types {unknown:?}")),
    );
    let caps: Vec<Rpc> = raw
        .iter()
        .flatten()
        .filter_map(|n| Rpc::try_from(*n).ok())
        .collect();
    // Every advertised RPC is served: its sender's request with the name or
    // id it is about removed is refused as INVALID_ARGUMENT, never
    // UNIMPLEMENTED (and creates nothing).
    let c = &t.ctl;
    let pv = provisioner::persistent_volume(
        &t.class(),
        &claim("pvc-conf-probe", 1 << 30),
        &csi::Volume {
            volume_id: t.never(),
            ..Default::default()
        },
    );
    let mut unimplemented = Vec::new();
    for rpc in &caps {
        let code = match rpc {
            Rpc::CreateDeleteVolume => c
                .create_volume(Request::new({
                    let mut q = t.create("pvc-conf-probe", 1 << 30);
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
                    let mut q = sanity::get_snapshot(&t.never_snapshot());
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

async fn create_volume(t: &Target, r: &mut Report, caps: &[Rpc]) {
    let c = &t.ctl;
    let mut no_name = t.create("pvc-conf-noname", 1 << 30);
    no_name.name.clear(); // the spec's missing-name case
    r.clause(
        "CreateVolume: a missing name is INVALID_ARGUMENT",
        expect_code(
            c.create_volume(Request::new(no_name)).await,
            Code::InvalidArgument,
        ),
    );
    let mut no_caps = t.create("pvc-conf-nocaps", 1 << 30);
    no_caps.volume_capabilities.clear(); // the spec's missing-capabilities case
    r.clause(
        "CreateVolume: missing volume_capabilities is INVALID_ARGUMENT",
        expect_code(
            c.create_volume(Request::new(no_caps)).await,
            Code::InvalidArgument,
        ),
    );
    // A ReadWriteMany claim: the provisioner asks for MULTI_NODE_MULTI_WRITER.
    let multi = t.create_for(
        &claim("pvc-conf-multi", 1 << 30).access(&[callers::AccessMode::ReadWriteMany]),
    );
    r.clause(
        "CreateVolume: an unsupported capability is INVALID_ARGUMENT",
        expect_code(
            c.create_volume(Request::new(multi)).await,
            Code::InvalidArgument,
        ),
    );

    let first = ok(c
        .create_volume(Request::new(t.create("pvc-conf-a", 1 << 30)))
        .await)
    .map(|v| v.into_inner().volume);
    let again = ok(c
        .create_volume(Request::new(t.create("pvc-conf-a", 1 << 30)))
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
            // Accessible from the requisite term: each topology names only
            // its segments (a volume on shared storage, the region alone).
            Ok(Some(v)) => ensure(
                !v.accessible_topology.is_empty()
                    && v.accessible_topology.iter().all(|x| {
                        let term = topology("pve2").segments;
                        x.segments.iter().all(|(k, v)| term.get(k) == Some(v))
                    }),
                || format!("{:?}", v.accessible_topology),
            ),
            other => Err(format!("{other:?}")),
        },
    );
    r.clause(
        "CreateVolume: the same name with an incompatible capacity is ALREADY_EXISTS",
        expect_code(
            c.create_volume(Request::new(t.create("pvc-conf-a", 5 << 30)))
                .await,
            Code::AlreadyExists,
        ),
    );
    let mut limited = t.create("pvc-conf-lim", 600 << 20);
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
    let mut within = t.create("pvc-conf-within", 100 << 20);
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
    let from_missing =
        t.create_for(&claim("pvc-conf-src", 1 << 30).from_snapshot(&t.never_snapshot()));
    r.clause(
        "CreateVolume: a content source that does not exist is NOT_FOUND",
        expect_code(
            c.create_volume(Request::new(from_missing)).await,
            Code::NotFound,
        ),
    );
    // The pod's node in a zone without any Proxmox node.
    let elsewhere = provisioner::create_volume(
        &t.class(),
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
    let mut no_range = t.create("pvc-conf-norange", 1 << 30);
    no_range.capacity_range = None; // OPTIONAL, and the provisioner always sends it
    r.clause(
        "CreateVolume: capacity_range is OPTIONAL: without it a volume is created",
        ok(c.create_volume(Request::new(no_range)).await).and_then(|v| {
            let v = v.into_inner().volume.unwrap_or_default();
            ensure(!v.volume_id.is_empty() && v.capacity_bytes >= 0, || {
                format!("{v:?}")
            })
        }),
    );
    // csi-test's maximum-length name: the sidecars' names are shorter.
    let long = sanity::create_volume(
        &sanity::max_length_name("conf-maxlen"),
        &[("storage", t.storage.as_str())],
        1 << 30,
    );
    let a = ok(c.create_volume(Request::new(long.clone())).await).map(|v| v.into_inner().volume);
    let b = ok(c.create_volume(Request::new(long)).await).map(|v| v.into_inner().volume);
    r.clause(
        "CreateVolume: a name of 128 bytes, the general size limit, is accepted, and again answers the same volume",
        match (a, b) {
            (Ok(Some(a)), Ok(Some(b))) => ensure(
                !a.volume_id.is_empty() && a == b && a.capacity_bytes >= 1 << 30,
                || format!("{a:?} then {b:?}"),
            ),
            other => Err(format!("{other:?}")),
        },
    );
    if caps.contains(&Rpc::ModifyVolume) {
        // A claim naming a VolumeAttributesClass: its parameters go along.
        let mut vac = claim("pvc-conf-vac", 1 << 30);
        vac.mutable_parameters = HashMap::from([("diskIOPS".into(), "500".into())]);
        r.clause(
            "CreateVolume: with MODIFY_VOLUME, a VolumeAttributesClass's mutable_parameters are accepted",
            ok(c.create_volume(Request::new(t.create_for(&vac))).await).map(|_| ()),
        );
        let mut bad = claim("pvc-conf-badvac", 1 << 30);
        // A class with a key no driver reads.
        bad.mutable_parameters = HashMap::from([("noSuchKey".into(), "1".into())]);
        r.clause(
            "CreateVolume: an unsupported mutable parameter is INVALID_ARGUMENT",
            expect_code(
                c.create_volume(Request::new(t.create_for(&bad))).await,
                Code::InvalidArgument,
            ),
        );
    }
    if caps.contains(&Rpc::CloneVolume) {
        let outcome = match t.provision("pvc-conf-clonesrc").await {
            Ok(src) => {
                // A claim whose dataSource is the source's claim.
                let clone = claim("pvc-conf-clone", 1 << 30).from_volume(&src);
                let want = t.create_for(&clone).volume_content_source;
                t.create_until_done(&clone).await.and_then(|v| {
                    ensure(!v.volume_id.is_empty() && v.content_source == want, || {
                        format!("{v:?}")
                    })
                })
            }
            Err(e) => Err(e),
        };
        r.clause(
            "CreateVolume: with CLONE_VOLUME, a volume from an existing source volume is created and echoes its content_source",
            outcome,
        );
        // A claim whose dataSource is a claim bound to a PV that names no volume.
        let gone = provisioner::persistent_volume(
            &t.class(),
            &claim("pvc-conf-gone", 1 << 30),
            &csi::Volume {
                volume_id: t.never(),
                ..Default::default()
            },
        );
        r.clause(
            "CreateVolume: a source volume that does not exist is NOT_FOUND",
            expect_code(
                c.create_volume(Request::new(
                    t.create_for(&claim("pvc-conf-fromgone", 1 << 30).from_volume(&gone)),
                ))
                .await,
                Code::NotFound,
            ),
        );
    }
}

async fn delete_volume(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let pv = match t.provision("pvc-conf-del").await {
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
    unknown.volume_id = t.never(); // a volume that does not exist
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
    let mut foreign = provisioner::delete_volume(&pv);
    // A static PV whose handle is in no format this driver gives out.
    foreign.volume_id = "not-a-volume-handle".into();
    r.clause(
        "DeleteVolume: a volume_id in no format the plugin gives out names no volume (OK)",
        ok(c.delete_volume(Request::new(foreign)).await).map(|_| ()),
    );
    let outcome = match t.provision("pvc-conf-busy").await {
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
    let pv = match t.provision("pvc-conf-pub").await {
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
    unknown.volume_id = t.never(); // a volume that does not exist
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
    let mut again = Ok(());
    for _ in 0..8 {
        again = again.and(
            ok(
                c.controller_publish_volume(Request::new(publish("worker-2")))
                    .await,
            )
            .map(|_| ()),
        );
    }
    let lines = slots_of(t, 112, &pv.handle);
    r.clause(
        "ControllerPublishVolume: published ten times to the same node, the volume takes one slot (idempotent)",
        again.and_then(|_| ensure(lines.len() == 1, || format!("VM 112 holds it at {lines:?}"))),
    );
    let mut ro = publish("worker-2");
    // The attacher sends a readOnly PV's flag only to a plugin with
    // PUBLISH_READONLY; this one honours the flag all the same.
    ro.readonly = true;
    r.clause(
        "ControllerPublishVolume: published to the node already, asked again with another readonly flag is ALREADY_EXISTS",
        expect_code(
            c.controller_publish_volume(Request::new(ro)).await,
            Code::AlreadyExists,
        ),
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
    unknown.volume_id = t.never(); // a volume that does not exist
    r.clause(
        "ControllerUnpublishVolume: a volume that does not exist counts as unpublished (OK)",
        ok(c.controller_unpublish_volume(Request::new(unknown)).await).map(|_| ()),
    );
}

/// The config keys of VM `vmid` in pvesim that hold the volume `handle`.
fn slots_of(t: &Target, vmid: u32, handle: &str) -> Vec<String> {
    let parts: Vec<&str> = handle.splitn(4, '/').collect();
    let volid = match parts.as_slice() {
        [_, _, storage, disk] => format!("{storage}:{disk}"),
        _ => return Vec::new(),
    };
    let cluster = t.sim.ctx.cluster();
    cluster
        .vms
        .values()
        .filter(|vm| vm.vmid == vmid)
        .flat_map(|vm| vm.config.iter())
        .filter(|(_, line)| line.split(',').next() == Some(volid.as_str()))
        .map(|(key, _)| key.clone())
        .collect()
}

/// As many volumes as a node takes (the max_volumes_per_node NodeGetInfo
/// reports by default, the controller's limit without a Node label), then
/// one more, published to worker-3, which holds none yet.
async fn attach_limit(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let max = proxmox_csi_common::DEFAULT_MAX_VOLUMES;
    let mut pvs = Vec::new();
    let mut filled = Ok(());
    for i in 0..max {
        match t.provision(&format!("pvc-conf-max-{i}")).await {
            Ok(pv) => {
                filled = ok(c
                    .controller_publish_volume(Request::new(attacher::controller_publish(
                        &pv, "worker-3",
                    )))
                    .await)
                .map(|_| ());
                pvs.push(pv);
            }
            Err(e) => filled = Err(e),
        }
        if filled.is_err() {
            break;
        }
    }
    let outcome = match (filled, t.provision("pvc-conf-max-extra").await) {
        (Ok(()), Ok(extra)) => {
            let res = expect_code(
                c.controller_publish_volume(Request::new(attacher::controller_publish(
                    &extra, "worker-3",
                )))
                .await,
                Code::ResourceExhausted,
            );
            pvs.push(extra);
            res
        }
        (Err(e), _) | (_, Err(e)) => Err(format!("publishing {} volumes: {e}", pvs.len())),
    };
    r.clause(
        &format!(
            "ControllerPublishVolume: one volume more than max_volumes_per_node ({max}) on a node is RESOURCE_EXHAUSTED"
        ),
        outcome,
    );
    for pv in &pvs {
        let _ = c
            .controller_unpublish_volume(Request::new(attacher::controller_unpublish(
                pv, "worker-3",
            )))
            .await;
        let _ = c
            .delete_volume(Request::new(provisioner::delete_volume(pv)))
            .await;
    }
}

async fn validate_and_get(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    let pv = match t.provision("pvc-conf-val").await {
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
    unknown.volume_id = t.never(); // a volume that does not exist
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
            // A confirmation's volume_capabilities are REQUIRED.
            let confirmed = x.into_inner().confirmed;
            ensure(
                confirmed
                    .as_ref()
                    .is_some_and(|c| !c.volume_capabilities.is_empty()),
                || format!("confirmed {confirmed:?}"),
            )
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
    unknown.volume_id = t.never(); // a volume that does not exist
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
    unknown.volume_id = t.never(); // a volume that does not exist
    r.clause(
        "ControllerModifyVolume: a volume that does not exist is NOT_FOUND",
        expect_code(
            c.controller_modify_volume(Request::new(unknown)).await,
            Code::NotFound,
        ),
    );
    r.clause(
        "ControllerModifyVolume: supported mutable parameters answer OK, and again the same (idempotent)",
        ok(c.controller_modify_volume(Request::new(modify("diskIOPS", "500")))
            .await)
        .and(ok(c
            .controller_modify_volume(Request::new(modify("diskIOPS", "500")))
            .await))
        .map(|_| ()),
    );
    // A volume whose claim named a VolumeAttributesClass from the start.
    let mut vac = claim("pvc-conf-modvac", 1 << 30);
    vac.mutable_parameters = HashMap::from([("diskIOPS".into(), "500".into())]);
    let with_class = match t.provision_claim(&vac).await {
        Ok(pv) => pv,
        Err(e) => {
            return r.clause(
                "ControllerModifyVolume: a volume created with mutable_parameters",
                Err(e),
            );
        }
    };
    r.clause(
        "ControllerModifyVolume: a volume created with mutable_parameters takes new ones",
        ok(
            c.controller_modify_volume(Request::new(resizer::controller_modify(
                &with_class,
                &[("diskIOPS", "800"), ("diskMBps", "100")],
            )))
            .await,
        )
        .map(|_| ()),
    );
    r.clause(
        "ControllerModifyVolume: an unsupported mutable parameter for a volume created with mutable_parameters is INVALID_ARGUMENT",
        expect_code(
            c.controller_modify_volume(Request::new(resizer::controller_modify(
                &with_class,
                &[("noSuchKey", "1")],
            )))
            .await,
            Code::InvalidArgument,
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
    r.clause(
        "ListVolumes: every entry carries its volume with a volume_id (REQUIRED)",
        ensure(
            all.entries
                .iter()
                .all(|e| e.volume.as_ref().is_some_and(|v| !v.volume_id.is_empty())),
            || format!("{:?}", all.entries),
        ),
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
    r.clause(
        "ListVolumes: a volume created is listed, and is not once deleted",
        created_then_deleted(t).await,
    );
    r.clause(
        "ListVolumes: a next_token given out before volumes were created and deleted answers pages of at most max_entries, or ABORTED",
        paged_across_changes(t).await,
    );
    if caps.contains(&Rpc::ListVolumesPublishedNodes) {
        let outcome = match t.provision("pvc-conf-listpub").await {
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

/// Every volume id the health monitor's sweep lists.
async fn listed(t: &Target) -> Result<Vec<String>, String> {
    let all = ok(t
        .ctl
        .list_volumes(Request::new(health::list_volumes("")))
        .await)?;
    Ok(all
        .into_inner()
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect())
}

async fn created_then_deleted(t: &Target) -> Result<(), String> {
    let pv = t.provision("pvc-conf-listed").await?;
    let with = listed(t).await?;
    ok(t.ctl
        .delete_volume(Request::new(provisioner::delete_volume(&pv)))
        .await)?;
    let without = listed(t).await?;
    ensure(
        with.contains(&pv.handle) && !without.contains(&pv.handle),
        || format!("{} listed {with:?}, then {without:?}", pv.handle),
    )
}

/// The spec lets a CO paging while volumes come and go see some twice or
/// miss some; what is left to hold is max_entries, and ABORTED for a token
/// that no longer holds.
async fn paged_across_changes(t: &Target) -> Result<(), String> {
    let c = &t.ctl;
    let a = t.provision("pvc-conf-page-a").await?;
    let b = t.provision("pvc-conf-page-b").await?;
    let first = ok(c
        .list_volumes(Request::new(sanity::list_volumes(2, "")))
        .await)?
    .into_inner();
    for pv in [&a, &b] {
        ok(
            c.delete_volume(Request::new(provisioner::delete_volume(pv)))
                .await,
        )?;
    }
    let added = t.provision("pvc-conf-page-c").await?;
    let mut token = first.next_token;
    let mut outcome = Ok(());
    for _ in 0..50 {
        if token.is_empty() {
            break;
        }
        match c
            .list_volumes(Request::new(sanity::list_volumes(2, &token)))
            .await
        {
            Ok(p) => {
                let p = p.into_inner();
                if p.entries.len() > 2 {
                    outcome = Err(format!("{} entries for max_entries 2", p.entries.len()));
                    break;
                }
                token = p.next_token;
            }
            Err(s) if s.code() == Code::Aborted => break,
            Err(s) => {
                outcome = Err(format!("answered {:?}: {}", s.code(), s.message()));
                break;
            }
        }
    }
    let _ = c
        .delete_volume(Request::new(provisioner::delete_volume(&added)))
        .await;
    outcome
}

async fn capacity_and_expand(t: &Target, r: &mut Report) {
    let c = &t.ctl;
    // The provisioner's capacity controller, for the CSIStorageCapacity of the class in pve2.
    let cap_req = provisioner::get_capacity(
        &t.class(),
        Some(&[
            ("topology.kubernetes.io/region", "region-1"),
            ("topology.kubernetes.io/zone", "pve2"),
        ]),
    );
    r.clause(
        "GetCapacity: available_capacity is not negative and maximum_volume_size is at most the storage",
        ok(c.get_capacity(Request::new(cap_req)).await).and_then(|x| {
            let x = x.into_inner();
            ensure(x.available_capacity > 0 && x.maximum_volume_size.is_some_and(|m| m > 0 && m <= STORAGE_BYTES), || format!("{x:?}"))
        }),
    );
    r.clause(
        "GetCapacity: every field is OPTIONAL: without capabilities, parameters or topology it answers a capacity not negative",
        ok(c.get_capacity(Request::new(sanity::get_capacity())).await).and_then(|x| {
            let x = x.into_inner();
            ensure(x.available_capacity >= 0, || format!("{x:?}"))
        }),
    );
    r.clause(
        "ControllerExpandVolume: a volume published nowhere grows to at least required_bytes",
        match t.provision("pvc-conf-offline").await {
            Ok(pv) => ok(c
                .controller_expand_volume(Request::new(resizer::controller_expand(&pv, 2 << 30)))
                .await)
            .and_then(|x| {
                let b = x.into_inner().capacity_bytes;
                ensure(b >= 2 << 30, || format!("{b} bytes"))
            }),
            Err(e) => Err(e),
        },
    );
    let pv = match t.provision("pvc-conf-grow").await {
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
    unknown.volume_id = t.never(); // a volume that does not exist
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
    let src = match t.provision("pvc-conf-snap").await {
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
    let other = match t.provision("pvc-conf-snap2").await {
        Ok(pv) => pv,
        Err(e) => return r.clause("CreateSnapshot: a second volume to snapshot", Err(e)),
    };
    r.clause(
        "CreateSnapshot: the same name for another source is ALREADY_EXISTS",
        expect_code(
            c.create_snapshot(Request::new(snap(&other))).await,
            Code::AlreadyExists,
        ),
    );
    // csi-test's maximum-length name: the snapshotter's are shorter.
    let long = sanity::create_snapshot(&sanity::max_length_name("conf-snap-maxlen"), &src.handle);
    let a = cut(t, &long).await;
    let b = cut(t, &long).await;
    r.clause(
        "CreateSnapshot: a name of 128 bytes, the general size limit, is accepted, and again answers the same snapshot",
        match (a, b) {
            (Ok(a), Ok(b)) => ensure(
                !a.snapshot_id.is_empty() && a.snapshot_id == b.snapshot_id,
                || format!("{a:?} then {b:?}"),
            ),
            other => Err(format!("{other:?}")),
        },
    );
    // Two more: one of the other volume, and a second of `src`.
    let (s2, s3) = match (
        cut(
            t,
            &snapshotter::create_snapshot("conf2", "conf2", &other, &[]),
        )
        .await,
        cut(
            t,
            &snapshotter::create_snapshot("conf3", "conf3", &src, &[]),
        )
        .await,
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return r.clause("CreateSnapshot: more snapshots to list", Err(e));
        }
    };
    let fields = |x: &csi::Snapshot| {
        !x.snapshot_id.is_empty() && !x.source_volume_id.is_empty() && x.creation_time.is_some()
    };
    let every = ok(c
        .list_snapshots(Request::new(sanity::list_snapshots(0, "", "", "")))
        .await)
    .map(|x| x.into_inner());
    let all_ids: Vec<String> = every
        .as_ref()
        .map(|x| {
            x.entries
                .iter()
                .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.clone()))
                .collect()
        })
        .unwrap_or_default();
    r.clause(
        "ListSnapshots: without filters every snapshot, each with snapshot_id, source_volume_id and creation_time",
        every.and_then(|x| {
            ensure(
                x.next_token.is_empty()
                    && x.entries.iter().all(|e| e.snapshot.as_ref().is_some_and(fields))
                    && [&s, &s2, &s3].iter().all(|w| all_ids.contains(&w.snapshot_id)),
                || format!("{x:?}"),
            )
        }),
    );
    r.clause(
        "ListSnapshots: filtering by source_volume_id answers that volume's snapshots, and only them",
        ok(c
            .list_snapshots(Request::new(sanity::list_snapshots(0, "", &src.handle, "")))
            .await)
        .and_then(|x| {
            let e = x.into_inner().entries;
            let ids: Vec<&str> = e
                .iter()
                .filter_map(|e| e.snapshot.as_ref())
                .filter(|x| x.source_volume_id == src.handle)
                .map(|x| x.snapshot_id.as_str())
                .collect();
            ensure(
                ids.len() == e.len()
                    && ids.contains(&s.snapshot_id.as_str())
                    && ids.contains(&s3.snapshot_id.as_str())
                    && !ids.contains(&s2.snapshot_id.as_str()),
                || format!("{e:?}"),
            )
        }),
    );
    r.clause(
        "ListSnapshots: filtering by a source_volume_id that does not exist answers an empty list",
        ok(
            c.list_snapshots(Request::new(sanity::list_snapshots(0, "", &t.never(), "")))
                .await,
        )
        .and_then(|x| {
            let e = x.into_inner().entries;
            ensure(e.is_empty(), || format!("{e:?}"))
        }),
    );
    r.clause(
        "ListSnapshots: max_entries is honoured with a next_token, and the rest comes in one page from it",
        paged_snapshots(t, &all_ids).await,
    );
    let mut no_id = sanity::get_snapshot(&s2.snapshot_id);
    no_id.snapshot_id.clear(); // the spec's missing-id case
    r.clause(
        "GetSnapshot: a missing snapshot_id is INVALID_ARGUMENT",
        expect_code(
            c.get_snapshot(Request::new(no_id)).await,
            Code::InvalidArgument,
        ),
    );
    r.clause(
        "GetSnapshot: answers the snapshot, with snapshot_id, source_volume_id and creation_time",
        ok(
            c.get_snapshot(Request::new(sanity::get_snapshot(&s2.snapshot_id)))
                .await,
        )
        .and_then(|x| {
            let x = x.into_inner().snapshot.unwrap_or_default();
            ensure(
                fields(&x) && x.snapshot_id == s2.snapshot_id && x.source_volume_id == other.handle,
                || format!("{x:?}"),
            )
        }),
    );
    r.clause(
        "ListSnapshots: a snapshot cut is listed, and is not once deleted",
        cut_then_deleted(t, &src).await,
    );
    r.clause(
        "DeleteSnapshot: a snapshot_id in no format the plugin gives out names no snapshot (OK)",
        ok(c.delete_snapshot(Request::new(snapshotter::delete_snapshot(
            "not-a-snapshot-handle",
        )))
        .await)
        .map(|_| ()),
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
        ok(c.list_snapshots(Request::new(snapshotter::list_snapshot(&t.never_snapshot()))).await)
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
            c.get_snapshot(Request::new(sanity::get_snapshot(&t.never_snapshot())))
                .await,
            Code::NotFound,
        ),
    );
    let mut small =
        t.create_for(&claim("pvc-conf-restore", 256 << 20).from_snapshot(&s.snapshot_id));
    if let Some(range) = small.capacity_range.as_mut() {
        range.limit_bytes = 512 << 20; // a limit below the snapshot's size: the provisioner sends none, the spec allows one
    }
    r.clause(
        "CreateVolume: a volume smaller than its source snapshot is OUT_OF_RANGE",
        expect_code(c.create_volume(Request::new(small)).await, Code::OutOfRange),
    );
    let restore = t.create_for(&claim("pvc-conf-restore", 1 << 30).from_snapshot(&s.snapshot_id));
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

/// CreateSnapshot `req`, sent again unchanged until the snapshot is ready,
/// as the snapshotter does.
async fn cut(t: &Target, req: &csi::CreateSnapshotRequest) -> Result<csi::Snapshot, String> {
    for _ in 0..300 {
        let s = ok(t.ctl.create_snapshot(Request::new(req.clone())).await)?
            .into_inner()
            .snapshot
            .unwrap_or_default();
        if s.ready_to_use {
            return Ok(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("snapshot {} never became ready", req.name))
}

/// The snapshot ids of a ListSnapshots answer.
fn snapshot_ids(x: &csi::ListSnapshotsResponse) -> Vec<String> {
    x.entries
        .iter()
        .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.clone()))
        .collect()
}

/// A first page of two, then the rest from its token with no page size:
/// together every snapshot of `all`, each once.
async fn paged_snapshots(t: &Target, all: &[String]) -> Result<(), String> {
    let c = &t.ctl;
    let first = ok(c
        .list_snapshots(Request::new(sanity::list_snapshots(2, "", "", "")))
        .await)?
    .into_inner();
    if first.entries.len() != 2 || first.next_token.is_empty() {
        return Err(format!(
            "first page: {} entries, next_token {:?}, of {}",
            first.entries.len(),
            first.next_token,
            all.len()
        ));
    }
    let rest = ok(c
        .list_snapshots(Request::new(sanity::list_snapshots(
            0,
            &first.next_token,
            "",
            "",
        )))
        .await)?
    .into_inner();
    let mut seen = snapshot_ids(&first);
    seen.extend(snapshot_ids(&rest));
    seen.sort();
    let mut want = all.to_vec();
    want.sort();
    ensure(rest.next_token.is_empty() && seen == want, || {
        format!("pages {seen:?} != all {want:?}")
    })
}

async fn cut_then_deleted(t: &Target, src: &PersistentVolume) -> Result<(), String> {
    let c = &t.ctl;
    let every = || sanity::list_snapshots(0, "", "", "");
    let before = snapshot_ids(&ok(c.list_snapshots(Request::new(every())).await)?.into_inner());
    let s = cut(t, &snapshotter::create_snapshot("conf4", "conf4", src, &[])).await?;
    let with = snapshot_ids(&ok(c.list_snapshots(Request::new(every())).await)?.into_inner());
    ok(
        c.delete_snapshot(Request::new(snapshotter::delete_snapshot(&s.snapshot_id)))
            .await,
    )?;
    let without = snapshot_ids(&ok(c.list_snapshots(Request::new(every())).await)?.into_inner());
    ensure(
        !before.contains(&s.snapshot_id)
            && with.contains(&s.snapshot_id)
            && with.len() == before.len() + 1
            && without.len() == before.len()
            && !without.contains(&s.snapshot_id),
        || {
            format!(
                "{} listed: before {before:?}, with {with:?}, after {without:?}",
                s.snapshot_id
            )
        },
    )
}
