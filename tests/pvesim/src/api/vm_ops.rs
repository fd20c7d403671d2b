//! Whole-VM operations: create, destroy, migrate, and moving a disk to
//! another storage or VM.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::Call;
use super::common;
use super::worker::spawn_task;
use crate::ctx::Ctx;
use crate::drive::{self, Drive};
use crate::reply::ApiError;
use crate::state::{Cluster, Place, StorageType, Vm, Volume, owner_of};
use crate::tasks::Task;

pub async fn index(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    common::vm(&c, call.req("node")?, call.vmid()?)?;
    Ok(json!(
        [
            "config",
            "pending",
            "status",
            "unlink",
            "resize",
            "move_disk",
            "migrate"
        ]
        .iter()
        .map(|s| json!({ "subdir": s }))
        .collect::<Vec<_>>()
    ))
}

pub async fn create(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    {
        let c = ctx.cluster();
        common::node(&c, &node)?;
        // A bare "Permission check failed": create_vm's raise_perm_exc()
        // names neither path nor privilege (qemu-server Qemu.pm create_vm).
        if !c.has_priv(&call.caller, &format!("/vms/{vmid}"), "VM.Allocate") {
            return Err(ApiError::new(403, "Permission check failed"));
        }
        common::quorum(&c)?;
        // Each option set needs its own privilege (qemu-server
        // src/PVE/API2/Qemu.pm create_vm → $check_vm_modify_config_perm).
        for key in call.params.keys() {
            if let Some(p) = option_privilege(key) {
                c.check(&call.caller, &format!("/vms/{vmid}"), &[p], false)?;
            }
        }
        // pve-cluster src/PVE/Cluster.pm check_vmid_unused, wrapped by create_vm.
        if let Some(vm) = c.vms.get(&vmid) {
            return Err(ApiError::die(format!(
                "unable to create VM {vmid} - VM {vmid} already exists on node '{}'",
                vm.node
            )));
        }
    }
    let config: BTreeMap<String, String> = call
        .params
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "node" | "vmid" | "start"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if config.keys().any(|k| drive::is_drive_key(k)) {
        return Err(ApiError::die(
            "pvesim creates VMs without disks; attach them with a config update",
        ));
    }
    let task = Task::new(&node, "qmcreate", &vmid.to_string(), &call.caller);
    let upid = task.upid.clone();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let mut c = ctx.cluster();
        if c.vms.contains_key(&vmid) {
            return Err(format!(
                "unable to create VM {vmid} - VM {vmid} already exists on node '{node}'"
            ));
        }
        // Tags are checked in the worker (pve-guest-common
        // src/PVE/GuestHelpers.pm assert_tag_permissions, from qemu-server
        // 9.2's create_vm), with `{}` as the old tag list: Perl makes it
        // the one tag "HASH(0x…)", which a restrictive policy refuses
        // whatever the new tags are (Qemu.pm create_vm,
        // `assert_tag_permissions($vmid, {}, $conf->{tags}, …)`).
        if let Some(tags) = config.get("tags") {
            c.assert_tag_permissions(&call.caller, vmid, "HASH(0x55d0c0ffee00)", tags)
                .map_err(|e| format!("unable to create VM {vmid} - {}", e.in_task()))?;
        }
        c.vms.insert(
            vmid,
            Vm {
                vmid,
                node,
                running: call.flag("start"),
                config,
                ..Default::default()
            },
        );
        c.created.insert(vmid, std::time::Instant::now());
        Ok(vec![])
    });
    Ok(json!(upid))
}

/// The privilege a create_vm option needs (qemu-server src/PVE/API2/Qemu.pm:
/// $cpuoptions, $memoryoptions, $hwtypeoptions, $generaloptions).
fn option_privilege(key: &str) -> Option<&'static str> {
    Some(match key {
        "cores" | "sockets" | "vcpus" | "cpu" | "cpulimit" | "cpuunits" | "numa" => "VM.Config.CPU",
        "memory" | "balloon" | "shares" => "VM.Config.Memory",
        "scsihw" | "machine" | "acpi" | "kvm" | "hotplug" | "vga" | "tablet" | "smbios1" => {
            "VM.Config.HWType"
        }
        "name" | "description" | "ostype" | "agent" | "onboot" | "protection" | "bios" => {
            "VM.Config.Options"
        }
        _ => return None,
    })
}

