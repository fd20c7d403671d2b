//! The QMP backend: a VM bound to a QEMU QMP socket gets its disks
//! hot-plugged, resized and unplugged for real, with the command sequence
//! Proxmox VE 9 uses (throttle group, `blockdev-add`, `device_add scsi-hd`
//! with `wwn` and `serial`, `block_resize`, `device_del`, `blockdev-del`).
//! Each volume is backed by one sparse raw file. VMs without a binding are
//! simulated only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::ctx::Ctx;
use crate::drive::Drive;

/// A disk change on a running VM.
#[derive(Debug, Clone)]
pub enum Action {
    Add {
        key: String,
        drive: Drive,
    },
    Remove {
        key: String,
        drive: Drive,
    },
    Resize {
        key: String,
        drive: Drive,
        size: u64,
    },
}

/// One QMP session.
struct Session {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
    events: Vec<Value>,
}

impl Session {
    async fn open(socket: &str) -> Result<Self, String> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| format!("QMP socket {socket}: {e}"))?;
        let (r, w) = stream.into_split();
        let mut s = Self {
            reader: BufReader::new(r),
            writer: w,
            events: Vec::new(),
        };
        s.read_message().await?; // greeting
        s.execute("qmp_capabilities", json!({})).await?;
        Ok(s)
    }

    async fn read_message(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        let n = tokio::time::timeout(Duration::from_secs(10), self.reader.read_line(&mut line))
            .await
            .map_err(|_| "QMP: no answer within 10 s".to_string())?
            .map_err(|e| format!("QMP read: {e}"))?;
        if n == 0 {
            return Err("QMP: connection closed".into());
        }
        serde_json::from_str(&line).map_err(|e| format!("QMP: bad message {line:?}: {e}"))
    }

    async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let msg = json!({ "execute": command, "arguments": arguments });
        self.writer
            .write_all(format!("{msg}\n").as_bytes())
            .await
            .map_err(|e| format!("QMP write: {e}"))?;
        loop {
            let m = self.read_message().await?;
            if m.get("event").is_some() {
                self.events.push(m);
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                let desc = e
                    .get("desc")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown error");
                return Err(desc.to_string());
            }
        }
    }

    /// Waits for `DEVICE_DELETED` of `id` (Proxmox waits about 5 s).
    async fn wait_deleted(&mut self, id: &str) -> Result<(), String> {
        let seen = |events: &[Value]| {
            events
                .iter()
                .any(|e| e["event"] == "DEVICE_DELETED" && e["data"]["device"] == id)
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !seen(&self.events) {
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "error on hot-unplugging device '{id}' - still busy in guest?"
                ));
            }
            let m = tokio::time::timeout_at(deadline, self.read_message())
                .await
                .map_err(|_| {
                    format!("error on hot-unplugging device '{id}' - still busy in guest?")
                })??;
            if m.get("event").is_some() {
                self.events.push(m);
            }
        }
        Ok(())
    }
}

/// Where the file backing `volid` lives.
pub fn backing_path(dir: &Path, volid: &str) -> PathBuf {
    let name: String = volid
        .chars()
        .map(|c| if c == '/' || c == ':' { '_' } else { c })
        .collect();
    dir.join(format!("{name}.img"))
}

/// Where a thick LVM storage's freed extents wait for the next volume.
fn freed_extents(dir: &Path, volid: &str) -> PathBuf {
    let storage = volid.split(':').next().unwrap_or(volid);
    dir.join(format!("{storage}.freed-extents.img"))
}

/// A removed volume's backing file: gone, or on thick LVM without
/// `saferemove` kept as the extents the next volume gets, bytes and all
/// (pve-storage src/PVE/Storage/LVMPlugin.pm: `free_lvm_volumes_locked`
/// runs only `lvremove -f` without `saferemove`; `lvcreate` runs `lvcreate
/// -aly -Wy`, whose zeroing, lvm2's default `--zero y`, covers the first
/// 4 KiB only, lvcreate(8)).
pub fn release_backing(dir: &Path, volid: &str, keep_extents: bool) {
    let path = backing_path(dir, volid);
    if keep_extents && path.exists() {
        let _ = std::fs::rename(&path, freed_extents(dir, volid));
    } else {
        let _ = std::fs::remove_file(path);
    }
}

