//! Cluster-wide discovery: version, status, nodes, resources, nextid.

use std::sync::Arc;

use serde_json::{Value, json};

use super::Call;
use crate::ctx::Ctx;
use crate::reply::ApiError;

pub async fn version(ctx: Arc<Ctx>, _: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let release = c
        .version
        .rsplit_once('.')
        .map(|(r, _)| r.to_string())
        .unwrap_or_else(|| c.version.clone());
    Ok(json!({ "version": c.version, "release": release, "repoid": "5e7ce3d2" }))
}

pub async fn status(ctx: Arc<Ctx>, _: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let mut out = vec![json!({
        "type": "cluster", "id": "cluster", "name": c.name, "nodes": c.nodes.len(), "quorate": 1, "version": 7,
    })];
    for (i, (name, n)) in c.nodes.iter().enumerate() {
        out.push(json!({
            "type": "node", "id": format!("node/{name}"), "name": name, "nodeid": i + 1,
            "ip": format!("192.0.2.{}", i + 11), "online": i32::from(n.online), "local": i32::from(i == 0), "level": "",
        }));
    }
    Ok(Value::Array(out))
}

pub async fn nodes(ctx: Arc<Ctx>, _: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    Ok(Value::Array(
        c.nodes
            .iter()
            .map(|(name, n)| {
                json!({
                    "node": name, "id": format!("node/{name}"), "type": "node",
                    "status": if n.online { "online" } else { "offline" }, "level": "",
                    "maxcpu": 16, "cpu": 0.03, "maxmem": 64u64 << 30, "mem": 8u64 << 30, "uptime": 86400,
                    "ssl_fingerprint": "AA:BB:CC",
                })
            })
            .collect(),
    ))
}

pub async fn resources(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let want = call.get("type");
    let mut out = Vec::new();
    if want.is_none() || want == Some("vm") {
        for vm in c.vms.values() {
            if !c.has_priv(&call.caller, &format!("/vms/{}", vm.vmid), "VM.Audit") {
                continue;
            }
            // id, vmid, node and type come from the cluster's VM list; name,
            // status, template and usage from RRD data, which pvestatd writes
            // about every 10 s, so a new VM has none yet: no name, status
            // "unknown" (pve-manager PVE/API2/Cluster.pm resources,
            // PVE/API2Tools.pm extract_vm_stats). lock and tags are read from
            // the config (PVE::Cluster::get_guest_config_properties).
            let lag = std::time::Duration::from_millis(c.knobs.rrd_lag_ms);
            let fresh = c.created.get(&vm.vmid).is_some_and(|t| t.elapsed() < lag);
            let mut row = if fresh {
                json!({ "id": format!("qemu/{}", vm.vmid), "type": "qemu", "vmid": vm.vmid, "node": vm.node, "status": "unknown" })
            } else {
                json!({
                    "id": format!("qemu/{}", vm.vmid), "type": "qemu", "vmid": vm.vmid, "node": vm.node,
                    "name": vm.name(), "status": if vm.running { "running" } else { "stopped" }, "template": 0,
                    "maxcpu": 2, "cpu": 0.01, "maxmem": 4u64 << 30, "mem": 1u64 << 30, "maxdisk": 0, "disk": 0,
                    "uptime": if vm.running { 3600 } else { 0 },
                })
            };
            if let Some(l) = vm.lock() {
                row["lock"] = json!(l);
            }
            // The HA service state, for HA-managed VMs (API2/Cluster.pm
            // resources: the manager status's, else the configured one).
            if let Some(state) = c.ha.get(&vm.vmid) {
                row["hastate"] = json!(state);
            }
            if let Some(t) = vm.config.get("tags") {
                row["tags"] = json!(t);
            }
            out.push(row);
        }
    }
    if want.is_none() || want == Some("storage") {
        for (id, st) in &c.storages {
            if !c.has_priv(&call.caller, &format!("/storage/{id}"), "Datastore.Audit") {
                continue;
            }
            for node in c.nodes.keys().filter(|n| st.enabled_on(n)) {
                let place = c
                    .place(id, node)
                    .map_err(|e| ApiError::die(e.to_string()))?;
                out.push(json!({
                    "id": format!("storage/{node}/{id}"), "type": "storage", "storage": id, "node": node,
                    "plugintype": st.kind.name(), "status": "available", "shared": i32::from(st.is_shared()),
                    "content": st.content.join(","), "maxdisk": st.total, "disk": c.used(&place),
                }));
            }
        }
    }
    if want.is_none() || want == Some("node") {
        for (name, n) in &c.nodes {
            out.push(json!({
                "id": format!("node/{name}"), "type": "node", "node": name,
                "status": if n.online { "online" } else { "offline" }, "cgroup-mode": 2,
            }));
        }
    }
    Ok(Value::Array(out))
}

