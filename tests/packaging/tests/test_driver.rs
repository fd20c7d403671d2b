//! deploy/e2e/test-driver.yaml, the Kubernetes storage e2e suite's external
//! driver definition: its keys are the suite's, and every capability it
//! claims is one the controller and the node plugin advertise (or the
//! CSIDriver implies); its StorageClass is one the controller accepts.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::{BTreeMap, HashMap};

use packaging::repo_root;
use proxmox_csi_proto::csi::v1::controller_service_capability::rpc::Type as Ctl;
use proxmox_csi_proto::csi::v1::node_service_capability::rpc::Type as Node;
use proxmox_csi_proto::csi::v1::plugin_capability::{self, service, volume_expansion};
use serde_norway::Value;

/// kubernetes test/e2e/storage/framework/testdriver.go, the Cap* constants.
const SUITE_CAPABILITIES: &[&str] = &[
    "persistence",
    "block",
    "fsGroup",
    "volumeMountGroup",
    "exec",
    "snapshotDataSource",
    "pvcDataSource",
    "multipods",
    "RWX",
    "controllerExpansion",
    "nodeExpansion",
    "offlineExpansion",
    "onlineExpansion",
    "volumeLimits",
    "singleNodeVolume",
    "topology",
    "capacity",
    "FSResizeFromSourceNotSupported",
    "readWriteOncePod",
    "multiplePVsSameID",
    "capReadOnlyMany",
];

/// kubernetes test/e2e/framework/timeouts.go, TimeoutContext's durations.
const SUITE_TIMEOUTS: &[&str] = &[
    "PodStart",
    "PodStartShort",
    "PodStartSlow",
    "PodDelete",
    "ClaimProvision",
    "DataSourceProvision",
    "ClaimProvisionShort",
    "ClaimBound",
    "PVReclaim",
    "PVBound",
    "PVCreate",
    "PVDelete",
    "PVDeleteSlow",
    "SnapshotCreate",
    "SnapshotDelete",
];

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn keys(v: &Value) -> Vec<String> {
    v.as_mapping()
        .map(|m| m.keys().map(|k| k.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn the_e2e_definition_claims_what_the_driver_advertises() {
    let def = yaml("deploy/e2e/test-driver.yaml");
    // driverDefinition's top-level fields (test/e2e/storage/external/external.go).
    for k in keys(&def) {
        assert!(
            [
                "ShortName",
                "StorageClass",
                "SnapshotClass",
                "InlineVolumes",
                "ClientNodeName",
                "Timeouts",
                "DriverInfo"
            ]
            .contains(&k.as_str()),
            "{k} is not a field of the suite's driverDefinition"
        );
    }
    for k in keys(&def["Timeouts"]) {
        assert!(SUITE_TIMEOUTS.contains(&k.as_str()), "Timeouts.{k}");
    }
    let info = &def["DriverInfo"];
    let csidriver = yaml("deploy/kustomize/csidriver.yaml");
    assert_eq!(info["Name"], csidriver["metadata"]["name"]);

    let claimed: BTreeMap<String, bool> =
        serde_norway::from_value(info["Capabilities"].clone()).unwrap();
    for k in claimed.keys() {
        assert!(SUITE_CAPABILITIES.contains(&k.as_str()), "Capabilities.{k}");
    }
    let ctl = |t: Ctl| proxmox_csi_controller::csi::controller::CAPABILITIES.contains(&t);
    let node = |t: Node| proxmox_csi_node::csi::node::CAPABILITIES.contains(&t);
    let plugin = proxmox_csi_proto::plugin::capabilities();
    let service = |t: service::Type| {
        plugin.iter().any(|c| {
            matches!(&c.r#type, Some(plugin_capability::Type::Service(s)) if s.r#type == t as i32)
        })
    };
    let online = plugin.iter().any(|c| {
        matches!(&c.r#type, Some(plugin_capability::Type::VolumeExpansion(e))
            if e.r#type == volume_expansion::Type::Online as i32)
    });
    let spec = &csidriver["spec"];
    let advertised: BTreeMap<&str, bool> = BTreeMap::from([
        ("persistence", true),
        ("exec", true),
        ("multipods", node(Node::StageUnstageVolume)),
        ("block", true),
        // No fsGroupPolicy: kubelet's ReadWriteOnceWithFSType.
        ("fsGroup", spec["fsGroupPolicy"].as_str() != Some("None")),
        ("snapshotDataSource", ctl(Ctl::CreateDeleteSnapshot)),
        ("pvcDataSource", ctl(Ctl::CloneVolume)),
        (
            "controllerExpansion",
            ctl(Ctl::ExpandVolume) && service(service::Type::ControllerService),
        ),
        ("nodeExpansion", node(Node::ExpandVolume)),
        ("onlineExpansion", online),
        ("offlineExpansion", ctl(Ctl::ExpandVolume)),
        ("volumeLimits", proxmox_csi_common::DEFAULT_MAX_VOLUMES > 0),
        (
            "topology",
            service(service::Type::VolumeAccessibilityConstraints),
        ),
        (
            "capacity",
            ctl(Ctl::GetCapacity) && spec["storageCapacity"].as_bool() == Some(true),
        ),
        (
            "readWriteOncePod",
            ctl(Ctl::SingleNodeMultiWriter) && node(Node::SingleNodeMultiWriter),
        ),
        // One VM holds a disk.
        ("RWX", false),
        ("multiplePVsSameID", false),
    ]);
    for (cap, on) in &claimed {
        assert_eq!(
            advertised.get(cap.as_str()),
            Some(on),
            "test-driver.yaml claims {cap}: {on}"
        );
    }

    let topology: Vec<String> = serde_norway::from_value(info["TopologyKeys"].clone()).unwrap();
    assert_eq!(
        topology,
        [
            proxmox_csi_node::topology::REGION,
            proxmox_csi_node::topology::ZONE
        ]
    );
    for fs in keys(&info["SupportedFsType"]) {
        assert!(
            fs.is_empty() || proxmox_csi_common::contract::FS_TYPES.contains(&fs.as_str()),
            "SupportedFsType {fs:?} is not one the driver formats"
        );
    }

    // The classes it names: the driver's, and parameters the controller takes.
    let sc = yaml(&format!(
        "deploy/e2e/{}",
        def["StorageClass"]["FromFile"].as_str().unwrap()
    ));
    assert_eq!(sc["provisioner"], info["Name"]);
    let params: HashMap<String, String> =
        serde_norway::from_value(sc["parameters"].clone()).unwrap();
    proxmox_csi_controller::params::StorageParams::parse(&params)
        .unwrap_or_else(|e| panic!("the e2e StorageClass's parameters: {e}"));
    let snap = yaml(&format!(
        "deploy/e2e/{}",
        def["SnapshotClass"]["FromFile"].as_str().unwrap()
    ));
    assert_eq!(snap["driver"], info["Name"]);
    assert_eq!(snap["kind"].as_str(), Some("VolumeSnapshotClass"));
}