pub async fn destroy(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    {
        let c = ctx.cluster();
        let vm = common::vm(&c, &node, vmid)?;
        // qemu-server src/PVE/API2/Qemu.pm destroy_vm $early_checks.
        if vm.config.get("protection").is_some_and(|p| p == "1") {
            return Err(ApiError::die(format!(
                "can't remove VM {vmid} - protection mode enabled"
            )));
        }
        if vm.running {
            return Err(ApiError::die(format!(
                "VM {vmid} is running - destroy failed"
            )));
        }
        if let Some(id) = c
            .replication
            .iter()
            .find(|(_, j)| j.guest == vmid)
            .map(|(id, _)| id)
            && !call.flag("purge")
        {
            return Err(ApiError::die(format!(
                "There is a replication job '{id}' for guest '{vmid}' - Please remove that first."
            )));
        }
        if let Some(l) = vm.lock()
            && !call.flag("skiplock")
        {
            return Err(ApiError::die(format!("VM is locked ({l})")));
        }
    }
    let unreferenced = call.flag("destroy-unreferenced-disks");
    let task = Task::new(&node, "qmdestroy", &vmid.to_string(), &call.caller);
    let upid = task.upid.clone();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let _g = ctx.locks.vm(vmid, ctx.lock_timeout()).await?;
        let mut c = ctx.cluster();
        let vm = c
            .vms
            .remove(&vmid)
            .ok_or(format!("VM {vmid} does not exist"))?;
        // Every owned volume referenced anywhere in the config is freed.
        let mut freed: Vec<(Place, String)> = vm
            .config
            .values()
            .chain(vm.pending.values())
            .filter_map(|value| {
                let d = Drive::parse(value).ok()?;
                let (storage, volname) = d.volid()?;
                if owner_of(volname) != Some(vmid) {
                    return None;
                }
                Some((c.place(storage, &vm.node).ok()?, volname.to_string()))
            })
            .collect();
        // qemu-server QemuServer.pm destroy_vm with $purge_unreferenced:
        // every disk the VMID owns on the storages enabled on the node
        // (pve-storage Storage.pm vdisk_list, content `images`), referenced
        // or not.
        if unreferenced {
            for st in c.storages.values() {
                if !st.enabled_on(&vm.node) || !st.content.iter().any(|x| x == "images") {
                    continue;
                }
                let Ok(place) = c.place(&st.id, &vm.node) else {
                    continue;
                };
                let owned = c.volumes.get(&place).into_iter().flatten();
                let owned: Vec<String> = owned
                    .filter(|(_, v)| v.owner == vmid)
                    .map(|(n, _)| n.clone())
                    .collect();
                freed.extend(owned.into_iter().map(|n| (place.clone(), n)));
            }
        }
        let mut log = Vec::new();
        for (place, volname) in freed {
            // krbd: vdisk_free unmaps here and `rbd rm` fails while another
            // node maps the image; destroy_vm only warns and goes on
            // (qemu-server QemuServer.pm destroy_vm: "Could not remove disk
            // '$volid', check manually: $@").
            let volid = format!("{}:{volname}", place.0);
            if let Some(nodes) = c.rbd_mapped.get_mut(&volid) {
                nodes.remove(&vm.node);
                if !nodes.is_empty() {
                    log.push(format!(
                        "WARN: Could not remove disk '{volid}', check manually: rbd rm '{volname}' error: This means the image is still open or the client using it crashed. Try again after closing/unmapping it or waiting 30s for the crashed client to timeout."
                    ));
                    continue;
                }
            }
            if c.volumes
                .get_mut(&place)
                .and_then(|m| m.remove(&volname))
                .is_none()
            {
                continue;
            }
            let volid = format!("{}:{volname}", place.0);
            if let Some(dir) = &ctx.volume_dir {
                let keeps_extents = c
                    .storages
                    .get(&place.0)
                    .is_some_and(crate::state::StorageSpec::keeps_extents);
                crate::qmp::release_backing(dir, &volid, keeps_extents);
            }
            log.push(format!("Removed volume '{volid}'"));
        }
        c.replication.retain(|_, j| j.guest != vmid);
        Ok(log)
    });
    Ok(json!(upid))
}

