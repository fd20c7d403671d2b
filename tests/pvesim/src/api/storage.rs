//! pve-storage endpoints: storage lists and status, volume allocation,
//! lookup, deletion, and the root-only copy.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Call;
use super::common;
use super::texts::vgname;
use super::worker::spawn_task;
use crate::ctx::Ctx;
use crate::reply::ApiError;
use crate::state::{Cluster, StorageSpec, StorageType, Volume, format_of, owner_of};
use crate::tasks::Task;

fn visible(c: &Cluster, caller: &str, id: &str) -> bool {
    let p = format!("/storage/{id}");
    c.has_priv(caller, &p, "Datastore.Audit") || c.has_priv(caller, &p, "Datastore.AllocateSpace")
}

fn config_json(st: &StorageSpec) -> Value {
    let mut v = json!({
        "storage": st.id, "type": st.kind.name(), "content": st.content.join(","), "digest": "0123456789abcdef0123456789abcdef01234567",
    });
    if st.is_shared() {
        v["shared"] = json!(1);
    }
    if let Some(n) = &st.nodes {
        v["nodes"] = json!(n.join(","));
    }
    if st.disable {
        v["disable"] = json!(1);
    }
    match st.kind {
        StorageType::Lvmthin => {
            v["vgname"] = json!(vgname(st.kind));
            v["thinpool"] = json!("data");
        }
        StorageType::Lvm => {
            v["vgname"] = json!(vgname(st.kind));
            if st.saferemove {
                v["saferemove"] = json!(1);
            }
            if st.snapshot_as_volume_chain {
                v["snapshot-as-volume-chain"] = json!(1);
            }
        }
        StorageType::Zfspool => v["pool"] = json!("rpool/data"),
        StorageType::Rbd => {
            v["pool"] = json!("rbd");
            if st.krbd {
                v["krbd"] = json!(1);
            }
        }
        StorageType::Dir => v["path"] = json!(format!("/var/lib/vz-{}", st.id)),
        StorageType::Nfs => {
            v["path"] = json!(format!("/mnt/pve/{}", st.id));
            v["server"] = json!("192.0.2.50");
            v["export"] = json!(format!("/export/{}", st.id));
        }
    }
    if let Some(f) = &st.format {
        v["format"] = json!(f);
    }
    v
}

pub async fn config_list(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    Ok(Value::Array(
        c.storages
            .values()
            .filter(|st| visible(&c, &call.caller, &st.id))
            .filter(|st| call.get("type").is_none_or(|t| t == st.kind.name()))
            .map(config_json)
            .collect(),
    ))
}

pub async fn config_get(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let id = call.req("storage")?;
    c.storages
        .get(id)
        .map(config_json)
        .ok_or_else(|| ApiError::die(format!("storage '{id}' does not exist")))
}

fn status_json(
    c: &Cluster,
    node: &str,
    st: &StorageSpec,
    with_fraction: bool,
) -> Result<Value, ApiError> {
    let enabled = st.enabled_on(node);
    // An unmounted NFS storage reports no status, and storage_info leaves
    // it inactive with zero sizes (NFSPlugin.pm status returns undef when
    // nfs_is_mounted fails; Storage.pm storage_info `next if !$active`).
    let active = enabled && st.online();
    let mut v = json!({
        "storage": st.id, "type": st.kind.name(), "content": st.content.join(","),
        "shared": i32::from(st.is_shared()), "enabled": i32::from(enabled), "active": i32::from(active),
        "total": 0, "used": 0, "avail": 0,
    });
    if active {
        let place = c
            .place(&st.id, node)
            .map_err(|e| ApiError::die(e.to_string()))?;
        let used = c.used(&place);
        v["total"] = json!(st.total);
        v["used"] = json!(used);
        v["avail"] = json!(st.total.saturating_sub(used));
        if with_fraction && st.total > 0 {
            v["used_fraction"] = json!(used as f64 / st.total as f64);
        }
    }
    Ok(v)
}

