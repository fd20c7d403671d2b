//! The admin API under `/pvesim/`, for tests, benchmarks and the demo:
//! call counters, fault knobs, VM locks, and a view of the state.
//!
//! | method | path | effect |
//! |---|---|---|
//! | GET / DELETE | `counters` | calls per `METHOD /template`; DELETE resets |
//! | GET / POST | `knobs` | read; merge a JSON object of knob values (an unknown knob is a 400) |
//! | GET / DELETE | `faults` | how often each fault was taken; DELETE resets |
//! | POST | `vms/<vmid>/hold-lock?seconds=N` | hold the VM's config lock |
//! | POST | `storages/<id>/hold-lock?seconds=N` | hold the storage's allocation lock |
//! | PUT / DELETE | `vms/<vmid>/lock?value=backup` | set or clear the VM's `lock` |
//! | POST | `daemon/busy?workers=N&seconds=S` | N slow calls hold pvedaemon's workers for S seconds (with `daemon_workers` set) |
//! | PUT | `vms/<vmid>/running?value=0\|1` | stop or start the VM |
//! | PUT | `storages/<id>/online?value=0\|1` | an NFS storage's server stops or starts answering |
//! | PUT | `nodes/<name>/online?value=0\|1` | a node goes down (calls to it answer 595) or comes back |
//! | POST | `vms/<vmid>/relocate?node=N` | the VM moves to node N (HA, an operator) |
//! | PUT / DELETE | `vms/<vmid>/ha` | the VM becomes (or stops being) an HA resource (`ha-manager add vm:<vmid>`) |
//! | GET | `vms/<vmid>` | config, pending and pending deletes |
//! | GET | `volumes` | every volume with its place, size and owner |

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use serde_json::{Value, json};

use crate::ctx::Ctx;
use crate::reply::ApiError;

fn query(q: Option<&str>) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