fn local_disks(c: &Cluster, vm: &Vm) -> Vec<(String, String)> {
    vm.config
        .iter()
        .filter(|(k, _)| drive::is_drive_key(k) || drive::is_unused_key(k))
        .filter_map(|(k, v)| {
            let d = Drive::parse(v).ok()?;
            let (storage, _) = d.volid()?;
            let st = c.storages.get(storage)?;
            (!st.is_shared()).then(|| (k.clone(), d.volume.clone()))
        })
        .collect()
}

pub async fn migrate_check(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let node = call.req("node")?;
    let vm = common::vm(&c, node, call.vmid()?)?;
    let locals = local_disks(&c, vm);
    let allowed: Vec<&String> = c.nodes.keys().filter(|n| *n != node).collect();
    Ok(json!({
        "running": i32::from(vm.running),
        "allowed_nodes": allowed,
        "not_allowed_nodes": {},
        "local_disks": locals.iter().map(|(k, v)| json!({"volid": v, "drivename": k, "size": 0, "cdrom": 0, "is_unused": i32::from(drive::is_unused_key(k))})).collect::<Vec<_>>(),
        "local_resources": [],
        "mapped-resources": [],
        "mapped-resource-info": {},
        "has-dbus-vmstate": 0,
    }))
}

pub async fn migrate(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    let target = call.req("target")?.to_string();
    {
        let c = ctx.cluster();
        let vm = common::vm(&c, &node, vmid)?;
        common::node(&c, &target)?;
        common::quorum(&c)?;
        if target == node {
            return Err(ApiError::param("target", "target is local node."));
        }
        if vm.running && !call.flag("online") {
            return Err(ApiError::die("can't migrate running VM without --online"));
        }
        if let Some(l) = vm.lock() {
            return Err(ApiError::die(format!("VM is locked ({l})")));
        }
    }
    // An HA-managed VM is only queued for the HA manager: the `hamigrate`
    // task ends once the request is queued, before the VM moves; the LRM
    // migrates it later (qemu-server src/PVE/API2/Qemu.pm migrate_vm;
    // pve-ha-manager src/PVE/API2/HA/Resources.pm migrate,
    // src/PVE/HA/Resources/PVEVM.pm migrate).
    if ctx.cluster().ha.contains_key(&vmid) {
        let task = Task::new(&node, "hamigrate", &vmid.to_string(), &call.caller);
        let upid = task.upid.clone();
        spawn_task(ctx.clone(), task, move |ctx: Arc<Ctx>| async move {
            let after = {
                let mut c = ctx.cluster();
                if let Some(state) = c.ha.get_mut(&vmid) {
                    *state = "migrate".into();
                }
                std::time::Duration::from_millis(c.knobs.ha_migrate_ms)
            };
            let lrm = ctx.clone();
            let line = format!("Requesting HA migration for VM {vmid} to node {target}");
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let result = move_vm(&lrm, vmid, &node, &target, &call, None).await;
                let mut c = lrm.cluster();
                let running = c.vms.get(&vmid).is_some_and(|v| v.running);
                if let Some(state) = c.ha.get_mut(&vmid) {
                    *state = match result {
                        Ok(_) if running => "started",
                        Ok(_) => "stopped",
                        Err(_) => "error",
                    }
                    .into();
                }
            });
            Ok(vec![line])
        });
        return Ok(json!(upid));
    }
    let task = Task::new(&node, "qmigrate", &vmid.to_string(), &call.caller);
    let upid = task.upid.clone();
    let log_upid = upid.clone();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        move_vm(&ctx, vmid, &node, &target, &call, Some(&log_upid)).await
    });
    Ok(json!(upid))
}