pub async fn node_list(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let node = call.req("node")?;
    common::node(&c, node)?;
    if let Some(id) = call.get("storage")
        && !c.storages.contains_key(id)
    {
        return Err(ApiError::param("storage", "No such storage."));
    }
    let mut out = Vec::new();
    for st in c.storages.values() {
        if !visible(&c, &call.caller, &st.id) || call.get("storage").is_some_and(|s| s != st.id) {
            continue;
        }
        if let Some(want) = call.get("content")
            && !want.split(',').any(|w| st.content.iter().any(|x| x == w))
        {
            continue;
        }
        if call.flag("enabled") && !st.enabled_on(node) {
            continue;
        }
        if let Some(target) = call.get("target")
            && !(st.is_shared() && st.enabled_on(target) && st.enabled_on(node))
        {
            continue;
        }
        out.push(status_json(&c, node, st, true)?);
    }
    Ok(Value::Array(out))
}

pub async fn status(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let node = call.req("node")?;
    common::node(&c, node)?;
    let st = c
        .storages
        .get(call.req("storage")?)
        .ok_or_else(|| ApiError::param("storage", "No such storage."))?;
    let mut v = status_json(&c, node, st, false)?;
    if let Some(o) = v.as_object_mut() {
        o.remove("storage");
    }
    Ok(v)
}

/// A listing's row. A qcow2 volume of a thick LVM volume chain that is
/// inactive on the listing node has no `size`, only the LV's
/// `approximate-size`, an upper bound (pve-storage LVMPlugin.pm
/// list_images, since fix #6819 in libpve-storage-perl 9.1.5).
fn volume_row(storage: &str, volname: &str, v: &Volume, inactive: bool) -> Value {
    let mut row = json!({
        "volid": format!("{storage}:{volname}"), "content": "images", "format": v.format,
        "size": v.size, "vmid": v.owner, "ctime": v.ctime,
    });
    if inactive && let Some(o) = row.as_object_mut() {
        o.remove("size");
        // The LV holds the qcow2 metadata too (calculate_lvm_size: qemu-img
        // measure), in 4 MiB extents.
        o.insert(
            "approximate-size".into(),
            json!((v.size + (v.size >> 13)).div_ceil(4 << 20) * (4 << 20)),
        );
    }
    row
}

