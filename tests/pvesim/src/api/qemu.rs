//! qemu-server endpoints: VM config (with pending changes, digest, locks and
//! disk hot-plug), unlink, resize, status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Call;
use super::common;
use super::worker::spawn_task;
use crate::ctx::Ctx;
use crate::drive::{self, Drive};
use crate::reply::ApiError;
use crate::state::{Cluster, StorageType, Vm, Volume, owner_of};
use crate::tasks::Task;

/// Parameters of a config call that are not VM options.
const CONTROL: &[&str] = &[
    "node",
    "vmid",
    "delete",
    "revert",
    "force",
    "digest",
    "skiplock",
    "background_delay",
];

fn json_config(config: &BTreeMap<String, String>) -> serde_json::Map<String, Value> {
    config
        .iter()
        .map(|(k, v)| {
            // Integer and boolean options come out as JSON numbers.
            let numeric = matches!(
                k.as_str(),
                "cores"
                    | "sockets"
                    | "onboot"
                    | "agent"
                    | "template"
                    | "acpi"
                    | "numa"
                    | "vmgenid_dummy"
            ) && v.parse::<i64>().is_ok();
            let value = if numeric {
                json!(v.parse::<i64>().unwrap_or(0))
            } else {
                json!(v)
            };
            (k.clone(), value)
        })
        .collect()
}

pub async fn list(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let node = call.req("node")?;
    common::node(&c, node)?;
    let rows: Vec<Value> = c
        .vms
        .values()
        .filter(|v| {
            v.node == node && c.has_priv(&call.caller, &format!("/vms/{}", v.vmid), "VM.Audit")
        })
        .map(|v| {
            let mut row = json!({
                "vmid": v.vmid,
                "name": v.name(),
                "status": if v.running { "running" } else { "stopped" },
            });
            if let Some(l) = v.lock() {
                row["lock"] = json!(l);
            }
            row
        })
        .collect();
    Ok(Value::Array(rows))
}

pub async fn config_get(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    if call.get("snapshot").is_some() && call.get("current").is_some() {
        let msg = "cannot use 'snapshot' parameter with 'current'";
        return Err(ApiError::params(BTreeMap::from([
            ("snapshot".to_string(), msg.to_string()),
            ("current".to_string(), msg.to_string()),
        ])));
    }
    let c = ctx.cluster();
    let vm = common::vm(&c, call.req("node")?, call.vmid()?)?;
    let mut config = vm.config.clone();
    if !call.flag("current") {
        for k in vm.pending_delete.keys() {
            config.remove(k);
        }
        config.extend(vm.pending.clone());
    }
    let mut out = json_config(&config);
    out.insert("digest".into(), json!(vm.digest()));
    Ok(Value::Object(out))
}

pub async fn pending(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let vm = common::vm(&c, call.req("node")?, call.vmid()?)?;
    let mut keys: std::collections::BTreeSet<&String> = vm.config.keys().collect();
    keys.extend(vm.pending.keys());
    keys.extend(vm.pending_delete.keys());
    let mut rows: Vec<Value> = keys
        .into_iter()
        .map(|k| {
            let mut row = json!({ "key": k });
            if let Some(v) = vm.config.get(k) {
                row["value"] = json!(v);
            }
            if let Some(p) = vm.pending.get(k) {
                row["pending"] = json!(p);
            }
            if let Some(force) = vm.pending_delete.get(k) {
                row["delete"] = json!(if *force { 2 } else { 1 });
            }
            row
        })
        .collect();
    rows.push(json!({ "key": "digest", "value": vm.digest() }));
    Ok(Value::Array(rows))
}

pub async fn status_current(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let vm = common::vm(&c, call.req("node")?, call.vmid()?)?;
    let mut v = json!({
        "vmid": vm.vmid,
        "status": if vm.running { "running" } else { "stopped" },
        "qmpstatus": if vm.running { "running" } else { "stopped" },
        "name": vm.name(),
        "cpus": 2,
        "maxmem": 4u64 << 30,
        "maxdisk": 0,
        "uptime": if vm.running { 3600 } else { 0 },
        "ha": { "managed": 0 },
    });
    if vm.running {
        v["pid"] = json!(10000 + vm.vmid);
    }
    if let Some(l) = vm.lock() {
        v["lock"] = json!(l);
    }
    Ok(v)
}

/// Checks that run before any change, synchronously for POST too.
fn prechecks(vm: &Vm, call: &Call) -> Result<(), ApiError> {
    if let Some(d) = call.get("digest")
        && d != vm.digest()
    {
        return Err(ApiError::die(
            "checksum mismatch (file change by other user?)",
        ));
    }
    if call.flag("skiplock") && call.caller != "root@pam" {
        return Err(ApiError::param(
            "skiplock",
            "Only root may use this option.",
        ));
    }
    if let Some(lock) = vm.lock()
        && !call.flag("skiplock")
    {
        return Err(ApiError::die(format!("VM is locked ({lock})")));
    }
    Ok(())
}

fn delete_list(call: &Call) -> Vec<String> {
    call.get("delete")
        .unwrap_or_default()
        .split([',', ';', ' ', '\t', '\n'])
        .filter(|k| !k.is_empty())
        .map(|k| {
            if k == "cdrom" {
                "ide2".to_string()
            } else {
                k.to_string()
            }
        })
        .collect()
}