/// The migration itself (qemu-server src/PVE/QemuMigrate.pm), under the
/// VM's lock; `log_upid`: the task whose log shows the copy's progress.
async fn move_vm(
    ctx: &Arc<Ctx>,
    vmid: u32,
    node: &str,
    target: &str,
    call: &Call,
    log_upid: Option<&str>,
) -> Result<Vec<String>, String> {
    let (node, target) = (node.to_string(), target.to_string());
    {
        if let Some(upid) = log_upid {
            copy_local_disks(ctx, vmid, upid).await;
        }
        let mut c = ctx.cluster();
        let vm = c.vms.get(&vmid).cloned().ok_or("VM vanished")?;
        let locals = local_disks(&c, &vm);
        if vm.running && !locals.is_empty() && !call.flag("with-local-disks") {
            return Err(format!(
                "can't migrate local disk '{}': can't live migrate attached local disks without with-local-disks option",
                locals[0].1
            ));
        }
        // Local volumes travel with the VM (copied, then removed at the
        // source). A replicated volume already has its replica on a job's
        // target: the migration syncs it, the source copy stays as the new
        // replica and the job now points back (qemu-server
        // src/PVE/QemuMigrate.pm phase3_cleanup → switch_replication_job_target).
        let replicated = super::replication::replicated_volumes(&c, &vm);
        let job = c
            .replication
            .iter()
            .find(|(_, j)| j.guest == vmid && j.target == target)
            .map(|(id, _)| id.clone());
        for (_, volid) in &locals {
            let (storage, volname) = volid.split_once(':').ok_or("bad volid")?;
            if !c
                .storages
                .get(storage)
                .is_some_and(|s| s.enabled_on(&target))
            {
                return Err(format!(
                    "storage '{storage}' is not available on node '{target}'"
                ));
            }
            let from = (storage.to_string(), node.clone());
            let to = (storage.to_string(), target.clone());
            let keep_replica = job.is_some() && replicated.contains(volid);
            let moved = c.volumes.get_mut(&from).and_then(|m| {
                if keep_replica {
                    m.get(volname).cloned()
                } else {
                    m.remove(volname)
                }
            });
            if let Some(v) = moved {
                c.volumes
                    .entry(to)
                    .or_default()
                    .insert(volname.to_string(), v);
            }
        }
        if let Some(id) = job
            && let Some(j) = c.replication.get_mut(&id)
        {
            j.target = node.clone();
        }
        if let Some(v) = c.vms.get_mut(&vmid) {
            v.node = target.clone();
        }
        Ok(vec![format!(
            "migration finished successfully (duration 00:00:01)"
        )])
    }
}

/// The offline copy of a migrating VM's local disks, with the lines its
/// task log really shows: QemuMigrate's `copying local disk images`, then
/// for each volume `pvesm export | pvesm import` whose `dd status=progress`
/// lines storage_migrate relays (pve-storage src/PVE/Storage.pm
/// storage_migrate; Plugin.pm volume_export), and `successfully imported`
/// (pvesm.pm volume_imported_message). No `transferred … (NN%)` here: that
/// is the live mirror's and import-from's line. Paced by `copy_ms_per_gib`.
async fn copy_local_disks(ctx: &Arc<Ctx>, vmid: u32, upid: &str) {
    let (per_gib, disks) = {
        let c = ctx.cluster();
        let Some(vm) = c.vms.get(&vmid) else { return };
        let disks: Vec<(String, u64)> = local_disks(&c, vm)
            .into_iter()
            .filter_map(|(_, volid)| {
                let (s, n) = volid.split_once(':')?;
                let size = c
                    .volumes
                    .get(&(s.to_string(), vm.node.clone()))?
                    .get(n)?
                    .size;
                Some((volid, size))
            })
            .collect();
        (c.knobs.copy_ms_per_gib, disks)
    };
    let log = |line: String| {
        let stamped = format!("{} {line}", log_time());
        if let Some(t) = ctx.cluster().tasks.get_mut(upid) {
            t.log.push(stamped);
        }
    };
    if disks.is_empty() {
        return;
    }
    log("copying local disk images".into());
    for (volid, size) in disks {
        let total = std::time::Duration::from_millis(
            (size as f64 / (1u64 << 30) as f64 * per_gib as f64) as u64,
        );
        let steps = 5u32;
        for i in 1..=steps {
            tokio::time::sleep(total / steps).await;
            let bytes = size / u64::from(steps) * u64::from(i);
            let secs = (total / steps * i).as_secs().max(1);
            log(format!(
                "{bytes} bytes ({:.1} GB, {:.1} GiB) copied, {secs} s, {:.0} MB/s",
                bytes as f64 / 1e9,
                bytes as f64 / (1u64 << 30) as f64,
                bytes as f64 / 1e6 / secs as f64
            ));
        }
        log(format!("successfully imported '{volid}'"));
        log(format!("volume '{volid}' is '{volid}' on the target"));
    }
}

