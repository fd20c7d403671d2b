//! The tag policy check: the driver's VMs carry fixed tags, and a cluster
//! whose policy refuses one cannot create them.

use super::{Finding, Severity, f};
use crate::state::State;

/// Whether the cluster's tag policy admits the tags of the driver's VMs
/// (holders, copy VMs): a tag it refuses fails their creation (pve-guest-common
/// src/PVE/GuestHelpers.pm assert_tag_permissions: `Permission check failed
/// (/, Sys.Modify for modifying tag '…')`).
pub(super) fn tag_policy(s: &State, out: &mut Vec<Finding>) {
    use proxmox_csi_controller::ctl::DRIVER_TAGS;
    for region in &s.regions {
        if s.privileges
            .get(region)
            .is_some_and(|p| p.contains("Sys.Modify"))
        {
            out.push(f(
                "tag policy",
                region.as_str(),
                Severity::Ok,
                "the token holds Sys.Modify on /: no tag policy applies to it",
                "",
            ));
            continue;
        }
        let policy = s.tag_policy.get(region).cloned().unwrap_or_default();
        let not_allowed: Vec<&str> = DRIVER_TAGS
            .iter()
            .copied()
            .filter(|t| !policy.allowed.iter().any(|a| a == t))
            .collect();
        let registered: Vec<&str> = DRIVER_TAGS
            .iter()
            .copied()
            .filter(|t| policy.registered.iter().any(|r| r == t))
            .collect();
        let mut list = policy.allow_list.clone();
        list.extend(DRIVER_TAGS.iter().map(|t| t.to_string()));
        list.sort();
        list.dedup();
        let register = format!(
            "pvesh set /cluster/options --user-tag-access 'user-allow={},user-allow-list={}'",
            match policy.user_allow.as_deref() {
                Some("existing") => "existing",
                _ => "list",
            },
            list.join(";")
        );
        let finding = match policy.user_allow.as_deref() {
            None if not_allowed.is_empty() => f(
                "tag policy",
                region.as_str(),
                Severity::Ok,
                "the token may set every tag of the driver's VMs",
                "",
            ),
            None => f(
                "tag policy",
                region.as_str(),
                Severity::Info,
                format!(
                    "the token cannot read the tag policy (GET /cluster/options needs Sys.Audit on /); of the driver's tags it may not set {} unless the policy is free",
                    not_allowed.join(", ")
                ),
                "grant Sys.Audit on / to the CSI role so that doctor can read it, or check user-tag-access and registered-tags in Datacenter → Options",
            ),
            Some(_) if !registered.is_empty() => f(
                "tag policy",
                region.as_str(),
                Severity::Error,
                format!(
                    "registered-tags holds {}: only Sys.Modify on / may set them, so snapshots, clones and offline expansion fail",
                    registered.join(", ")
                ),
                "remove them from registered-tags (Datacenter → Options → Registered Tags), or grant Sys.Modify on / to the CSI role",
            ),
            Some("free") => f(
                "tag policy",
                region.as_str(),
                Severity::Ok,
                "user-tag-access is free: any tag not registered may be set",
                "",
            ),
            Some(mode) if not_allowed.is_empty() => f(
                "tag policy",
                region.as_str(),
                Severity::Ok,
                format!("user-tag-access is {mode} and admits every tag of the driver's VMs"),
                "",
            ),
            Some(mode) => f(
                "tag policy",
                region.as_str(),
                Severity::Error,
                format!(
                    "user-tag-access is {mode} and does not admit {}: the driver's VMs (snapshots, clones, offline expansion) cannot be made",
                    not_allowed.join(", ")
                ),
                register,
            ),
        };
        out.push(finding);
    }
}