fn setting_keys(call: &Call) -> Vec<(String, String)> {
    call.params
        .iter()
        .filter(|(k, _)| !CONTROL.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Validation that needs the cluster: parameter conflicts, drive values,
/// volume access, non-root options.
fn validate(
    c: &Cluster,
    schema: &crate::schema::Schema,
    vm: &Vm,
    call: &Call,
) -> Result<(), ApiError> {
    let deletes = delete_list(call);
    let sets = setting_keys(call);
    if deletes.is_empty() && sets.is_empty() && call.get("revert").is_none() {
        return Err(ApiError::die("no options specified"));
    }
    if call.get("force").is_some() && call.get("delete").is_none() {
        return Err(ApiError::param(
            "delete",
            "missing property required by 'force'",
        ));
    }
    let mut errors = BTreeMap::new();
    for k in &deletes {
        if sets.iter().any(|(s, _)| s == k) {
            errors.insert(
                "delete".to_string(),
                format!("you can't use '-{k}' and -delete {k}' at the same time"),
            );
        } else if !(drive::is_drive_key(k)
            || drive::is_unused_key(k)
            || schema.has_param("/nodes/{node}/qemu/{vmid}/config", "POST", k))
        {
            errors.insert("delete".to_string(), format!("unknown option '{k}'"));
        }
    }
    for (k, v) in &sets {
        if matches!(k.as_str(), "lock" | "args") && call.caller != "root@pam" {
            return Err(ApiError::die(format!("only root can set '{k}' config")));
        }
        if drive::is_drive_key(k) {
            let d = match Drive::parse(v) {
                Ok(d) => d,
                Err(e) => {
                    errors.insert(k.clone(), e);
                    continue;
                }
            };
            if d.is_cdrom() {
                continue;
            }
            if let Some((storage, _)) = d.allocation() {
                let st = common::storage(c, &vm.node, &storage)?;
                if !st.content.iter().any(|x| x == "images") {
                    errors.insert(
                        "storage".into(),
                        format!("storage '{storage}' does not support vm images"),
                    );
                }
                c.check(
                    &call.caller,
                    &format!("/storage/{storage}"),
                    &["Datastore.AllocateSpace"],
                    false,
                )?;
                if let Some(src) = d.opts.get("import-from") {
                    check_import_source(c, &call.caller, vm, src)?;
                }
            } else if let Some((storage, volname)) = d.volid() {
                common::storage(c, &vm.node, storage)?;
                check_volume_access(c, &call.caller, storage, volname, vm.vmid)?;
            } else if d.volume.starts_with('/') && call.caller != "root@pam" {
                errors.insert(
                    k.clone(),
                    "Only root can pass arbitrary filesystem paths.".into(),
                );
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::params(errors))
    }
}

/// pve-storage's `check_volume_access` for attaching an existing volume.
fn check_volume_access(
    c: &Cluster,
    caller: &str,
    storage: &str,
    volname: &str,
    vmid: u32,
) -> Result<(), ApiError> {
    let sp = format!("/storage/{storage}");
    if c.has_priv(caller, &sp, "Datastore.Allocate") {
        return Ok(());
    }
    let owner = owner_of(volname);
    if owner == Some(vmid) {
        return Ok(());
    }
    if let Some(o) = owner
        && c.has_priv(caller, &sp, "Datastore.Audit")
        && c.has_priv(caller, &format!("/vms/{o}"), "VM.Config.Disk")
    {
        return Ok(());
    }
    Err(ApiError::forbidden(
        &sp,
        &format!("missing privileges to access {storage}:{volname}"),
    ))
}

/// `import-from=<volid>`: a volume owned by a VM is cloned from it, which
/// needs `VM.Clone` on that VM (even one that does not exist); any other
/// volume needs plain volume access.
fn check_import_source(c: &Cluster, caller: &str, vm: &Vm, src: &str) -> Result<(), ApiError> {
    let (storage, volname) = common::split_volid(src)?;
    common::storage(c, &vm.node, storage)?;
    match owner_of(volname) {
        Some(owner) => c.check(caller, &format!("/vms/{owner}"), &["VM.Clone"], false),
        None => check_volume_access(c, caller, storage, volname, vm.vmid),
    }
}

/// The `import-from` sources of a config write and their sizes: the copy
/// time is charged for them before the write, as qemu-img runs first.
fn import_sizes(c: &Cluster, vm_node: &str, call: &Call) -> Vec<(String, u64)> {
    setting_keys(call)
        .into_iter()
        .filter_map(|(_, v)| Drive::parse(&v).ok()?.opts.get("import-from").cloned())
        .filter_map(|src| {
            let (s, n) = common::split_volid(&src).ok()?;
            let place = c.place(s, vm_node).ok()?;
            Some((src.clone(), c.volume(&place, n)?.size))
        })
        .collect()
}

/// One disk that must be plugged into or out of a running VM.
#[derive(Debug, Clone)]
enum Plug {
    Add { key: String, drive: Drive },
    Remove { key: String, drive: Drive },
}

/// What a config update did, and what it still has to do on a running VM.
#[derive(Debug, Default)]
struct Update {
    log: Vec<String>,
    plugs: Vec<Plug>,
}

/// Allocates `vm-<vmid>-disk-<N>` for a `<storage>:<GiB>` drive value.
/// A new disk of a config write: the drive's `format`, else the storage's
/// default (qemu-server API2/Qemu.pm create_disks: `$disk->{format} ||
/// $defformat`, the drive's `format` then dropped, "no longer needed"),
/// which on thick LVM with volume chains is qcow2 (pve-storage
/// LVMPlugin.pm get_formats), named with `.qcow2` (find_free_diskname).
fn allocate_for(
    c: &mut Cluster,
    vm_node: &str,
    vmid: u32,
    storage: &str,
    gib: f64,
    format: Option<&str>,
) -> Result<(String, u64), ApiError> {
    let st = common::storage(c, vm_node, storage)?.clone();
    let place = c
        .place(storage, vm_node)
        .map_err(|e| ApiError::die(e.to_string()))?;
    let existing = c.volumes.get(&place).cloned().unwrap_or_default();
    let chain = st.kind == StorageType::Lvm && st.snapshot_as_volume_chain;
    let format = match format {
        Some(f) => f.to_string(),
        None if st.kind.file_based() => st.format.clone().unwrap_or_else(|| "raw".into()),
        None if chain => "qcow2".into(),
        None => "raw".into(),
    };
    let name = (0..)
        .map(|n| {
            if st.kind.file_based() {
                format!("{vmid}/vm-{vmid}-disk-{n}.{format}")
            } else if chain && format == "qcow2" {
                format!("vm-{vmid}-disk-{n}.qcow2")
            } else {
                format!("vm-{vmid}-disk-{n}")
            }
        })
        .find(|n| !existing.contains_key(n))
        .unwrap_or_default();
    if chain && format == "qcow2" {
        c.lv_active.insert(
            format!("{storage}:{name}"),
            std::collections::BTreeSet::from([vm_node.to_string()]),
        );
    }
    let size = st.kind.round((gib * (1u64 << 30) as f64) as u64);
    c.volumes.entry(place).or_default().insert(
        name.clone(),
        Volume {
            size,
            format,
            owner: vmid,
            ctime: crate::clock::now(),
        },
    );
    Ok((format!("{storage}:{name}"), size))
}

/// Moves a drive that leaves the config to where Proxmox puts it: an owned
/// disk becomes `unusedN` (or is freed with `force`), a foreign one is dropped.
fn release_drive(c: &mut Cluster, vmid: u32, value: &str, force: bool, log: &mut Vec<String>) {
    let Ok(d) = Drive::parse(value) else { return };
    let Some((storage, volname)) = d.volid() else {
        return;
    };
    if owner_of(volname) != Some(vmid) {
        return;
    }
    let node = c.vms.get(&vmid).map(|v| v.node.clone()).unwrap_or_default();
    if force {
        if let Ok(place) = c.place(storage, &node)
            && let Some(vols) = c.volumes.get_mut(&place)
        {
            vols.remove(volname);
            log.push(format!("Removed volume '{storage}:{volname}'"));
        }
        return;
    }
    if let Some(vm) = c.vms.get_mut(&vmid) {
        let slot = (0..=255).find(|n| !vm.config.contains_key(&format!("unused{n}")));
        if let Some(n) = slot {
            vm.config
                .insert(format!("unused{n}"), format!("{storage}:{volname}"));
        }
    }
}

/// Writes the request into `[PENDING]`, then applies what can be applied
/// now: everything on a stopped VM; hot-changeable options on a running one.
/// Disks to (un)plug on a running VM are returned for the caller to plug.
/// `in_worker`: the write runs in a task (POST), which changes some waits.
/// `volume_dir`: where backing files live (an import copies its source's).
fn stage_update(
    c: &mut Cluster,
    node: &str,
    vmid: u32,
    call: &Call,
    in_worker: bool,
    volume_dir: Option<&std::path::Path>,
) -> Result<Update, ApiError> {
    let mut up = Update::default();
    let force = call.flag("force");
    let vm_node = common::vm(c, node, vmid)?.node.clone();
    prechecks(common::vm(c, node, vmid)?, call)?;
    // Tags are checked under the lock, old against new (qemu-server
    // src/PVE/API2/Qemu.pm $updatefn → pve-guest-common GuestHelpers.pm
    // assert_tag_permissions).
    let deletes_tags = delete_list(call).iter().any(|k| k == "tags");
    if let Some(new) = call.get("tags").or(deletes_tags.then_some("")) {
        let old = common::vm(c, node, vmid)?
            .config
            .get("tags")
            .cloned()
            .unwrap_or_default();
        c.assert_tag_permissions(&call.caller, vmid, &old, new)?;
    }
    // Each drive set or deleted needs VM.Config.Disk (a CD-ROM
    // VM.Config.CDROM), checked per drive under the lock; the schema's check
    // before it asks only for any of the config privileges (qemu-server
    // src/PVE/API2/Qemu.pm $update_vm_api, $check_drive_perms in $updatefn).
    let drives = setting_keys(call)
        .into_iter()
        .filter(|(k, _)| drive::is_drive_key(k))
        .map(|(k, v)| (k, Some(v)))
        .chain(
            delete_list(call)
                .into_iter()
                .filter(|k| drive::is_drive_key(k) || drive::is_unused_key(k))
                .map(|k| (k, None)),
        );
    for (key, value) in drives {
        let old = common::vm(c, node, vmid)?.config.get(&key).cloned();
        // A delete of an unset key is skipped, with a warning, before it.
        if value.is_none() && old.is_none() {
            continue;
        }
        let cdrom = [value.as_deref(), old.as_deref()]
            .into_iter()
            .flatten()
            .filter_map(|v| Drive::parse(v).ok())
            .all(|d| d.is_cdrom());
        let privilege = if cdrom {
            "VM.Config.CDROM"
        } else {
            "VM.Config.Disk"
        };
        c.check(&call.caller, &format!("/vms/{vmid}"), &[privilege], false)?;
    }

    for key in delete_list(call) {
        let vm = common::vm_mut(c, node, vmid)?;
        // Each delete is checked against the config as it stands, before
        // any new option of the same request (`protection` included) is
        // applied; deletes done before the refusal stay written
        // (qemu-server src/PVE/API2/Qemu.pm $update_vm_api, the `@delete`
        // loop; pve-guest-common src/PVE/AbstractConfig.pm check_protection).
        // An unset key is skipped (with a warning) before that check.
        let set = vm.config.contains_key(&key) || vm.pending.contains_key(&key);
        if set && vm.config.get("protection").is_some_and(|p| p == "1") {
            if drive::is_unused_key(&key)
                && let Some(v) = vm.config.get(&key)
            {
                let file = v.split(',').next().unwrap_or_default();
                return Err(ApiError::die(format!(
                    "can't remove unused disk '{file}' - protection mode enabled"
                )));
            }
            if drive::is_drive_key(&key) {
                return Err(ApiError::die(format!(
                    "can't remove drive '{key}' - protection mode enabled"
                )));
            }
        }
        if drive::is_unused_key(&key) {
            if let Some(v) = vm.config.remove(&key) {
                let (storage, volname) = common::split_volid(&v)?;
                if owner_of(volname) == Some(vmid)
                    && let Ok(place) = c.place(storage, &vm_node)
                    && let Some(vols) = c.volumes.get_mut(&place)
                {
                    vols.remove(volname);
                    up.log.push(format!("Removed volume '{v}'"));
                }
            } else {
                up.log.push(format!(
                    "cannot delete '{key}' - not set in current configuration!"
                ));
            }
            continue;
        }
        if !vm.config.contains_key(&key) && !vm.pending.contains_key(&key) {
            up.log.push(format!(
                "cannot delete '{key}' - not set in current configuration!"
            ));
            continue;
        }
        vm.pending.remove(&key);
        if vm.config.contains_key(&key) {
            vm.pending_delete.insert(key.clone(), force);
        }
    }

    for (key, value) in setting_keys(call) {
        let mut value = value;
        if drive::is_drive_key(&key) {
            let mut d = Drive::parse(&value).map_err(|e| ApiError::param(&key, e))?;
            // A volume Proxmox cannot activate: that plugin's text.
            if c.knobs.refuse_volumes.contains(&d.volume)
                && let Some((storage, volname)) = d.volid()
            {
                let kind = c
                    .storages
                    .get(storage)
                    .map_or(StorageType::Lvmthin, |s| s.kind);
                let why = super::texts::activation_error(kind, storage, volname, in_worker)
                    .unwrap_or_else(|| super::texts::size_probe_error(kind, storage, volname));
                return Err(ApiError::die(why));
            }
            if let Some((storage, gib)) = d.allocation() {
                // `<storage>:0,import-from=<volid>` copies an existing volume.
                let import = d.opts.remove("import-from");
                let gib = match &import {
                    Some(src) => {
                        let (s, n) = common::split_volid(src)?;
                        // qemu-server src/PVE/API2/Qemu.pm $import_from_volid:
                        // an owner VM must be on this node (its config is
                        // locked while the copy runs), wrapped by create_disks.
                        if let Some(owner) = owner_of(n)
                            && let Some(o) = c.vms.get(&owner)
                            && o.node != vm_node
                        {
                            return Err(ApiError::die(format!(
                                "cannot import from '{src}' - owner VM {owner} not on local node"
                            )));
                        }
                        // $import_from_volid reads the source's size before
                        // anything activates it: "could not get size of
                        // $src_volid", wrapped as "cannot import from …".
                        if c.lv_inactive(s, n, &vm_node) {
                            return Err(ApiError::die(format!(
                                "cannot import from '{src}' - could not get size of {src}"
                            )));
                        }
                        let place = c
                            .place(s, &vm_node)
                            .map_err(|e| ApiError::die(e.to_string()))?;
                        let size = c
                            .volume(&place, n)
                            .map(|v| v.size)
                            .ok_or_else(|| ApiError::die(format!("volume {src} does not exist")))?;
                        up.log
                            .push(format!("importing disk '{src}' to VM {vmid} ..."));
                        size as f64 / (1u64 << 30) as f64
                    }
                    None => gib,
                };
                let format = d.opts.remove("format");
                let (volid, size) =
                    allocate_for(c, &vm_node, vmid, &storage, gib, format.as_deref())?;
                // create_disks copies into the new volume before the key
                // reaches the config (qemu-server Qemu.pm: clone_disk, then
                // the drive line): nobody sees the disk half-copied.
                if let (Some(src), Some(dir)) = (&import, volume_dir) {
                    copy_backing_file(dir, src, &volid)?;
                }
                up.log.push(format!(
                    "{key}: successfully created disk '{volid},size={}'",
                    drive::format_size(size)
                ));
                d.volume = volid;
                d.opts.insert("size".into(), drive::format_size(size));
            } else if let Some((storage, volname)) = d.volid() {
                let place = c
                    .place(storage, &vm_node)
                    .map_err(|e| ApiError::die(e.to_string()))?;
                // qemu-server Qemu.pm create_disks: activate_volumes, then
                // volume_size_info, then "volume $volid does not exist" for 0.
                let kind = c
                    .storages
                    .get(storage)
                    .map_or(StorageType::Lvmthin, |s| s.kind);
                c.lv_activate(storage, volname, &vm_node);
                let size = match c.volume(&place, volname).map(|v| v.size) {
                    Some(size) if size > 0 => size,
                    Some(_) => {
                        return Err(ApiError::die(format!("volume {} does not exist", d.volume)));
                    }
                    None => {
                        return Err(ApiError::die(
                            super::texts::activation_error(kind, storage, volname, in_worker)
                                .unwrap_or_else(|| {
                                    super::texts::size_probe_error(kind, storage, volname)
                                }),
                        ));
                    }
                };
                // The server reads the real size and overwrites `size=`.
                d.opts.insert("size".into(), drive::format_size(size));
            }
            value = d.canonical();
        }
        let vm = common::vm_mut(c, node, vmid)?;
        vm.pending_delete.remove(&key);
        if vm.pending.get(&key) != Some(&value) {
            vm.pending.insert(key, value);
        }
    }

    for key in call
        .get("revert")
        .unwrap_or_default()
        .split([',', ';', ' '])
        .filter(|k| !k.is_empty())
    {
        let vm = common::vm_mut(c, node, vmid)?;
        // Reverting a key that is only pending deletes it, with the
        // delete's checks (qemu-server Qemu.pm $load_and_check_config:
        // `push @delete, $opt`), protection among them.
        if drive::is_drive_key(key)
            && !vm.config.contains_key(key)
            && vm.pending.contains_key(key)
            && vm.config.get("protection").is_some_and(|p| p == "1")
        {
            return Err(ApiError::die(format!(
                "can't remove drive '{key}' - protection mode enabled"
            )));
        }
        vm.pending.remove(key);
        vm.pending_delete.remove(key);
    }

    apply_pending(c, vmid, &mut up);
    Ok(up)
}

/// Applies pending changes that need no hot-plug; collects the plugs.
fn apply_pending(c: &mut Cluster, vmid: u32, up: &mut Update) {
    let Some(vm) = c.vms.get(&vmid).cloned() else {
        return;
    };
    let mut released: Vec<(String, bool)> = Vec::new();
    let mut vm2 = vm.clone();
    for (key, value) in &vm.pending {
        let old = vm.config.get(key);
        if !drive::is_drive_key(key) {
            vm2.config.insert(key.clone(), value.clone());
            vm2.pending.remove(key);
            continue;
        }
        if old == Some(value) {
            vm2.pending.remove(key);
            continue;
        }
        if !vm.running {
            if let Some(o) = old {
                released.push((o.clone(), false));
            }
            vm2.config.insert(key.clone(), value.clone());
            vm2.pending.remove(key);
            continue;
        }
        // Running VM.
        let (Ok(new), old_drive) = (Drive::parse(value), old.and_then(|o| Drive::parse(o).ok()))
        else {
            continue;
        };
        match old_drive {
            Some(o) if o.volume == new.volume => {
                if o.only_hot_changes(&new) {
                    vm2.config.insert(key.clone(), value.clone());
                    vm2.pending.remove(key);
                }
                // Other option changes wait for a restart, as in Proxmox.
            }
            old_drive => {
                if drive::hotpluggable(key) && vm.hotplug_disk() {
                    if let Some(o) = old_drive {
                        up.plugs.push(Plug::Remove {
                            key: key.clone(),
                            drive: o,
                        });
                    }
                    up.plugs.push(Plug::Add {
                        key: key.clone(),
                        drive: new,
                    });
                }
                // ide/sata or disk hotplug off: it stays pending until a restart.
            }
        }
    }
    for (key, force) in &vm.pending_delete {
        let Some(old) = vm.config.get(key) else {
            vm2.pending_delete.remove(key);
            continue;
        };
        if !drive::is_drive_key(key) || !vm.running {
            released.push((old.clone(), *force));
            vm2.config.remove(key);
            vm2.pending_delete.remove(key);
        } else if drive::hotpluggable(key)
            && vm.hotplug_disk()
            && let Ok(d) = Drive::parse(old)
        {
            up.plugs.push(Plug::Remove {
                key: key.clone(),
                drive: d,
            });
        }
    }
    if let Some(v) = c.vms.get_mut(&vmid) {
        *v = vm2;
    }
    for (value, force) in released {
        release_drive(c, vmid, &value, force, &mut up.log);
    }
}

/// Plugs disks in and out of a running VM. Failures leave the key pending
/// and come back as `hotplug problem - …` per key.
async fn hotplug(
    ctx: &Arc<Ctx>,
    vmid: u32,
    plugs: Vec<Plug>,
    force: bool,
) -> BTreeMap<String, String> {
    let mut errors = BTreeMap::new();
    if plugs.is_empty() {
        return errors;
    }
    let latency = ctx.cluster().knobs.hotplug_latency_ms;
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    // qemu-server QemuServer.pm qemu_deletescsihw: a disk's controller is
    // unplugged after it, verified for up to 15 s since 9.0.8 (5 s before;
    // commit "device unplug: bump timeout for removing virtio scsi
    // controller"), its error ending " - still busy in guest?" since 9.1.5.
    let (per_disk, eject, poll, scsihw, timeout_polls, suffix) = {
        let c = ctx.cluster();
        (
            c.knobs.hotplug_ms_per_disk,
            c.knobs.guest_eject_ms,
            c.knobs.eject_poll_ms.max(1),
            c.vms
                .get(&vmid)
                .and_then(|v| v.config.get("scsihw"))
                .cloned(),
            if c.qemu_server_at_least((9, 0, 8)) {
                15
            } else {
                5
            },
            if c.qemu_server_at_least((9, 1, 5)) {
                " - still busy in guest?"
            } else {
                ""
            },
        )
    };
    for plug in plugs {
        let key = match &plug {
            Plug::Add { key, .. } | Plug::Remove { key, .. } => key.clone(),
        };
        if errors.contains_key(&key) {
            continue;
        }
        if per_disk > 0 {
            tokio::time::sleep(Duration::from_millis(per_disk)).await;
        }
        let controller = match &plug {
            Plug::Remove { .. } => {
                let c = ctx.cluster();
                c.vms
                    .get(&vmid)
                    .and_then(|vm| controller_left_empty(vm, scsihw.as_deref(), &key))
            }
            Plug::Add { .. } => None,
        };
        if let Some(controller) = controller {
            // The controller's unplug, checked once a second (the first
            // check at once), up to the timeout of this qemu-server version.
            let polls = eject.div_ceil(poll);
            if polls > timeout_polls {
                tokio::time::sleep(Duration::from_millis((timeout_polls + 1) * poll)).await;
                errors.insert(
                    key.clone(),
                    format!(
                        "hotplug problem - error on hot-unplugging device '{controller}'{suffix}"
                    ),
                );
                continue;
            }
            tokio::time::sleep(Duration::from_millis(polls * poll)).await;
        }
        let failed = {
            let mut c = ctx.cluster();
            let failed = crate::knobs::take(&mut c.knobs.fail_hotplugs);
            c.faults.failed_hotplugs += u64::from(failed);
            failed
        };
        let result = if failed {
            Err(match &plug {
                Plug::Add { .. } => format!("error on hotplug device '{key}'"),
                Plug::Remove { .. } => {
                    format!("error on hot-unplugging device '{key}' - still busy in guest?")
                }
            })
        } else {
            crate::qmp::plug(ctx, vmid, &plug_action(&plug)).await
        };
        let mut c = ctx.cluster();
        match result {
            Err(e) => {
                errors.insert(key, format!("hotplug problem - {e}"));
            }
            Ok(()) => {
                let mut log = Vec::new();
                let mut release = None;
                if let Some(vm) = c.vms.get_mut(&vmid) {
                    match &plug {
                        Plug::Remove { key, .. } => {
                            if let Some(old) = vm.config.remove(key) {
                                let f = vm.pending_delete.remove(key).unwrap_or(force);
                                release = Some((old, f));
                            }
                        }
                        Plug::Add { key, .. } => {
                            if let Some(v) = vm.pending.remove(key) {
                                vm.config.insert(key.clone(), v);
                            }
                        }
                    }
                }
                if let Some((old, f)) = release {
                    release_drive(&mut c, vmid, &old, f, &mut log);
                }
            }
        }
    }
    errors
}

/// The SCSI controller removing drive `key` leaves without drives, which
/// qemu-server then unplugs (QemuServer.pm qemu_deletescsihw): always the
/// drive's own `virtioscsiN` with virtio-scsi-single; with the other types
/// `scsihw<N / maxdev>` once no other SCSI drive of the config sits on it
/// (maxdev 7 for lsi, 256 otherwise; DriveDevice.pm scsihw_infos).
fn controller_left_empty(vm: &Vm, scsihw: Option<&str>, key: &str) -> Option<String> {
    let index: u32 = key.strip_prefix("scsi")?.parse().ok()?;
    let hw = scsihw.unwrap_or("lsi");
    if hw == "virtio-scsi-single" {
        return Some(format!("virtioscsi{index}"));
    }
    let maxdev = if hw.starts_with("lsi") { 7 } else { 256 };
    let controller = index / maxdev;
    let shared = vm.config.keys().any(|k| {
        k != key
            && k.strip_prefix("scsi")
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n / maxdev == controller)
    });
    (!shared).then(|| format!("scsihw{controller}"))
}

/// pve-common src/PVE/Format.pm render_bytes with precision 1.
fn render_bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    if bytes > 1023 {
        unit = ((value.ln() / 1024f64.ln()) as usize).min(units.len() - 1);
        value /= 1024f64.powi(unit as i32);
    }
    format!("{value:.1} {}", units[unit])
}

fn plug_action(p: &Plug) -> crate::qmp::Action {
    match p {
        Plug::Add { key, drive } => crate::qmp::Action::Add {
            key: key.clone(),
            drive: drive.clone(),
        },
        Plug::Remove { key, drive } => crate::qmp::Action::Remove {
            key: key.clone(),
            drive: drive.clone(),
        },
    }
}

/// The locked phase of a config write: re-check, stage, plug.
async fn locked_update(
    ctx: &Arc<Ctx>,
    node: &str,
    vmid: u32,
    call: &Call,
    upid: Option<&str>,
) -> Result<Vec<String>, ApiError> {
    let _guard = ctx
        .locks
        .vm(vmid, ctx.lock_timeout())
        .await
        .map_err(ApiError::die)?;
    let owners = lock_import_owners(ctx, node, vmid, call).await?;
    import_delay(ctx, node, vmid, call, upid).await;
    // Without quorum pmxcfs refuses writes: write_config's temporary file
    // cannot be made (pve-common src/PVE/File.pm file_set_contents; the
    // errno is pmxcfs's read-only answer).
    if ctx.cluster().knobs.no_quorum {
        return Err(ApiError::die(format!(
            "unable to open file '/etc/pve/nodes/{node}/qemu-server/{vmid}.conf.tmp.{}' - Permission denied",
            std::process::id()
        )));
    }
    let up = stage_update(
        &mut ctx.cluster(),
        node,
        vmid,
        call,
        upid.is_some(),
        ctx.volume_dir.as_deref(),
    )?;
    // The owners' locks end with the copies (clone_disk), before the hot-plug.
    drop(owners);
    let errors = hotplug(ctx, vmid, up.plugs, call.flag("force")).await;
    if !errors.is_empty() {
        return Err(ApiError::params(errors));
    }
    Ok(up.log)
}

/// qemu-server src/PVE/API2/Qemu.pm $import_from_volid: the source's owner
/// VMID (unless it is the destination; whether or not such a VM exists,
/// as for the placeholder's `vm-9999-…`) is locked for the copy,
/// exclusively while its VM runs (lock_config_full) and shared otherwise
/// (lock_config_shared), 30 s to acquire (three times the config lock's);
/// its `lock:` property is not checked. A timeout is wrapped by
/// create_disks as "cannot import from '$source' - $@".
async fn lock_import_owners(
    ctx: &Arc<Ctx>,
    node: &str,
    vmid: u32,
    call: &Call,
) -> Result<Vec<crate::locks::Guard>, ApiError> {
    let owners: Vec<(String, u32, bool)> = {
        let c = ctx.cluster();
        let vm_node = c
            .vms
            .get(&vmid)
            .map(|v| v.node.clone())
            .unwrap_or_else(|| node.to_string());
        import_sizes(&c, &vm_node, call)
            .into_iter()
            .filter_map(|(src, _)| {
                let (_, n) = common::split_volid(&src).ok()?;
                let owner = owner_of(n).filter(|o| *o != vmid)?;
                Some((src, owner, c.vms.get(&owner).is_some_and(|v| v.running)))
            })
            .collect()
    };
    let timeout = ctx.lock_timeout() * 3;
    let mut guards = Vec::new();
    for (src, owner, running) in owners {
        let held = if running {
            ctx.locks.vm(owner, timeout).await
        } else {
            ctx.locks.vm_shared(owner, timeout).await
        };
        guards.push(held.map_err(|e| ApiError::die(format!("cannot import from '{src}' - {e}")))?);
    }
    Ok(guards)
}

/// The time qemu-img takes for the imports of a write (`copy_ms_per_gib`),
/// with its progress lines appended to the task log as it goes.
async fn import_delay(ctx: &Arc<Ctx>, node: &str, vmid: u32, call: &Call, upid: Option<&str>) {
    let (per_gib, imports) = {
        let c = ctx.cluster();
        let vm_node = c
            .vms
            .get(&vmid)
            .map(|v| v.node.clone())
            .unwrap_or_else(|| node.to_string());
        (c.knobs.copy_ms_per_gib, import_sizes(&c, &vm_node, call))
    };
    if per_gib == 0 {
        return;
    }
    for (_, size) in imports {
        let total =
            Duration::from_millis((size as f64 / (1u64 << 30) as f64 * per_gib as f64) as u64);
        let steps = 10u32;
        for i in 1..=steps {
            tokio::time::sleep(total / steps).await;
            if let Some(u) = upid {
                let done = size / u64::from(steps) * u64::from(i);
                // qemu-server QemuServer/QemuImage.pm convert's parser:
                // "transferred $transferred_h of $total_h ($percent%)", sizes
                // by pve-common PVE/Format.pm render_bytes($n, 1), the
                // percent as qemu-img printed it ("45.00").
                let line = format!(
                    "transferred {} of {} ({:.2}%)",
                    render_bytes(done),
                    render_bytes(size),
                    f64::from(i) * 100.0 / f64::from(steps)
                );
                if let Some(t) = ctx.cluster().tasks.get_mut(u) {
                    t.log.push(line);
                }
            }
        }
    }
}

/// With backing files, an imported volume gets the source's bytes. `cp`
/// keeps the holes of a sparse source (coreutils seeks over them), so a
/// mostly empty 3 GiB disk copies in milliseconds, as `qemu-img convert`
/// skips zeroes.
fn copy_backing_file(dir: &std::path::Path, src: &str, dst: &str) -> Result<(), ApiError> {
    let from = crate::qmp::backing_path(dir, src);
    if !from.is_file() {
        return Ok(());
    }
    let to = crate::qmp::backing_path(dir, dst);
    let out = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&from)
        .arg(&to)
        .output()
        .map_err(|e| ApiError::die(format!("qemu-img: copying {src} to {dst}: {e}")))?;
    if !out.status.success() {
        return Err(ApiError::die(format!(
            "qemu-img: copying {src} to {dst}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The checks both PUT and POST make before any change.
fn checked(ctx: &Ctx, call: &Call) -> Result<(String, u32), ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    let c = ctx.cluster();
    let vm = common::vm(&c, &node, vmid)?;
    validate(&c, &ctx.schema, vm, call)?;
    prechecks(vm, call)?;
    Ok((node, vmid))
}

pub async fn config_put(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let (node, vmid) = checked(&ctx, &call)?;
    locked_update(&ctx, &node, vmid, &call, None).await?;
    Ok(Value::Null)
}

pub async fn config_post(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let (node, vmid) = checked(&ctx, &call)?;
    let task = Task::new(&node, "qmconfig", &vmid.to_string(), &call.caller);
    let upid = task.upid.clone();
    let delay = call
        .get("background_delay")
        .and_then(|d| d.parse::<u64>().ok());
    let task_upid = upid.clone();
    let done = spawn_task(ctx.clone(), task, move |ctx: Arc<Ctx>| async move {
        locked_update(&ctx, &node, vmid, &call, Some(&task_upid))
            .await
            .map_err(|e| {
                if e.errors.is_empty() {
                    e.in_task()
                } else {
                    let detail: Vec<String> =
                        e.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                    format!(
                        "{} {}",
                        e.status.as_u16(),
                        std::iter::once(e.message.clone())
                            .chain(detail)
                            .collect::<Vec<_>>()
                            .join("\n")
                    )
                }
            })
    });
    if let Some(secs) = delay {
        // background_delay: wait for the worker up to `secs`.
        if let Ok(result) = tokio::time::timeout(Duration::from_secs(secs), done).await {
            return match result {
                Ok(Ok(())) => Ok(Value::Null),
                Ok(Err(status)) => Err(ApiError::die(format!(
                    "failed to update VM {vmid}: {status}"
                ))),
                Err(_) => Ok(json!(upid)),
            };
        }
    }
    Ok(json!(upid))
}

pub async fn unlink(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    let mut params = BTreeMap::from([
        ("node".to_string(), node.clone()),
        ("vmid".to_string(), vmid.to_string()),
        ("delete".to_string(), call.req("idlist")?.to_string()),
    ]);
    if call.flag("force") {
        params.insert("force".into(), "1".into());
    }
    let as_delete = Call {
        caller: call.caller.clone(),
        params,
    };
    {
        let c = ctx.cluster();
        prechecks(common::vm(&c, &node, vmid)?, &as_delete)?;
    }
    locked_update(&ctx, &node, vmid, &as_delete, None).await?;
    Ok(Value::Null)
}

pub async fn resize(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let vmid = call.vmid()?;
    let disk = call.req("disk")?.to_string();
    let size = call.req("size")?.to_string();
    common::vm(&ctx.cluster(), &node, vmid)?;
    let task = Task::new(&node, "resize", &vmid.to_string(), &call.caller);
    let upid = task.upid.clone();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let _guard = ctx.locks.vm(vmid, ctx.lock_timeout()).await?;
        let (key_drive, new_size, grow) = {
            let mut c = ctx.cluster();
            let vm = common::vm(&c, &node, vmid).map_err(|e| e.message)?;
            if let Some(d) = call.get("digest")
                && d != vm.digest()
            {
                return Err("checksum mismatch (file change by other user?)".into());
            }
            if let Some(lock) = vm.lock() {
                return Err(format!("VM is locked ({lock})"));
            }
            let running = vm.running;
            let value = vm
                .config
                .get(&disk)
                .ok_or(format!("disk '{disk}' does not exist"))?;
            let mut d = Drive::parse(value).map_err(|e| e.to_string())?;
            if d.is_cdrom() {
                return Err("you can't resize a cdrom".into());
            }
            let (storage, volname) = d
                .volid()
                .map(|(s, n)| (s.to_string(), n.to_string()))
                .ok_or(format!("disk '{disk}' has no associated volume"))?;
            // Qemu.pm resize_vm checks the storage privilege in the worker,
            // under the config lock: a task failure, its text the
            // exception's with its code (pve-common Exception.pm stringify).
            c.check(
                &call.caller,
                &format!("/storage/{storage}"),
                &["Datastore.AllocateSpace"],
                false,
            )
            .map_err(|e| e.in_task())?;
            let place = c.place(&storage, &node).map_err(|e| e.to_string())?;
            let kind = c
                .storages
                .get(&storage)
                .map(|s| s.kind)
                .ok_or("no storage")?;
            // Qemu.pm resize_vm: activate_volumes, then volume_size_info,
            // inside the worker.
            c.lv_activate(&storage, &volname, &node);
            let current = match c.volume(&place, &volname).map(|v| v.size) {
                Some(size) => size,
                None => {
                    return Err(super::texts::activation_error(kind, &storage, &volname, true).unwrap_or_else(|| match kind {
                        StorageType::Rbd => super::texts::size_probe_error(kind, &storage, &volname),
                        _ => format!("Could not determine current size of volume '{storage}:{volname}'"),
                    }));
                }
            };
            let (plus, amount) = match size.strip_prefix('+') {
                Some(s) => (true, s),
                None => (false, size.as_str()),
            };
            let amount = drive::parse_size(amount).ok_or(format!("invalid size '{size}'"))?;
            let target = if plus { current + amount } else { amount };
            if target < current {
                return Err("shrinking disks is not supported".into());
            }
            if target == current {
                return Ok(vec![]);
            }
            // pve-storage Storage.pm volume_resize pads to 1 KiB; the
            // plugin rounds its own allocation (resize_rounding); the config
            // keeps the size asked for (Qemu.pm resize_vm: $drive->{size}).
            let padded = target.div_ceil(1024) * 1024;
            let new_size = kind.resize_rounding(padded, running);
            if let Some(v) = c.volumes.get_mut(&place).and_then(|m| m.get_mut(&volname)) {
                v.size = new_size;
            }
            d.opts.insert("size".into(), drive::format_size(target));
            if let Some(vm) = c.vms.get_mut(&vmid) {
                vm.config.insert(disk.clone(), d.canonical());
            }
            (d, new_size, running)
        };
        if grow {
            crate::qmp::plug(
                &ctx,
                vmid,
                &crate::qmp::Action::Resize {
                    key: disk.clone(),
                    drive: key_drive,
                    size: new_size,
                },
            )
            .await?;
        }
        Ok(vec![format!(
            "Resized disk {disk} to {}",
            drive::format_size(new_size)
        )])
    });
    Ok(json!(upid))
}