pub async fn nextid(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    if let Some(v) = call.get("vmid") {
        let id: u32 = v.parse().map_err(|_| {
            ApiError::param("vmid", format!("type check ('integer') failed - got '{v}'"))
        })?;
        if c.vms.contains_key(&id) {
            return Err(ApiError::param("vmid", format!("VM {id} already exists")));
        }
        return Ok(json!(id.to_string()));
    }
    // pve-manager PVE/API2/Cluster.pm nextid: the lowest free id of the
    // datacenter's next-id range, lower inclusive, upper exclusive; answered
    // as a JSON string (the id was a hash key).
    let (lower, upper) = c.next_id.map_or((100, 1_000_000), |n| (n.lower, n.upper));
    let free = (lower..upper)
        .find(|id| !c.vms.contains_key(id))
        .ok_or_else(|| {
            ApiError::die(format!(
                "unable to get any free VMID in range [{lower}, {upper}]"
            ))
        })?;
    Ok(json!(free.to_string()))
}

pub async fn node_status(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    super::common::node(&c, call.req("node")?)?;
    Ok(json!({
        "uptime": 86400, "cpu": 0.03, "wait": 0.0, "loadavg": ["0.10", "0.12", "0.09"], "idle": 0,
        "kversion": "Linux 6.14.8-2-pve #1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2", "pveversion": format!("pve-manager/{}/5e7ce3d2", c.version),
        "cpuinfo": { "cores": 8, "cpus": 16, "model": "pvesim CPU", "sockets": 1, "mhz": "2400.000", "hvm": "1", "flags": "", "user_hz": 100 },
        "memory": { "total": 68719476736u64, "used": 8589934592u64, "free": 60129542144u64, "available": 60129542144u64 },
        "swap": { "total": 0, "used": 0, "free": 0 },
        "rootfs": { "total": 107374182400u64, "used": 10737418240u64, "free": 96636764160u64, "avail": 96636764160u64 },
        "ksm": { "shared": 0 },
        "boot-info": { "mode": "efi", "secureboot": 0 },
        "current-kernel": { "sysname": "Linux", "release": "6.14.8-2-pve", "version": "#1 SMP", "machine": "x86_64" },
    }))
}

/// Privileges of the caller (or of `userid`), by ACL path: what an operator
/// tool reads to check a token before it acts.
pub async fn permissions(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let who = call.get("userid").unwrap_or(&call.caller).to_string();
    if who != call.caller
        && !who.starts_with(&format!("{}!", call.caller))
        && !c.has_priv(&call.caller, "/access", "Sys.Audit")
    {
        return Err(ApiError::forbidden("/access", "Sys.Audit"));
    }
    let mut paths: Vec<String> = vec!["/".into()];
    paths.extend(c.acl.iter().map(|a| a.path.clone()));
    if let Some(p) = call.get("path") {
        paths = vec![p.to_string()];
    }
    let mut out = serde_json::Map::new();
    for p in paths {
        let privs: serde_json::Map<String, Value> = crate::perms::ALL_PRIVS
            .iter()
            .filter(|priv_| c.has_priv(&who, &p, priv_))
            .map(|priv_| (priv_.to_string(), json!(1)))
            .collect();
        if !privs.is_empty() {
            out.insert(p, Value::Object(privs));
        }
    }
    Ok(Value::Object(out))
}

/// GET /cluster/options (pve-manager PVE/API2/Cluster.pm get_options): the
/// datacenter.cfg options with Sys.Audit on `/`, else only `console` and
/// `tag-style`; always `allowed-tags`, the tags the caller may set
/// (pve-guest-common GuestHelpers.pm get_allowed_tags). Served beyond the
/// schema subset.
pub async fn options(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let mut out = serde_json::Map::new();
    if c.has_priv(&call.caller, "/", "Sys.Audit") {
        if let Some(access) = &c.user_tag_access {
            out.insert("user-tag-access".into(), json!(access));
        }
        if !c.registered_tags.is_empty() {
            out.insert("registered-tags".into(), json!(c.registered_tags));
        }
        if let Some(n) = c.next_id {
            out.insert(
                "next-id".into(),
                json!({ "lower": n.lower, "upper": n.upper }),
            );
        }
    }
    let allowed = if c.has_priv(&call.caller, "/", "Sys.Modify") {
        let mut all: std::collections::BTreeSet<String> = c
            .vms
            .values()
            .filter_map(|v| v.config.get("tags"))
            .flat_map(|t| {
                t.split([';', ',', ' '])
                    .filter(|x| !x.is_empty())
                    .map(String::from)
            })
            .collect();
        if let Some(a) = &c.user_tag_access {
            all.extend(a.user_allow_list.iter().cloned());
        }
        all.extend(c.registered_tags.iter().cloned());
        all
    } else {
        c.allowed_tags(&call.caller).0
    };
    out.insert("allowed-tags".into(), json!(allowed));
    Ok(Value::Object(out))
}

pub async fn ha_resources(ctx: Arc<Ctx>, _: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    Ok(json!(
        c.ha.keys()
            .map(|id| json!({ "sid": format!("vm:{id}"), "type": "vm" }))
            .collect::<Vec<_>>()
    ))
}
