//! VM snapshots (`/nodes/{node}/qemu/{vmid}/snapshot`). Not in the schema
//! subset the driver was built against, so requests here are not
//! schema-validated; the texts follow qemu-server.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::Call;
use super::common;
use super::worker::spawn_task;
use crate::ctx::Ctx;
use crate::drive::{self, Drive};
use crate::reply::ApiError;
use crate::tasks::Task;

pub async fn list(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let vm = common::vm(&c, call.req("node")?, call.vmid()?)?;
    let mut out: Vec<Value> = vm
        .snapshots
        .iter()
        .map(|(name, s)| json!({ "name": name, "snaptime": s.snaptime, "description": s.description, "parent": s.parent }))
        .collect();
    out.push(json!({ "name": "current", "description": "You are here!", "running": i32::from(vm.running) }));
    Ok(Value::Array(out))
}

pub async fn create(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    let name = call.req("snapname")?.to_string();
    {
        let c = ctx.cluster();
        c.check(
            &call.caller,
            &format!("/vms/{vmid}"),
            &["VM.Snapshot"],
            false,
        )?;
        let vm = common::vm(&c, &node, vmid)?;
        if let Some(l) = vm.lock() {
            return Err(ApiError::die(format!("VM is locked ({l})")));
        }
        if vm.snapshots.contains_key(&name) {
            return Err(ApiError::die(format!(
                "snapshot name '{name}' already used"
            )));
        }
        for (key, value) in vm.config.iter().filter(|(k, _)| drive::is_drive_key(k)) {
            let Ok(d) = Drive::parse(value) else { continue };
            let Some((storage, volname)) = d.volid() else {
                continue;
            };
            let st = c
                .storages
                .get(storage)
                .ok_or_else(|| ApiError::die(format!("storage '{storage}' does not exist")))?;
            if !st.kind.snapshots(&crate::state::format_of(volname)) {
                return Err(ApiError::die(format!(
                    "snapshot feature for '{key}' is not available"
                )));
            }
        }
    }
    let task = Task::new(&node, "qmsnapshot", &vmid.to_string(), &call.caller);
    let upid = task.upid.clone();
    let description = call.get("description").unwrap_or_default().to_string();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let _g = ctx.locks.vm(vmid, ctx.lock_timeout()).await?;
        let mut c = ctx.cluster();
        let vm = c.vms.get_mut(&vmid).ok_or("VM vanished")?;
        let parent = vm.config.get("parent").cloned();
        let disks: BTreeMap<String, String> = vm
            .config
            .iter()
            .filter(|(k, _)| drive::is_drive_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        vm.snapshots.insert(
            name.clone(),
            crate::state::Snapshot {
                snaptime: crate::clock::now(),
                description,
                parent,
                disks,
            },
        );
        vm.config.insert("parent".into(), name.clone());
        Ok(vec![format!("snapshotting '{name}'")])
    });
    Ok(json!(upid))
}

pub async fn delete(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    let name = call.req("snapname")?.to_string();
    {
        let c = ctx.cluster();
        c.check(
            &call.caller,
            &format!("/vms/{vmid}"),
            &["VM.Snapshot"],
            false,
        )?;
        let vm = common::vm(&c, &node, vmid)?;
        if !vm.snapshots.contains_key(&name) {
            return Err(ApiError::die(format!("snapshot '{name}' does not exist")));
        }
    }
    let task = Task::new(&node, "qmdelsnapshot", &vmid.to_string(), &call.caller);
    let upid = task.upid.clone();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let _g = ctx.locks.vm(vmid, ctx.lock_timeout()).await?;
        let mut c = ctx.cluster();
        let vm = c.vms.get_mut(&vmid).ok_or("VM vanished")?;
        let removed = vm
            .snapshots
            .remove(&name)
            .ok_or(format!("snapshot '{name}' does not exist"))?;
        if vm.config.get("parent") == Some(&name) {
            match removed.parent {
                Some(p) => vm.config.insert("parent".into(), p),
                None => vm.config.remove("parent"),
            };
        }
        Ok(vec![])
    });
    Ok(json!(upid))
}
