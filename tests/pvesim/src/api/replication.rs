//! Storage replication jobs (local ZFS between nodes).

use std::sync::Arc;

use serde_json::{Value, json};

use super::Call;
use super::common;
use crate::ctx::Ctx;
use crate::drive::{self, Drive};
use crate::reply::ApiError;
use crate::state::{Cluster, ReplicationJob, owner_of};

fn job_json(id: &str, j: &ReplicationJob) -> Value {
    let mut v = json!({ "id": id, "type": "local", "guest": j.guest, "jobnum": j.jobnum, "target": j.target });
    if let Some(s) = &j.schedule {
        v["schedule"] = json!(s);
    }
    if let Some(s) = &j.source {
        v["source"] = json!(s);
    }
    if let Some(r) = j.rate {
        v["rate"] = json!(r);
    }
    if let Some(c) = &j.comment {
        v["comment"] = json!(c);
    }
    if j.disable {
        v["disable"] = json!(1);
    }
    if let Some(r) = &j.remove_job {
        v["remove_job"] = json!(r);
    }
    v
}

fn digest(id: &str, j: &ReplicationJob) -> String {
    use sha1::{Digest, Sha1};
    Sha1::digest(format!("{id}{}", job_json(id, j)).as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The volumes of `vm` a replication job copies: its own disks on local
/// ZFS without `replicate=0`.
pub fn replicated_volumes(c: &Cluster, vm: &crate::state::Vm) -> Vec<String> {
    vm.config
        .iter()
        .filter(|(k, _)| drive::is_drive_key(k) || k.starts_with("unused"))
        .filter_map(|(_, v)| Drive::parse(v).ok())
        .filter(|d| d.opts.get("replicate").map(String::as_str) != Some("0"))
        .filter_map(|d| {
            let (storage, volname) = d.volid()?;
            let st = c.storages.get(storage)?;
            (owner_of(volname) == Some(vm.vmid)
                && !st.is_shared()
                && st.kind == crate::state::StorageType::Zfspool)
                .then(|| d.volume.clone())
        })
        .collect()
}

fn need(c: &Cluster, caller: &str, guest: u32, privilege: &str) -> Result<(), ApiError> {
    c.check(caller, &format!("/vms/{guest}"), &[privilege], false)
}

pub async fn list(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    Ok(Value::Array(
        c.replication
            .iter()
            .filter(|(_, j)| c.has_priv(&call.caller, &format!("/vms/{}", j.guest), "VM.Audit"))
            .map(|(id, j)| job_json(id, j))
            .collect(),
    ))
}

pub async fn node_list(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let node = call.req("node")?;
    common::node(&c, node)?;
    let guest: Option<u32> = call.get("guest").and_then(|g| g.parse().ok());
    Ok(Value::Array(
        c.replication
            .iter()
            .filter(|(_, j)| guest.is_none_or(|g| g == j.guest))
            .filter(|(_, j)| {
                c.vms.get(&j.guest).is_some_and(|v| v.node == node) && j.target != node
            })
            .filter(|(_, j)| c.has_priv(&call.caller, &format!("/vms/{}", j.guest), "VM.Audit"))
            .map(|(id, j)| {
                let mut v = job_json(id, j);
                v["vmtype"] = json!("qemu");
                v["last_sync"] = json!(crate::clock::now());
                v["last_try"] = json!(crate::clock::now());
                v["fail_count"] = json!(0);
                v["duration"] = json!(1.5);
                v["next_sync"] = json!(crate::clock::now() + 900);
                v
            })
            .collect(),
    ))
}

pub async fn get(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let id = call.req("id")?;
    let j = c
        .replication
        .get(id)
        .ok_or_else(|| ApiError::die(format!("no such job '{id}'")))?;
    need(&c, &call.caller, j.guest, "VM.Audit")?;
    let mut v = job_json(id, j);
    v["digest"] = json!(digest(id, j));
    Ok(v)
}

pub async fn create(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let mut c = ctx.cluster();
    let id = call.req("id")?.to_string();
    let (guest, jobnum) = id
        .split_once('-')
        .and_then(|(g, n)| Some((g.parse::<u32>().ok()?, n.parse::<u32>().ok()?)))
        .ok_or_else(|| ApiError::param("id", "value does not match the regex pattern"))?;
    if guest < 100 {
        return Err(ApiError::die(format!(
            "invalid replication job id '{id}' (guest IDs < 100 are reserved)"
        )));
    }
    need(&c, &call.caller, guest, "VM.Replicate")?;
    if c.replication.contains_key(&id) {
        return Err(ApiError::die(format!(
            "replication job '{id}' already exists"
        )));
    }
    let vm = c
        .vms
        .get(&guest)
        .cloned()
        .ok_or_else(|| ApiError::die(format!("Guest '{guest}' does not exist.")))?;
    let target = call.req("target")?.to_string();
    if !c.nodes.contains_key(&target) {
        return Err(ApiError::die(format!("Target '{target}' does not exist.")));
    }
    if target == vm.node {
        return Err(ApiError::die("Source and target must not be identical"));
    }
    if let Some(source) = call.get("source")
        && source != vm.node
    {
        return Err(ApiError::die(format!(
            "Source '{source}' does not match current node of guest '{guest}' ({})",
            vm.node
        )));
    }
    // Replicatable: owned by the guest, on local storage, replicate not off.
    let mut found = false;
    for (key, value) in vm.config.iter().filter(|(k, _)| drive::is_drive_key(k)) {
        let Ok(d) = Drive::parse(value) else { continue };
        let Some((storage, volname)) = d.volid() else {
            continue;
        };
        if owner_of(volname) != Some(guest)
            || d.opts.get("replicate").map(String::as_str) == Some("0")
        {
            continue;
        }
        let Some(st) = c.storages.get(storage) else {
            continue;
        };
        if st.is_shared() {
            continue;
        }
        if st.kind != crate::state::StorageType::Zfspool {
            return Err(ApiError::die(format!(
                "missing replicate feature on volume '{}'",
                d.volume
            )));
        }
        let _ = key;
        found = true;
    }
    if !found {
        return Err(ApiError::die("No replicatable volumes found"));
    }
    // The first sync (pvescheduler runs due jobs every minute, pve-manager
    // PVE/Service/pvescheduler.pm): the guest's replicated volumes appear on
    // the target under the same names (pve-guest-common src/PVE/Replication.pm
    // replicate). pvesim syncs at once.
    let node = vm.node.clone();
    for volid in replicated_volumes(&c, &vm) {
        let Some((storage, volname)) = volid.split_once(':') else {
            continue;
        };
        let copy = c
            .volumes
            .get(&(storage.to_string(), node.clone()))
            .and_then(|m| m.get(volname))
            .cloned();
        if let Some(v) = copy {
            c.volumes
                .entry((storage.to_string(), target.clone()))
                .or_default()
                .insert(volname.to_string(), v);
        }
    }
    c.replication.insert(
        id,
        ReplicationJob {
            guest,
            jobnum,
            target,
            source: call.get("source").map(String::from),
            schedule: call.get("schedule").map(String::from),
            rate: call.get("rate").and_then(|r| r.parse().ok()),
            comment: call.get("comment").map(String::from),
            disable: call.flag("disable"),
            remove_job: None,
        },
    );
    Ok(Value::Null)
}

pub async fn update(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let mut c = ctx.cluster();
    let id = call.req("id")?.to_string();
    let mut j = c
        .replication
        .get(&id)
        .cloned()
        .ok_or_else(|| ApiError::die(format!("no such job '{id}'")))?;
    need(&c, &call.caller, j.guest, "VM.Replicate")?;
    if let Some(d) = call.get("digest")
        && d != digest(&id, &j)
    {
        return Err(ApiError::die(
            "detected modified configuration - file changed by other user? Try again.",
        ));
    }
    for key in call
        .get("delete")
        .unwrap_or_default()
        .split([',', ';', ' '])
        .filter(|k| !k.is_empty())
    {
        match key {
            "schedule" => j.schedule = None,
            "rate" => j.rate = None,
            "comment" => j.comment = None,
            "disable" => j.disable = false,
            "source" => j.source = None,
            other => {
                return Err(ApiError::die(format!(
                    "unable to delete required option '{other}'"
                )));
            }
        }
    }
    if let Some(s) = call.get("schedule") {
        j.schedule = Some(s.into());
    }
    if let Some(r) = call.get("rate") {
        j.rate = r.parse().ok();
    }
    if let Some(cm) = call.get("comment") {
        j.comment = Some(cm.into());
    }
    if call.get("disable").is_some() {
        j.disable = call.flag("disable");
    }
    c.replication.insert(id, j);
    Ok(Value::Null)
}

pub async fn delete(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let mut c = ctx.cluster();
    let id = call.req("id")?.to_string();
    if call.get("keep").is_some() && call.get("force").is_some() {
        return Err(ApiError::param("keep", "conflicts with parameter 'force'"));
    }
    let guest = c
        .replication
        .get(&id)
        .map(|j| j.guest)
        .ok_or_else(|| ApiError::die(format!("no such job '{id}'")))?;
    need(&c, &call.caller, guest, "VM.Replicate")?;
    if call.flag("force") {
        c.replication.remove(&id);
    } else if let Some(j) = c.replication.get_mut(&id) {
        // Only marked (pve-manager PVE/API2/ReplicationConfig.pm delete); the
        // scheduler's next run removes it: with `full`, first the replicas on
        // the target, and only while the guest exists on this cluster
        // (pve-guest-common src/PVE/Replication.pm replicate, remove_job;
        // PVE/API2/Replication.pm run_jobs skips guests that are gone).
        let full = !call.flag("keep");
        j.remove_job = Some(if full { "full" } else { "local" }.into());
        let ctx = ctx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let mut c = ctx.cluster();
            let Some(job) = c.replication.get(&id).cloned() else {
                return;
            };
            let Some(vm) = c.vms.get(&job.guest).cloned() else {
                return;
            };
            if full {
                for volid in replicated_volumes(&c, &vm) {
                    if let Some((storage, volname)) = volid.split_once(':')
                        && let Some(m) = c
                            .volumes
                            .get_mut(&(storage.to_string(), job.target.clone()))
                    {
                        m.remove(volname);
                    }
                }
            }
            c.replication.remove(&id);
        });
    }
    Ok(Value::Null)
}
