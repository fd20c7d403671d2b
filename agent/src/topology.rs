//! Where this node sits: region and zone from its Kubernetes Node labels,
//! and how many volumes it may take.

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::error::AgentError;

pub use proxmox_csi_common::contract::{TOPOLOGY_REGION as REGION, TOPOLOGY_ZONE as ZONE};
/// Labels that override the standard ones, as in the Go driver
/// (pkg/csi/helper.go GetNodeTopology: `ProxmoxRegion`, `ProxmoxNode` first),
/// for nodes whose standard labels another controller owns.
const REGION_OVERRIDE: &str = "topology.proxmox.sinextra.dev/region";
const ZONE_OVERRIDE: &str = "topology.proxmox.sinextra.dev/node";
pub use proxmox_csi_common::{MAX_VOLUMES_LABEL, SCSI_SLOTS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub region: String,
    /// The Proxmox node; a Node without the label reaches volumes on
    /// shared storage only (their topology names the region alone).
    pub zone: Option<String>,
    /// From the node label, when set and valid.
    pub max_volumes: Option<i64>,
}

pub async fn lookup(client: kube::Client, node: &str) -> Result<Topology, AgentError> {
    let nodes: Api<Node> = Api::all(client);
    let n = nodes
        .get(node)
        .await
        .map_err(|source| AgentError::Kubernetes {
            what: format!("reading Node {node}"),
            source,
        })?;
    from_labels(node, n.metadata.labels.unwrap_or_default())
}

pub fn from_labels(
    node: &str,
    labels: std::collections::BTreeMap<String, String>,
) -> Result<Topology, AgentError> {
    let get = |standard: &str, over: &str, what: &str, how: &str| {
        [over, standard]
            .iter()
            .filter_map(|k| labels.get(*k))
            .find(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| {
                AgentError::Topology(format!(
                    "Node {node} has no label {standard} (nor {over}), which names its Proxmox {what}. \
                     The Proxmox cloud controller manager or Talos' nodeLabels set it; by hand: \
                     kubectl label node {node} {standard}={how}"
                ))
            })
    };
    let region = get(
        REGION,
        REGION_OVERRIDE,
        "cluster",
        "<region of the cluster in the cloud config>",
    )?;
    let zone = get(ZONE, ZONE_OVERRIDE, "node", "<Proxmox node the VM runs on>").ok();
    let max_volumes = labels
        .get(MAX_VOLUMES_LABEL)
        .and_then(|v| proxmox_csi_common::max_volumes_label(v));
    Ok(Topology {
        region,
        zone,
        max_volumes,
    })
}

/// The volume limit: the label, else the flag, never above the SCSI slots
/// left free by the node's other disks.
pub fn max_volumes(label: Option<i64>, flag: i64, other_scsi_disks: u32) -> i64 {
    // The boot disk sits on scsi0, outside the CSI slots.
    let taken = i64::from(other_scsi_disks.saturating_sub(1));
    label
        .unwrap_or(flag)
        .clamp(1, SCSI_SLOTS)
        .min((SCSI_SLOTS - taken).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_proxmox_labels_override_the_standard_ones_as_in_go() {
        let t = from_labels(
            "w2",
            labels(&[
                (REGION, "r1"),
                (ZONE, "pve2"),
                (REGION_OVERRIDE, "cluster-9"),
                (ZONE_OVERRIDE, "pve9"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (t.region.as_str(), t.zone.as_deref()),
            ("cluster-9", Some("pve9"))
        );
        let t = from_labels("w2", labels(&[(REGION, "r1"), (ZONE, "pve2")])).unwrap();
        assert_eq!((t.region.as_str(), t.zone.as_deref()), ("r1", Some("pve2")));
        // An empty override is no override (Go: `if region == ""`).
        let t = from_labels(
            "w2",
            labels(&[(REGION, "r1"), (ZONE, "pve2"), (ZONE_OVERRIDE, "")]),
        )
        .unwrap();
        assert_eq!(t.zone.as_deref(), Some("pve2"));
    }

    #[test]
    fn a_missing_region_says_which_label_and_how_to_set_it() {
        let e = from_labels("w2", labels(&[(ZONE, "pve2")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Node w2 has no label topology.kubernetes.io/region"),
            "{e}"
        );
        assert!(
            e.contains("kubectl label node w2 topology.kubernetes.io/region="),
            "{e}"
        );
    }

    #[test]
    fn a_node_without_a_zone_has_the_region_alone() {
        let t = from_labels("w2", labels(&[(REGION, "r1")])).unwrap();
        assert_eq!((t.region.as_str(), t.zone), ("r1", None));
    }

    #[test]
    fn volume_limit_follows_label_flag_and_free_slots() {
        assert_eq!(max_volumes(None, 24, 1), 24);
        assert_eq!(max_volumes(Some(10), 24, 1), 10);
        assert_eq!(max_volumes(None, 24, 10), 21);
        assert_eq!(max_volumes(None, 99, 0), 30);
        let t = from_labels(
            "w",
            labels(&[(REGION, "r"), (ZONE, "z"), (MAX_VOLUMES_LABEL, "31")]),
        )
        .unwrap();
        assert_eq!(t.max_volumes, None);
        // The Go driver's 0: no limit of the label's own, so every free slot.
        let t = from_labels(
            "w",
            labels(&[(REGION, "r"), (ZONE, "z"), (MAX_VOLUMES_LABEL, "0")]),
        )
        .unwrap();
        assert_eq!(max_volumes(t.max_volumes, 24, 1), 30);
        assert_eq!(max_volumes(t.max_volumes, 24, 3), 28);
    }
}
