//! pvesim for a test, and the cloud config of the CSI token on it.

use std::path::Path;

pub use pvesim::{Running, Sim, State};

/// The CSI token every test cluster's YAML grants (`users:` … `tokens:`).
pub const TOKEN_ID: &str = "kubernetes-csi@pve!csi";
pub const SECRET: &str = "5f0c6e8a-1234-4b5c-9d7e-0123456789ab";

/// The region the cloud config names the cluster.
pub const REGION: &str = "region-1";

/// The documented minimal role of the CSI token (docs/proxmox-role.md).
pub const MINIMAL_ROLE: &str =
    "VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit";

/// A cluster of `nodes` with one storage, `storage` of pvesim type `kind`
/// and `total` bytes (shared where the type is), the workers 112 and 113 on
/// pve2, and the CSI token with a role broad enough for snapshots and
/// clones on `/`.
pub fn storage_cluster(storage: &str, kind: &str, total: u64, nodes: &[&str]) -> String {
    let options = match kind {
        "rbd" | "nfs" => ", shared: true",
        // PVE 9's LVM with qcow2 volume chains, where qcow2 is the default format.
        "lvm" => ", snapshot-as-volume-chain: true",
        _ => "",
    };
    let nodes = nodes
        .iter()
        .map(|n| format!("{{ name: {n} }}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
cluster: lab
nodes: [{nodes}]
storages:
  - {{ id: {storage}, type: {kind}, total: {total}{options} }}
vms:
  - {{ vmid: 112, node: pve2, name: worker-2, config: {{ scsihw: virtio-scsi-pci }} }}
  - {{ vmid: 113, node: pve2, name: worker-3, config: {{ scsihw: virtio-scsi-pci }} }}
users:
  - userid: kubernetes-csi@pve
    tokens: [{{ name: csi, secret: {SECRET} }}]
roles:
  CSI: [VM.Audit, VM.Config.Disk, VM.Allocate, VM.Clone, VM.Config.Memory, VM.Config.CPU, VM.Config.HWType, VM.Config.Options, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - {{ path: /, roles: [CSI], tokens: ["{TOKEN_ID}"], users: [kubernetes-csi@pve] }}
"#
    )
}

/// pvesim serving `cluster` (its state YAML) over plain HTTP on a free port.
pub async fn plain(cluster: &str) -> Result<Running, String> {
    plain_with(cluster, |s| s).await
}

/// The same, with `f` setting up the simulator first (a volume directory,
/// a loop host, knobs).
pub async fn plain_with(cluster: &str, f: impl FnOnce(Sim) -> Sim) -> Result<Running, String> {
    // The controller's client needs a process-wide TLS provider even for HTTP.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let state = State::from_yaml(cluster).map_err(|e| format!("pvesim state: {e}"))?;
    f(Sim::new(state).plain_http())
        .start("127.0.0.1:0")
        .await
        .map_err(|e| format!("pvesim: {e}"))
}

/// The cloud config of [`TOKEN_ID`] on the cluster at `api_url` in
/// [`REGION`]: with `ca_file` when it serves TLS, after `features` (YAML
/// lines of the `features:` map, indented by two; empty for none).
pub fn cloud_config(api_url: &str, ca_file: Option<&Path>, features: &str) -> String {
    let features = if features.is_empty() {
        String::new()
    } else {
        format!("features:\n{features}")
    };
    let ca = ca_file
        .map(|p| format!("    ca_file: {}\n", p.display()))
        .unwrap_or_default();
    format!(
        "{features}clusters:\n  - url: {api_url}\n{ca}    token_id: {TOKEN_ID}\n    token_secret: {SECRET}\n    region: {REGION}\n"
    )
}

/// [`cloud_config`] of `sim` (plain HTTP), without features.
pub fn config_of(sim: &Running) -> String {
    cloud_config(&sim.api_url(), None, "")
}