/// The file backing a volume, created sparse and at least `size` long; on a
/// storage whose freed extents wait, made of them.
pub fn backing_file(dir: &Path, volid: &str, size: u64) -> Result<PathBuf, String> {
    let path = backing_path(dir, volid);
    if !path.exists() && std::fs::rename(freed_extents(dir, volid), &path).is_ok() {
        use std::os::unix::fs::FileExt;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.write_all_at(&[0u8; 4096], 0))
            .map_err(|e| format!("zeroing the head of {}: {e}", path.display()))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("backing file {}: {e}", path.display()))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len < size {
        f.set_len(size)
            .map_err(|e| format!("growing {}: {e}", path.display()))?;
    }
    Ok(path)
}

fn lun(key: &str) -> Result<u64, String> {
    key.strip_prefix("scsi")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("only scsi disks can be hot-plugged over QMP, not {key}"))
}

/// The bus and address of drive `scsi<index>` by the VM's `scsihw`
/// (qemu-server src/PVE/QemuServer/DriveDevice.pm scsihw_infos,
/// print_drivedevice_full): lsi (7 ids a controller) and pvscsi by
/// `scsi-id`, the others by `lun` at id 0, all on the first controller
/// `scsihw0`; the bound guest has that one controller only.
fn address(dev: &mut serde_json::Value, scsihw: Option<&str>, index: u64) -> Result<(), String> {
    let hw = scsihw.unwrap_or("lsi");
    let by_id = hw.starts_with("lsi") || hw == "pvscsi";
    if hw == "virtio-scsi-single" || (hw.starts_with("lsi") && index >= 7) {
        return Err(format!(
            "pvesim's QMP backend has one controller, scsihw0: scsi{index} on {hw} needs a controller of its own"
        ));
    }
    dev["bus"] = json!("scsihw0.0");
    if by_id {
        dev["scsi-id"] = json!(index);
    } else {
        dev["channel"] = json!(0);
        dev["scsi-id"] = json!(0);
        dev["lun"] = json!(index);
    }
    Ok(())
}

fn wwn(d: &Drive) -> Option<u64> {
    d.opts
        .get("wwn")
        .and_then(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok())
}

fn volume_size(ctx: &Ctx, vmid: u32, d: &Drive) -> u64 {
    let c = ctx.cluster();
    let node = c.vms.get(&vmid).map(|v| v.node.clone()).unwrap_or_default();
    d.volid()
        .and_then(|(s, n)| {
            c.place(s, &node)
                .ok()
                .and_then(|p| c.volume(&p, n).map(|v| v.size))
        })
        .unwrap_or(0)
}