/// `YYYY-MM-DD HH:MM:SS`, the prefix of a migration log line
/// (pve-guest-common src/PVE/AbstractMigrate.pm, strftime("%F %H:%M:%S")).
fn log_time() -> String {
    jiff::Timestamp::now().strftime("%F %H:%M:%S").to_string()
}

pub async fn move_disk(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    let disk = call.req("disk")?.to_string();
    let storage = call.get("storage").map(String::from);
    let target_vmid: Option<u32> = call.get("target-vmid").and_then(|v| v.parse().ok());
    match (&storage, target_vmid) {
        (None, None) => {
            let msg = "both 'storage' and 'target-vmid' missing, either needs to be set";
            return Err(ApiError::params(BTreeMap::from([
                ("storage".to_string(), msg.to_string()),
                ("target-vmid".to_string(), msg.to_string()),
            ])));
        }
        (Some(_), Some(_)) => {
            let msg = "either set 'storage' or 'target-vmid', but not both";
            return Err(ApiError::params(BTreeMap::from([
                ("storage".to_string(), msg.to_string()),
                ("target-vmid".to_string(), msg.to_string()),
            ])));
        }
        (None, Some(t)) if t == vmid => {
            return Err(ApiError::param(
                "target-vmid",
                "must be different than source VMID to reassign disk",
            ));
        }
        _ => {}
    }
    // Early, synchronous checks.
    {
        let c = ctx.cluster();
        let vm = common::vm(&c, &node, vmid)?;
        if let Some(l) = vm.lock() {
            return Err(ApiError::die(format!("VM is locked ({l})")));
        }
        if let Some(d) = call.get("digest")
            && d != vm.digest()
        {
            return Err(ApiError::die(
                "detected modified configuration - file changed by other user? Try again.",
            ));
        }
        let value = vm
            .config
            .get(&disk)
            .ok_or_else(|| ApiError::die(format!("disk '{disk}' does not exist")))?;
        let d = Drive::parse(value).map_err(|e| ApiError::param("disk", e))?;
        if d.is_cdrom() {
            return Err(ApiError::die("you can't move a cdrom"));
        }
        if let Some(s) = &storage {
            let st = common::storage(&c, &node, s)?;
            if !st.content.iter().any(|x| x == "images") {
                return Err(ApiError::param(
                    "storage",
                    format!("storage '{s}' does not support vm images"),
                ));
            }
            if d.volid().map(|(src, _)| src) == Some(s.as_str()) {
                return Err(ApiError::die(
                    "you can't move to the same storage with same format",
                ));
            }
            c.check(
                &call.caller,
                &format!("/storage/{s}"),
                &["Datastore.AllocateSpace"],
                false,
            )?;
        }
        if let Some(t) = target_vmid {
            let tvm = c.vms.get(&t).ok_or_else(|| common::no_config(&node, t))?;
            if tvm.node != node {
                return Err(ApiError::die(format!(
                    "Both VMs need to be on the same node ({node} != {})",
                    tvm.node
                )));
            }
            if vm.running && !drive::is_unused_key(&disk) {
                return Err(ApiError::die(
                    "Cannot move disk to another VM while the source VM is running - detach first",
                ));
            }
            let tkey = call.get("target-disk").unwrap_or(&disk);
            if tvm.config.contains_key(tkey) {
                return Err(ApiError::die(format!(
                    "Target disk key '{tkey}' is already in use for VM '{t}'"
                )));
            }
            c.check(
                &call.caller,
                &format!("/vms/{t}"),
                &["VM.Config.Disk"],
                false,
            )?;
        }
    }
    let task_id = match target_vmid {
        Some(t) => format!(
            "{vmid}-{disk}>{t}-{}",
            call.get("target-disk").unwrap_or(&disk)
        ),
        None => vmid.to_string(),
    };
    let task = Task::new(&node, "qmmove", &task_id, &call.caller);
    let upid = task.upid.clone();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let _g = ctx.locks.vm(vmid, ctx.lock_timeout()).await?;
        let mut c = ctx.cluster();
        let value = c
            .vms
            .get(&vmid)
            .and_then(|v| v.config.get(&disk).cloned())
            .ok_or(format!("disk '{disk}' does not exist"))?;
        let mut d = Drive::parse(&value).map_err(|e| e.to_string())?;
        let (src_storage, src_name) = d
            .volid()
            .map(|(s, n)| (s.to_string(), n.to_string()))
            .ok_or("no volume")?;
        let src_place = c.place(&src_storage, &node).map_err(|e| e.to_string())?;
        let kind = c
            .storages
            .get(&src_storage)
            .map(|s| s.kind)
            .ok_or("no storage")?;
        let vol = match c.volume(&src_place, &src_name).cloned() {
            Some(v) => v,
            // A reassign renames: the plugin's rename_volume meets the gap.
            None if target_vmid.is_some() => {
                return Err(rename_missing(
                    kind,
                    &src_storage,
                    &src_name,
                    target_vmid.unwrap_or_default(),
                ));
            }
            None => {
                return Err(
                    super::texts::activation_error(kind, &src_storage, &src_name, true)
                        .unwrap_or_else(|| {
                            super::texts::size_probe_error(kind, &src_storage, &src_name)
                        }),
                );
            }
        };
        match (storage, target_vmid) {
            (Some(dst), _) => {
                let new = copy_to(&mut c, &node, &dst, vmid, &src_name, &vol)?;
                d.volume = new.clone();
                if let Some(vm) = c.vms.get_mut(&vmid) {
                    vm.config.insert(disk.clone(), d.canonical());
                }
                if call.flag("delete") {
                    if let Some(m) = c.volumes.get_mut(&src_place) {
                        m.remove(&src_name);
                    }
                } else if let Some(vm) = c.vms.get_mut(&vmid) {
                    let n = (0..=255)
                        .find(|n| !vm.config.contains_key(&format!("unused{n}")))
                        .unwrap_or(0);
                    vm.config
                        .insert(format!("unused{n}"), format!("{src_storage}:{src_name}"));
                }
                Ok(vec![format!("moved disk {disk} to {new}")])
            }
            (None, Some(t)) => {
                // Reassign: the volume is renamed to the target's next free name.
                let st = c.storages.get(&src_storage).cloned().ok_or("no storage")?;
                let existing = c.volumes.get(&src_place).cloned().unwrap_or_default();
                // find_free_diskname: `vm-<target>-disk-N`, with the format's
                // suffix on files and on an LVM volume chain's qcow2.
                let new_name = (0..)
                    .map(|n| match st.kind {
                        k if k.file_based() => format!("{t}/vm-{t}-disk-{n}.{}", vol.format),
                        StorageType::Lvm if vol.format == "qcow2" => {
                            format!("vm-{t}-disk-{n}.qcow2")
                        }
                        _ => format!("vm-{t}-disk-{n}"),
                    })
                    .find(|n| !existing.contains_key(n))
                    .unwrap_or_default();
                if let Some(m) = c.volumes.get_mut(&src_place) {
                    m.remove(&src_name);
                    m.insert(new_name.clone(), Volume { owner: t, ..vol });
                }
                let tkey = call.get("target-disk").unwrap_or(&disk).to_string();
                d.volume = format!("{src_storage}:{new_name}");
                if let Some(vm) = c.vms.get_mut(&vmid) {
                    vm.config.remove(&disk);
                }
                if let Some(tvm) = c.vms.get_mut(&t) {
                    tvm.config.insert(tkey, d.canonical());
                }
                Ok(vec![format!("reassigned disk to VM {t} as {}", d.volume)])
            }
            (None, None) => Err("nothing to do".into()),
        }
    });
    Ok(json!(upid))
}