pub async fn dispatch(
    ctx: &Arc<Ctx>,
    method: &Method,
    path: &str,
    q: Option<&str>,
    body: &[u8],
) -> Result<Value, ApiError> {
    // Parameters from the query string, or a form body (not for `knobs`, whose body is JSON).
    let mut q = query(q);
    if !path.starts_with("knobs") {
        for (k, v) in url::form_urlencoded::parse(body) {
            q.insert(k.into_owned(), v.into_owned());
        }
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let vmid = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| ApiError::new(400, format!("{s:?} is not a VM id")))
    };
    match (method, segs.as_slice()) {
        (&Method::GET, ["counters"]) => Ok(json!(ctx.cluster().counters)),
        (&Method::DELETE, ["counters"]) => {
            ctx.cluster().counters.clear();
            Ok(Value::Null)
        }
        (&Method::GET, ["faults"]) => Ok(json!(ctx.cluster().faults)),
        (&Method::DELETE, ["faults"]) => {
            ctx.cluster().faults = Default::default();
            Ok(Value::Null)
        }
        (&Method::GET, ["knobs"]) => Ok(json!(ctx.cluster().knobs)),
        (&Method::POST, ["knobs"]) => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::new(400, format!("knobs: {e}")))?;
            let mut c = ctx.cluster();
            c.knobs
                .merge(&patch)
                .map_err(|e| ApiError::new(400, format!("knobs: {e}")))?;
            Ok(json!(c.knobs))
        }
        (&Method::POST, ["vms", id, "hold-lock"]) => {
            let id = vmid(id)?;
            let secs: f64 = q
                .get("seconds")
                .and_then(|s| s.parse().ok())
                .unwrap_or(12.0);
            ctx.locks.hold_vm(id, Duration::from_secs_f64(secs));
            ctx.cluster().faults.held_locks += 1;
            // Let the holder take the lock before answering.
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(Value::Null)
        }
        (&Method::POST, ["daemon", "busy"]) => {
            let workers: u32 = q.get("workers").and_then(|s| s.parse().ok()).unwrap_or(3);
            let secs: f64 = q.get("seconds").and_then(|s| s.parse().ok()).unwrap_or(5.0);
            let daemon = ctx
                .daemon()
                .ok_or_else(|| ApiError::new(400, "set the daemon_workers knob first"))?;
            let held = daemon
                .acquire_many_owned(workers)
                .await
                .map_err(|e| ApiError::new(500, e.to_string()))?;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                drop(held);
            });
            Ok(Value::Null)
        }
        (&Method::POST, ["storages", id, "hold-lock"]) => {
            let secs: f64 = q
                .get("seconds")
                .and_then(|s| s.parse().ok())
                .unwrap_or(12.0);
            ctx.locks.hold_storage(id, Duration::from_secs_f64(secs));
            ctx.cluster().faults.held_locks += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(Value::Null)
        }
        (&Method::PUT, ["vms", id, "lock"]) => {
            let id = vmid(id)?;
            let value = q.get("value").cloned().unwrap_or_else(|| "backup".into());
            let mut c = ctx.cluster();
            let vm = c
                .vms
                .get_mut(&id)
                .ok_or_else(|| ApiError::new(404, "no such VM"))?;
            vm.config.insert("lock".into(), value);
            Ok(Value::Null)
        }
        (&Method::DELETE, ["vms", id, "lock"]) => {
            let id = vmid(id)?;
            let mut c = ctx.cluster();
            let vm = c
                .vms
                .get_mut(&id)
                .ok_or_else(|| ApiError::new(404, "no such VM"))?;
            vm.config.remove("lock");
            Ok(Value::Null)
        }
        // An NFS server stops or starts answering (see StorageSpec::online).
        (&Method::PUT, ["storages", id, "online"]) => {
            let mut c = ctx.cluster();
            let st = c
                .storages
                .get_mut(*id)
                .ok_or_else(|| ApiError::new(404, "no such storage"))?;
            st.offline = q.get("value").map(String::as_str) == Some("0");
            Ok(Value::Null)
        }
        // A node goes down or comes back: calls proxied to it answer 595.
        (&Method::PUT, ["nodes", name, "online"]) => {
            let mut c = ctx.cluster();
            let node = c
                .nodes
                .get_mut(*name)
                .ok_or_else(|| ApiError::new(404, "no such node"))?;
            node.online = q.get("value").map(String::as_str) != Some("0");
            Ok(Value::Null)
        }
        // HA or an operator moved the VM to another node (its config file
        // moves with it: nodes/<new>/qemu-server/<id>.conf).
        (&Method::POST, ["vms", id, "relocate"]) => {
            let id = vmid(id)?;
            let target = q
                .get("node")
                .cloned()
                .ok_or_else(|| ApiError::new(400, "node is required"))?;
            let mut c = ctx.cluster();
            if !c.nodes.contains_key(&target) {
                return Err(ApiError::new(400, format!("no node {target}")));
            }
            let vm = c
                .vms
                .get_mut(&id)
                .ok_or_else(|| ApiError::new(404, "no such VM"))?;
            vm.node = target;
            Ok(Value::Null)
        }
        (&Method::PUT, ["vms", id, "ha"]) => {
            let id = vmid(id)?;
            let mut c = ctx.cluster();
            let running = c
                .vms
                .get(&id)
                .ok_or_else(|| ApiError::new(404, "no such VM"))?
                .running;
            c.ha.insert(id, if running { "started" } else { "stopped" }.into());
            Ok(Value::Null)
        }
        (&Method::DELETE, ["vms", id, "ha"]) => {
            let id = vmid(id)?;
            ctx.cluster().ha.remove(&id);
            Ok(Value::Null)
        }
        (&Method::PUT, ["vms", id, "running"]) => {
            let id = vmid(id)?;
            let mut c = ctx.cluster();
            let vm = c
                .vms
                .get_mut(&id)
                .ok_or_else(|| ApiError::new(404, "no such VM"))?;
            let was = vm.running;
            vm.running = q.get("value").map(String::as_str) != Some("0");
            if was && !vm.running {
                c.vm_stopped(id);
            }
            Ok(Value::Null)
        }
        (&Method::GET, ["vms"]) => {
            let c = ctx.cluster();
            Ok(Value::Array(
                c.vms
                    .values()
                    .map(|vm| json!({ "vmid": vm.vmid, "node": vm.node, "running": vm.running, "config": vm.config, "pending": vm.pending }))
                    .collect(),
            ))
        }
        (&Method::GET, ["vms", id]) => {
            let id = vmid(id)?;
            let c = ctx.cluster();
            let vm = c
                .vms
                .get(&id)
                .ok_or_else(|| ApiError::new(404, "no such VM"))?;
            Ok(json!({
                "node": vm.node, "running": vm.running, "config": vm.config,
                "pending": vm.pending, "pending_delete": vm.pending_delete, "digest": vm.digest(),
            }))
        }
        (&Method::GET, ["volumes"]) => {
            let c = ctx.cluster();
            let mut out = Vec::new();
            for ((storage, node), vols) in &c.volumes {
                for (name, v) in vols {
                    out.push(json!({
                        "volid": format!("{storage}:{name}"), "node": node, "size": v.size,
                        "owner": v.owner, "format": v.format,
                    }));
                }
            }
            Ok(Value::Array(out))
        }
        _ => Err(ApiError::not_implemented(format!(
            "pvesim admin: no {method} /pvesim/{path}"
        ))),
    }
}