/// Carries out `action` on VM `vmid`'s QEMU, if it is bound to one.
pub async fn plug(ctx: &Arc<Ctx>, vmid: u32, action: &Action) -> Result<(), String> {
    if let Some((host_vm, loop_dir)) = &ctx.loop_host
        && *host_vm == vmid
    {
        return plug_loop(ctx, vmid, loop_dir, action);
    }
    let (socket, scsihw) = {
        let c = ctx.cluster();
        let vm = c.vms.get(&vmid);
        (
            vm.and_then(|v| v.qmp.clone()),
            vm.and_then(|v| v.config.get("scsihw").cloned()),
        )
    };
    let Some(socket) = socket else { return Ok(()) };
    let dir = ctx
        .volume_dir
        .clone()
        .ok_or("VM is bound to QMP but pvesim has no --volume-dir for backing files")?;
    let mut s = Session::open(&socket).await?;
    match action {
        Action::Add { key, drive } => {
            let size = volume_size(ctx, vmid, drive);
            let file = backing_file(&dir, &drive.volume, size)?;
            let node = format!("drive-{key}");
            s.execute("object-add", json!({"qom-type": "throttle-group", "id": format!("throttle-{node}"), "limits": {}}))
                .await?;
            let cache = json!({"direct": false, "no-flush": false});
            s.execute(
                "blockdev-add",
                json!({
                    "driver": "throttle", "node-name": node, "throttle-group": format!("throttle-{node}"),
                    "discard": if drive.opts.get("discard").map(String::as_str) == Some("on") { "unmap" } else { "ignore" },
                    "detect-zeroes": "on", "read-only": drive.opts.get("ro").map(String::as_str) == Some("1"),
                    "file": {
                        "driver": "raw", "node-name": format!("f{node}"), "cache": cache,
                        "file": {"driver": "file", "filename": file, "node-name": format!("e{node}"), "cache": cache, "aio": "threads"},
                    },
                }),
            )
            .await?;
            let mut dev = json!({
                "driver": "scsi-hd", "drive": node, "id": key, "device_id": node, "write-cache": "on",
            });
            address(&mut dev, scsihw.as_deref(), lun(key)?)?;
            if let Some(w) = wwn(drive) {
                dev["wwn"] = json!(w);
            }
            if let Some(serial) = drive.opts.get("serial") {
                dev["serial"] = json!(serial);
            }
            if let Err(e) = s.execute("device_add", dev).await {
                // Undo the block node, as qemu-server does on a failed add.
                let _ = s.execute("blockdev-del", json!({"node-name": node})).await;
                let _ = s
                    .execute("object-del", json!({"id": format!("throttle-{node}")}))
                    .await;
                return Err(e);
            }
            Ok(())
        }
        Action::Remove { key, .. } => {
            let node = format!("drive-{key}");
            s.execute("device_del", json!({"id": key})).await?;
            s.wait_deleted(key).await?;
            s.execute("blockdev-del", json!({"node-name": node}))
                .await?;
            s.execute("object-del", json!({"id": format!("throttle-{node}")}))
                .await?;
            Ok(())
        }
        Action::Resize { key, drive, size } => {
            backing_file(&dir, &drive.volume, *size)?;
            s.execute(
                "block_resize",
                json!({"node-name": format!("drive-{key}"), "size": size}),
            )
            .await?;
            Ok(())
        }
    }
}

/// The loop-device host: a disk added to the VM becomes a loop device on
/// this host, backed by `<loop_dir>/<wwn>.raw`; removed, it is detached.
fn plug_loop(ctx: &Ctx, vmid: u32, loop_dir: &Path, action: &Action) -> Result<(), String> {
    let dir = ctx
        .volume_dir
        .clone()
        .ok_or("the loop host needs a volume_dir for backing files")?;
    let link = |drive: &Drive| -> Result<PathBuf, String> {
        let w = drive
            .opts
            .get("wwn")
            .ok_or("a disk for the loop host needs a wwn")?;
        Ok(loop_dir.join(format!(
            "{}.raw",
            w.trim_start_matches("0x").to_ascii_lowercase()
        )))
    };
    let losetup = |args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new("losetup")
            .args(args)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let devices = |file: &Path| -> Vec<String> {
        let listed = losetup(&["-j", &file.display().to_string()]).unwrap_or_default();
        listed
            .lines()
            .filter_map(|l| l.split(':').next())
            .map(str::to_string)
            .collect()
    };
    match action {
        Action::Add { drive, .. } => {
            let file = backing_file(&dir, &drive.volume, volume_size(ctx, vmid, drive))?;
            let link = link(drive)?;
            let _ = std::fs::remove_file(&link);
            std::fs::hard_link(&file, &link)
                .map_err(|e| format!("linking {}: {e}", link.display()))?;
            losetup(&["--find", "--show", &link.display().to_string()]).map(|_| ())
        }
        Action::Remove { drive, .. } => {
            let link = link(drive)?;
            for dev in devices(&link) {
                losetup(&["-d", &dev])?;
            }
            let _ = std::fs::remove_file(&link);
            Ok(())
        }
        Action::Resize { drive, size, .. } => {
            backing_file(&dir, &drive.volume, *size)?;
            for dev in devices(&link(drive)?) {
                losetup(&["-c", &dev])?;
            }
            Ok(())
        }
    }
}