/// A reassign's rename of a source volume that is not there, per plugin
/// (pve-storage rename_volume): lvm/lvmthin `lvrename` with errmsg
/// "lvrename '$vg/$old' to '$new' error" and lvm2's indented line
/// (LVMPlugin.pm lvrename); zfs "zfs error: " + zfs's (ZFSPoolPlugin.pm
/// rename_volume via zfs_request); rbd "could not rename image '$src' to
/// '$dst'" + rbd's (RBDPlugin.pm rename_volume); files Perl's rename with
/// `$!` (Plugin.pm rename_volume). The target name is the first free one,
/// `vm-<target>-disk-0` for an empty target.
fn rename_missing(kind: StorageType, storage: &str, volname: &str, target: u32) -> String {
    let new = format!("vm-{target}-disk-0");
    match kind {
        StorageType::Lvmthin | StorageType::Lvm => {
            let vg = if kind == StorageType::Lvm {
                "san"
            } else {
                "pve"
            };
            format!(
                "lvrename '{vg}/{volname}' to '{new}' error:   Existing logical volume \"{volname}\" not found in volume group \"{vg}\""
            )
        }
        StorageType::Zfspool => {
            format!("zfs error: cannot open 'rpool/data/{volname}': dataset does not exist")
        }
        StorageType::Rbd => format!(
            "could not rename image '{volname}' to '{new}': rbd: rename error: (2) No such file or directory"
        ),
        StorageType::Dir | StorageType::Nfs => {
            let file = volname.rsplit('/').next().unwrap_or(volname);
            let ext = file.rsplit('.').next().unwrap_or("raw");
            format!(
                "rename '/var/lib/vz-{storage}/images/{volname}' to '/var/lib/vz-{storage}/images/{target}/{new}.{ext}' failed - No such file or directory"
            )
        }
    }
}