pub async fn content_list(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let node = call.req("node")?;
    common::node(&c, node)?;
    let id = call.req("storage")?;
    common::storage(&c, node, id)?;
    if call.get("content").is_some_and(|t| t != "images") {
        return Ok(json!([]));
    }
    let place = c
        .place(id, node)
        .map_err(|e| ApiError::die(e.to_string()))?;
    let vmid: Option<u32> = call.get("vmid").and_then(|v| v.parse().ok());
    let mut rows: Vec<(String, Value)> = c
        .volumes
        .get(&place)
        .map(|m| {
            m.iter()
                .filter(|(_, v)| vmid.is_none_or(|id| v.owner == id))
                // Each image is listed only to a caller that may access it:
                // Datastore.Allocate on the storage, or Datastore.Audit
                // there and VM.Config.Disk on its owner (pve-storage
                // API2/Storage/Content.pm index → Storage.pm
                // check_volume_access).
                .filter(|(_, v)| {
                    c.has_priv(
                        &call.caller,
                        &format!("/storage/{id}"),
                        "Datastore.Allocate",
                    ) || (c.has_priv(&call.caller, &format!("/storage/{id}"), "Datastore.Audit")
                        && c.has_priv(&call.caller, &format!("/vms/{}", v.owner), "VM.Config.Disk"))
                })
                .map(|(n, v)| {
                    let inactive = c.lv_inactive(id, n, node);
                    (
                        format!("{id}:{n}").to_lowercase(),
                        volume_row(id, n, v, inactive),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Value::Array(rows.into_iter().map(|(_, v)| v).collect()))
}

/// Size parameter of content POST: plain digits are KiB, `M` MiB, `G` GiB.
fn alloc_size(s: &str) -> Option<u64> {
    let (n, mult) = match s.strip_suffix('G') {
        Some(n) => (n, 1u64 << 30),
        None => match s.strip_suffix('M') {
            Some(n) => (n, 1 << 20),
            None => (s, 1 << 10),
        },
    };
    n.parse::<u64>().ok().map(|v| v * mult)
}

/// pve-storage's per-plugin naming rules; `Ok(format)` when the name is legal.
fn check_name(
    kind: StorageType,
    chain: bool,
    name: &str,
    vmid: u32,
    format: Option<&str>,
) -> Result<String, ApiError> {
    let prefix = format!("vm-{vmid}-");
    if kind == StorageType::Lvm {
        return check_lvm_name(chain, name, format);
    }
    if kind.file_based() {
        let re = regex::Regex::new(r"^[^/\s]+\.(raw|qcow2|vmdk)$")
            .map_err(|e| ApiError::die(e.to_string()))?;
        let Some(c) = re.captures(name) else {
            return Err(ApiError::die(format!(
                "unable to parse volume filename '{name}'"
            )));
        };
        let ext = c[1].to_string();
        if let Some(f) = format
            && f != ext
        {
            return Err(ApiError::param(
                "format",
                format!("different storage formats ({ext} != {f})"),
            ));
        }
        return Ok(ext);
    }
    if !name.starts_with(&prefix) {
        return Err(ApiError::die(format!(
            "illegal name '{name}' - should be 'vm-{vmid}-*'"
        )));
    }
    if let Some(f) = format
        && f != "raw"
    {
        return Err(ApiError::die(format!(
            "unsupported format '{f}' at /usr/share/perl5/PVE/Storage/LvmThinPlugin.pm line 143."
        )));
    }
    if matches!(kind, StorageType::Lvmthin | StorageType::Lvm) {
        let ok = regex::Regex::new(r"(?i)^[a-z0-9][a-z0-9\-_.]*[a-z0-9]$")
            .map(|r| r.is_match(name))
            .unwrap_or(false);
        if !ok {
            return Err(ApiError::die(format!(
                "lvm name '{name}' contains illegal characters"
            )));
        }
    }
    Ok("raw".into())
}

/// LVM (thick): no `vm-<vmid>-` check, only `^vm-\d+-\S+` (pve-storage
/// src/PVE/Storage/LVMPlugin.pm parse_volname); the format defaults to
/// qcow2 with `snapshot-as-volume-chain` (LVMPlugin.pm get_formats, since
/// libpve-storage-perl 9.0.7), and a name must carry the format's
/// extension (LVMPlugin.pm verify_volname_format, since 9.1.7).
fn check_lvm_name(chain: bool, name: &str, format: Option<&str>) -> Result<String, ApiError> {
    let ok = regex::Regex::new(r"^vm-\d+-\S+$")
        .map(|r| r.is_match(name))
        .unwrap_or(false);
    if !ok {
        return Err(ApiError::die(format!(
            "unable to parse lvm volume name '{name}'"
        )));
    }
    let format = format.unwrap_or(if chain { "qcow2" } else { "raw" });
    match (format, chain) {
        ("raw", _) if name.ends_with(".qcow2") => Err(ApiError::die(format!(
            "volume name '{name}' does not match requested format 'raw' (did you mean '{}'?)",
            name.trim_end_matches(".qcow2")
        ))),
        ("raw", _) => Ok("raw".into()),
        ("qcow2", true) if !name.ends_with(".qcow2") => Err(ApiError::die(format!(
            "volume name '{name}' does not match requested format 'qcow2' (did you mean '{name}.qcow2'?)"
        ))),
        ("qcow2", true) => Ok("qcow2".into()),
        ("qcow2", false) => Err(ApiError::die(
            "snapshot-as-volume-chain option need to be enabled to use qcow2 format at /usr/share/perl5/PVE/Storage/LVMPlugin.pm line 770.",
        )),
        // No newline in the die: Perl appends where (LVMPlugin.pm alloc_image).
        (other, _) => Err(ApiError::die(format!(
            "unsupported format '{other}' at /usr/share/perl5/PVE/Storage/LVMPlugin.pm line 696."
        ))),
    }
}

fn duplicate(kind: StorageType, storage: &str, name: &str, vmid: u32) -> ApiError {
    ApiError::die(match kind {
        StorageType::Lvmthin | StorageType::Lvm => format!(
            "lvcreate '{vg}/{name}' error:   Logical Volume \"{name}\" already exists in volume group \"{vg}\"",
            vg = vgname(kind)
        ),
        StorageType::Zfspool => {
            format!("zfs error: cannot create 'rpool/data/{name}': dataset already exists")
        }
        StorageType::Rbd => {
            format!("rbd create '{name}' error: rbd: create error: (17) File exists")
        }
        StorageType::Dir | StorageType::Nfs => {
            format!("disk image '/var/lib/vz-{storage}/images/{vmid}/{name}' already exists")
        }
    })
}

pub async fn allocate(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let id = call.req("storage")?.to_string();
    let (kind, shared, chain) = {
        let c = ctx.cluster();
        common::node(&c, &node)?;
        let st = common::storage(&c, &node, &id)?;
        (st.kind, st.is_shared(), st.snapshot_as_volume_chain)
    };
    let vmid: u32 = call.vmid()?;
    let filename = call.req("filename")?.to_string();
    let size = alloc_size(call.req("size")?)
        .ok_or_else(|| ApiError::param("size", "value does not match the regex pattern"))?;
    let format = check_name(kind, chain, &filename, vmid, call.get("format"))?;
    // A shared storage is locked cluster-wide (PVE::Storage::cluster_lock_storage → cfs_lock_storage).
    if shared && ctx.cluster().knobs.no_quorum {
        return Err(ApiError::die(format!(
            "cfs-lock 'storage-{id}' error: no quorum!"
        )));
    }
    let _guard = ctx
        .locks
        .storage(&id, shared, ctx.lock_timeout())
        .await
        .map_err(ApiError::die)?;
    let mut c = ctx.cluster();
    let place = c
        .place(&id, &node)
        .map_err(|e| ApiError::die(e.to_string()))?;
    let volname = if kind.file_based() {
        format!("{vmid}/{filename}")
    } else {
        filename.clone()
    };
    if c.volume(&place, &volname).is_some() {
        return Err(duplicate(kind, &id, &filename, vmid));
    }
    let size = kind.round(size);
    let total = c.storages.get(&id).map(|s| s.total).unwrap_or(0);
    if matches!(kind, StorageType::Lvm | StorageType::Dir | StorageType::Nfs)
        && c.used(&place) + size > total
    {
        return Err(ApiError::die(format!(
            "not enough free space ({} < {size})",
            total.saturating_sub(c.used(&place))
        )));
    }
    if kind == StorageType::Lvm && format == "qcow2" {
        c.lv_active.insert(
            format!("{id}:{volname}"),
            std::collections::BTreeSet::from([node.clone()]),
        );
    }
    c.volumes.entry(place).or_default().insert(
        volname.clone(),
        Volume {
            size,
            format,
            owner: vmid,
            ctime: crate::clock::now(),
        },
    );
    Ok(json!(format!("{id}:{volname}")))
}

/// `{volume}` is a full volid or a volname of the storage in the path.
fn resolve(call: &Call) -> Result<(String, String), ApiError> {
    let storage = call.req("storage")?;
    let volume = call.req("volume")?;
    match volume.split_once(':') {
        Some((s, _)) if s != storage => Err(ApiError::param(
            "volume",
            format!("storage ID mismatch ({s} != {storage})\n"),
        )),
        Some((_, n)) => Ok((storage.to_string(), n.to_string())),
        None => Ok((storage.to_string(), volume.to_string())),
    }
}

/// What `GET …/content/{volume}` answers for a volume that is not there:
/// the plugin's volume_size_info error (pve-storage API2/Storage/Content.pm
/// info). LVM and LVM-thin: `lvs` with errmsg "can't get size of '$path'",
/// to which PVE::Cmd::run appends lvs' last stderr line (LVMPlugin.pm
/// volume_size_info; pve-common src/PVE/Cmd.pm run); lvm2 indents it by two
/// spaces. ZFS: "zfs error: " + zfs's message (ZFSPoolPlugin.pm zfs_request).
/// RBD: "rbd error: " + rbd's (RBDPlugin.pm rbd_volume_info). Files: the
/// size probe only warns, and Content.pm dies on the missing format. LVM
/// with volume chains probes a `.qcow2` volume as a file, as files are.
fn missing(kind: StorageType, storage: &str, volname: &str) -> ApiError {
    ApiError::die(match kind {
        StorageType::Dir | StorageType::Nfs => {
            format!("volume_size_info on '{storage}:{volname}' failed - no format")
        }
        StorageType::Lvm if volname.ends_with(".qcow2") => {
            format!("volume_size_info on '{storage}:{volname}' failed - no format")
        }
        StorageType::Lvmthin | StorageType::Lvm => {
            let vg = vgname(kind);
            format!(
                "can't get size of '/dev/{vg}/{volname}':   Failed to find logical volume \"{vg}/{volname}\""
            )
        }
        StorageType::Zfspool => {
            format!("zfs error: cannot open 'rpool/data/{volname}': dataset does not exist")
        }
        StorageType::Rbd => {
            format!("rbd error: rbd: error opening image {volname}: (2) No such file or directory")
        }
    })
}

pub async fn volume_get(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let node = call.req("node")?;
    common::node(&c, node)?;
    let (storage, volname) = resolve(&call)?;
    let st = common::storage(&c, node, &storage)?;
    let sp = format!("/storage/{storage}");
    let readable = c.has_priv(&call.caller, &sp, "Datastore.Allocate")
        || (c.has_priv(&call.caller, &sp, "Datastore.Audit")
            && owner_of(&volname)
                .is_some_and(|o| c.has_priv(&call.caller, &format!("/vms/{o}"), "VM.Config.Disk")));
    if !readable {
        return Err(ApiError::forbidden(
            &sp,
            &format!("missing privileges to access {storage}:{volname}"),
        ));
    }
    let place = c
        .place(&storage, node)
        .map_err(|e| ApiError::die(e.to_string()))?;
    let unknown = &c.knobs.missing_volume_text;
    let v = c.volume(&place, &volname).ok_or_else(|| {
        if unknown.is_empty() {
            missing(st.kind, &storage, &volname)
        } else {
            ApiError::die(unknown.clone())
        }
    })?;
    if c.lv_inactive(&storage, &volname, node) {
        // API2/Storage/Content.pm info: `die "volume_size_info on '$volid'
        // failed - no format\n" if !$format`, the text of a missing volume.
        return Err(ApiError::die(format!(
            "volume_size_info on '{storage}:{volname}' failed - no format"
        )));
    }
    let path = match st.kind {
        StorageType::Dir | StorageType::Nfs => format!("/var/lib/vz-{storage}/images/{volname}"),
        StorageType::Zfspool => format!("/dev/zvol/rpool/data/{volname}"),
        StorageType::Rbd => format!("rbd:rbd/{volname}"),
        StorageType::Lvmthin | StorageType::Lvm => format!("/dev/pve/{volname}"),
    };
    Ok(json!({ "path": path, "size": v.size, "used": 0, "format": v.format }))
}

pub async fn volume_put(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let (storage, _) = resolve(&call)?;
    let st = common::storage(&c, call.req("node")?, &storage)?;
    if call.get("protected").is_some() {
        return Err(ApiError::die("only backups support attribute 'protected'"));
    }
    Err(ApiError::die(match st.kind {
        StorageType::Dir | StorageType::Nfs => "only backups can have notes".to_string(),
        _ => "volume notes are not supported for PVE::Storage::LvmThinPlugin at /usr/share/perl5/PVE/Storage/Plugin.pm line 1203.".to_string(),
    }))
}

pub async fn volume_copy(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    if call.caller != "root@pam" {
        return Err(ApiError::new(
            403,
            "Permission check failed (user != root@pam)",
        ));
    }
    let node = call.req("node")?.to_string();
    let (storage, volname) = resolve(&call)?;
    let target = call.req("target")?.to_string();
    let target_node = call.get("target_node").unwrap_or(&node).to_string();
    let task = Task::new(&node, "imgcopy", "", &call.caller);
    let upid = task.upid.clone();
    spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let mut c = ctx.cluster();
        let src = c.place(&storage, &node).map_err(|e| e.to_string())?;
        let vol = c
            .volume(&src, &volname)
            .cloned()
            .ok_or(format!("volume '{storage}:{volname}' does not exist"))?;
        let (tstore, tname) = match target.split_once(':') {
            Some((s, n)) => (s.to_string(), n.to_string()),
            None => (storage.clone(), target.clone()),
        };
        let dst = c.place(&tstore, &target_node).map_err(|e| e.to_string())?;
        if c.volume(&dst, &tname).is_some() {
            return Err(format!("volume '{tstore}:{tname}' already exists"));
        }
        let owner = owner_of(&tname).unwrap_or(vol.owner);
        c.volumes.entry(dst).or_default().insert(
            tname.clone(),
            Volume {
                owner,
                format: format_of(&tname),
                ctime: crate::clock::now(),
                ..vol
            },
        );
        Ok(vec![format!(
            "copied '{storage}:{volname}' to '{tstore}:{tname}'"
        )])
    });
    Ok(json!(upid))
}

pub async fn volume_delete(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let node = call.req("node")?.to_string();
    let (storage, volname) = resolve(&call)?;
    let kind = {
        let c = ctx.cluster();
        common::node(&c, &node)?;
        let st = common::storage(&c, &node, &storage)?;
        c.check(
            &call.caller,
            &format!("/storage/{storage}"),
            &["Datastore.Allocate"],
            false,
        )?;
        st.kind
    };
    let owner = owner_of(&volname)
        .map(|o| o.to_string())
        .unwrap_or_default();
    let task = Task::new(&node, "imgdel", &format!("{owner}@{storage}"), &call.caller);
    let upid = task.upid.clone();
    let delay = call.get("delay").and_then(|d| d.parse::<u64>().ok());
    let done = spawn_task(ctx, task, move |ctx: Arc<Ctx>| async move {
        let shared = ctx
            .cluster()
            .storages
            .get(&storage)
            .is_some_and(|s| s.is_shared());
        let _g = ctx
            .locks
            .storage(&storage, shared, ctx.lock_timeout())
            .await?;
        let mut c = ctx.cluster();
        let keeps_extents = c
            .storages
            .get(&storage)
            .is_some_and(StorageSpec::keeps_extents);
        let place = c.place(&storage, &node).map_err(|e| e.to_string())?;
        // krbd: free_image unmaps the image here, then `rbd rm` fails while
        // another node still maps it (pve-storage RBDPlugin.pm free_image,
        // run_rbd_command: errmsg and rbd's last stderr line; ceph
        // src/tools/rbd/action/Remove.cc on an image with watchers).
        let volid = format!("{storage}:{volname}");
        if let Some(nodes) = c.rbd_mapped.get_mut(&volid) {
            nodes.remove(&node);
            if !nodes.is_empty() {
                return Err(format!(
                    "rbd rm '{volname}' error: This means the image is still open or the client using it crashed. Try again after closing/unmapping it or waiting 30s for the crashed client to timeout."
                ));
            }
            c.rbd_mapped.remove(&volid);
        }
        let removed = c.volumes.get_mut(&place).and_then(|m| m.remove(&volname));
        if removed.is_some()
            && let Some(dir) = &ctx.volume_dir
        {
            crate::qmp::release_backing(dir, &format!("{storage}:{volname}"), keeps_extents);
        }
        match (removed, kind) {
            (Some(_), _) => Ok(vec![format!("Removed volume '{storage}:{volname}'")]),
            // Missing volumes: lvmthin and dir finish OK, others fail in their tool.
            (None, StorageType::Lvmthin) => Ok(vec![]),
            (None, StorageType::Dir | StorageType::Nfs) => Ok(vec![format!(
                "disk image '/var/lib/vz-{storage}/images/{volname}' does not exist"
            )]),
            (None, k) => Err(missing(k, &storage, &volname).message),
        }
    });
    if let Some(secs) = delay
        && let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(secs), done).await
    {
        return r.map(|()| Value::Null).map_err(ApiError::die);
    }
    Ok(json!(upid))
}