/// Copies a volume to another storage, keeping its name when it is free there.
fn copy_to(
    c: &mut Cluster,
    node: &str,
    dst: &str,
    vmid: u32,
    name: &str,
    vol: &Volume,
) -> Result<String, String> {
    let st = c
        .storages
        .get(dst)
        .cloned()
        .ok_or(format!("storage '{dst}' does not exist"))?;
    let place = c.place(dst, node).map_err(|e| e.to_string())?;
    let existing = c.volumes.get(&place).cloned().unwrap_or_default();
    let base = name
        .rsplit('/')
        .next()
        .unwrap_or(name)
        .trim_end_matches(".raw")
        .trim_end_matches(".qcow2");
    let candidate = if st.kind.file_based() {
        format!("{vmid}/{base}.raw")
    } else {
        base.to_string()
    };
    let new_name = if existing.contains_key(&candidate) {
        (0..)
            .map(|n| format!("vm-{vmid}-disk-{n}"))
            .find(|n| !existing.contains_key(n))
            .unwrap_or_default()
    } else {
        candidate
    };
    c.volumes.entry(place).or_default().insert(
        new_name.clone(),
        Volume {
            size: st.kind.round(vol.size),
            format: "raw".into(),
            owner: owner_of(&new_name).unwrap_or(vmid),
            ctime: crate::clock::now(),
        },
    );
    Ok(format!("{dst}:{new_name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_rename_source_answers_as_each_plugin() {
        assert_eq!(
            rename_missing(StorageType::Lvmthin, "local-lvm", "vm-100-disk-9", 101),
            "lvrename 'pve/vm-100-disk-9' to 'vm-101-disk-0' error:   Existing logical volume \"vm-100-disk-9\" not found in volume group \"pve\""
        );
        assert_eq!(
            rename_missing(StorageType::Rbd, "ceph", "vm-100-disk-9", 101),
            "could not rename image 'vm-100-disk-9' to 'vm-101-disk-0': rbd: rename error: (2) No such file or directory"
        );
        assert!(
            rename_missing(StorageType::Nfs, "nfs", "100/vm-100-disk-9.qcow2", 101)
                .ends_with("/images/101/vm-101-disk-0.qcow2' failed - No such file or directory")
        );
    }
}
