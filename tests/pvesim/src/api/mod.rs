//! Routing of `/api2/json/...` (and the `/pvesim/...` admin API) to handlers.

mod access;
mod admin;
mod cluster;
mod common;
mod qemu;
mod replication;
mod snapshot;
mod storage;
mod tasks;
mod texts;
mod vm_ops;
mod worker;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::http::{HeaderMap, Method, Uri, header};
use serde_json::Value;

use crate::auth;
use crate::ctx::Ctx;
use crate::reply::ApiError;

/// One authenticated, validated call.
#[derive(Debug, Clone)]
pub struct Call {
    /// `user@realm` or `user@realm!token`.
    pub caller: String,
    pub params: BTreeMap<String, String>,
}

impl Call {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params.get(key).map(String::as_str)
    }

    /// A parameter the schema made required (validation ran before).
    pub fn req(&self, key: &str) -> Result<&str, ApiError> {
        self.get(key)
            .ok_or_else(|| ApiError::param(key, "property is missing and it is not optional"))
    }

    pub fn flag(&self, key: &str) -> bool {
        self.get(key) == Some("1")
    }

    pub fn vmid(&self) -> Result<u32, ApiError> {
        self.req("vmid")?
            .parse()
            .map_err(|_| ApiError::param("vmid", "type check ('integer') failed"))
    }
}

type Reply = Pin<Box<dyn Future<Output = Result<Value, ApiError>> + Send>>;
type Handler = fn(Arc<Ctx>, Call) -> Reply;

macro_rules! h {
    ($f:path) => {
        (|ctx, call| Box::pin($f(ctx, call))) as Handler
    };
}

/// Every endpoint pvesim serves: method, path template (as in the schema), handler.
pub fn routes() -> Vec<(Method, &'static str, Handler)> {
    vec![
        (Method::GET, "/version", h!(cluster::version)),
        (Method::GET, "/cluster/status", h!(cluster::status)),
        (Method::GET, "/cluster/resources", h!(cluster::resources)),
        (Method::GET, "/cluster/nextid", h!(cluster::nextid)),
        (Method::GET, "/cluster/options", h!(cluster::options)),
        (Method::GET, "/nodes", h!(cluster::nodes)),
        (
            Method::GET,
            "/nodes/{node}/status",
            h!(cluster::node_status),
        ),
        (Method::GET, "/access/permissions", h!(cluster::permissions)),
        (
            Method::GET,
            "/cluster/ha/resources",
            h!(cluster::ha_resources),
        ),
        (Method::GET, "/cluster/replication", h!(replication::list)),
        (
            Method::POST,
            "/cluster/replication",
            h!(replication::create),
        ),
        (
            Method::GET,
            "/cluster/replication/{id}",
            h!(replication::get),
        ),
        (
            Method::PUT,
            "/cluster/replication/{id}",
            h!(replication::update),
        ),
        (
            Method::DELETE,
            "/cluster/replication/{id}",
            h!(replication::delete),
        ),
        (
            Method::GET,
            "/nodes/{node}/replication",
            h!(replication::node_list),
        ),
        (Method::GET, "/storage", h!(storage::config_list)),
        (Method::GET, "/storage/{storage}", h!(storage::config_get)),
        (Method::GET, "/nodes/{node}/storage", h!(storage::node_list)),
        (
            Method::GET,
            "/nodes/{node}/storage/{storage}/status",
            h!(storage::status),
        ),
        (
            Method::GET,
            "/nodes/{node}/storage/{storage}/content",
            h!(storage::content_list),
        ),
        (
            Method::POST,
            "/nodes/{node}/storage/{storage}/content",
            h!(storage::allocate),
        ),
        (
            Method::GET,
            "/nodes/{node}/storage/{storage}/content/{volume}",
            h!(storage::volume_get),
        ),
        (
            Method::PUT,
            "/nodes/{node}/storage/{storage}/content/{volume}",
            h!(storage::volume_put),
        ),
        (
            Method::POST,
            "/nodes/{node}/storage/{storage}/content/{volume}",
            h!(storage::volume_copy),
        ),
        (
            Method::DELETE,
            "/nodes/{node}/storage/{storage}/content/{volume}",
            h!(storage::volume_delete),
        ),
        (Method::GET, "/nodes/{node}/qemu", h!(qemu::list)),
        (Method::POST, "/nodes/{node}/qemu", h!(vm_ops::create)),
        (Method::GET, "/nodes/{node}/qemu/{vmid}", h!(vm_ops::index)),
        (
            Method::DELETE,
            "/nodes/{node}/qemu/{vmid}",
            h!(vm_ops::destroy),
        ),
        (
            Method::GET,
            "/nodes/{node}/qemu/{vmid}/migrate",
            h!(vm_ops::migrate_check),
        ),
        (
            Method::POST,
            "/nodes/{node}/qemu/{vmid}/migrate",
            h!(vm_ops::migrate),
        ),
        (
            Method::POST,
            "/nodes/{node}/qemu/{vmid}/move_disk",
            h!(vm_ops::move_disk),
        ),
        (
            Method::GET,
            "/nodes/{node}/qemu/{vmid}/snapshot",
            h!(snapshot::list),
        ),
        (
            Method::POST,
            "/nodes/{node}/qemu/{vmid}/snapshot",
            h!(snapshot::create),
        ),
        (
            Method::DELETE,
            "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}",
            h!(snapshot::delete),
        ),
        (
            Method::GET,
            "/nodes/{node}/qemu/{vmid}/config",
            h!(qemu::config_get),
        ),
        (
            Method::POST,
            "/nodes/{node}/qemu/{vmid}/config",
            h!(qemu::config_post),
        ),
        (
            Method::PUT,
            "/nodes/{node}/qemu/{vmid}/config",
            h!(qemu::config_put),
        ),
        (
            Method::GET,
            "/nodes/{node}/qemu/{vmid}/pending",
            h!(qemu::pending),
        ),
        (
            Method::PUT,
            "/nodes/{node}/qemu/{vmid}/unlink",
            h!(qemu::unlink),
        ),
        (
            Method::PUT,
            "/nodes/{node}/qemu/{vmid}/resize",
            h!(qemu::resize),
        ),
        (
            Method::GET,
            "/nodes/{node}/qemu/{vmid}/status/current",
            h!(qemu::status_current),
        ),
        (
            Method::GET,
            "/nodes/{node}/tasks/{upid}/status",
            h!(tasks::status),
        ),
        (
            Method::GET,
            "/nodes/{node}/tasks/{upid}/log",
            h!(tasks::log),
        ),
    ]
}

/// Matches a path against a template; `{volume}` takes the rest of the path.
fn matches(template: &str, path: &str) -> Option<BTreeMap<String, String>> {
    let t: Vec<&str> = template.trim_matches('/').split('/').collect();
    let p: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut out = BTreeMap::new();
    for (i, seg) in t.iter().enumerate() {
        if *seg == "{volume}" {
            if i >= p.len() {
                return None;
            }
            out.insert("volume".to_string(), p[i..].join("/"));
            return (i == t.len() - 1).then_some(out);
        }
        let actual = p.get(i)?;
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            if actual.is_empty() {
                return None;
            }
            out.insert(name.to_string(), actual.to_string());
        } else if seg != actual {
            return None;
        }
    }
    (t.len() == p.len()).then_some(out)
}

/// Request parameters: the query string, and for POST/PUT the body (form
/// or JSON). Query keys override body keys, as in pve-http-server.
fn parameters(
    method: &Method,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut map = BTreeMap::new();
    if !body.is_empty() {
        if matches!(*method, Method::GET | Method::DELETE) {
            return Err(ApiError::not_implemented(format!(
                "Unexpected content for method '{method}'"
            )));
        }
        if body.len() > 512 * 1024 {
            return Err(ApiError::new(413, "Request Entity Too Large"));
        }
        let is_json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if is_json {
            let v: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::new(400, format!("JSON decode error: {e}")))?;
            let Value::Object(obj) = v else {
                return Err(ApiError::new(400, "JSON body is not an object"));
            };
            for (k, v) in obj {
                let s = match v {
                    Value::String(s) => s,
                    Value::Bool(b) => if b { "1" } else { "0" }.to_string(),
                    other => other.to_string(),
                };
                map.insert(k, s);
            }
        } else {
            for (k, v) in url::form_urlencoded::parse(body) {
                map.insert(k.into_owned(), v.into_owned());
            }
        }
    }
    if let Some(q) = query {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            map.insert(k.into_owned(), v.into_owned());
        }
    }
    map.remove("_dc");
    Ok(map)
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("p={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_string())
}

/// The whole pipeline of one request.
pub async fn dispatch(
    ctx: &Arc<Ctx>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    let path = percent_decode(uri.path());
    if let Some(rest) = path.strip_prefix("/pvesim/") {
        return admin::dispatch(ctx, method, rest, uri.query(), body).await;
    }
    let Some(rest) = path.strip_prefix("/api2/") else {
        return Err(ApiError::not_implemented("no such uri"));
    };
    let (format, api_path) = rest.split_once('/').unwrap_or((rest, ""));
    if format != "json" {
        if api_path.is_empty() {
            return Err(ApiError::not_implemented("no such uri"));
        }
        return Err(ApiError::not_implemented(format!(
            "no formatter for uri /{api_path}, {format}"
        )));
    }
    let api_path = format!("/{api_path}");
    let mut params = parameters(method, uri.query(), headers, body)?;

    if let (&Method::POST, "/access/ticket") = (method, api_path.as_str()) {
        return access::ticket(ctx, &params);
    }
    let caller = {
        let c = ctx.cluster();
        let tickets = ctx.tickets.lock().unwrap_or_else(|p| p.into_inner());
        auth::authenticate(&c, &tickets, method, headers)?.0
    };

    let all = routes();
    let mut known_path = false;
    for (m, template, handler) in all {
        let Some(captures) = matches(template, &api_path) else {
            continue;
        };
        known_path = true;
        if m != method {
            continue;
        }
        for (k, v) in captures {
            match params.get(&k) {
                Some(existing) if *existing != v => {
                    return Err(ApiError::param(
                        &k,
                        "duplicate parameter (already defined in URI) with conflicting values!",
                    ));
                }
                _ => {
                    params.insert(k, v);
                }
            }
        }
        ctx.cluster().count(format!("{method} {template}"));
        ctx.schema.validate(template, method.as_str(), &params)?;
        if let Some(check) = ctx
            .schema
            .info(template, method.as_str())
            .and_then(|i| i.pointer("/permissions/check"))
        {
            check_permission(ctx, &caller, check, &params)?;
        }
        return handler(ctx.clone(), Call { caller, params }).await;
    }
    if known_path {
        return Err(ApiError::not_implemented(format!(
            "Method '{method} {api_path}' not implemented"
        )));
    }
    Err(ApiError::not_implemented(format!(
        "Method '{method} {api_path}' not implemented"
    )))
}

/// Applies a schema `["perm", "/vms/{vmid}", [privs], "any", 1]` check.
fn check_permission(
    ctx: &Ctx,
    caller: &str,
    check: &Value,
    params: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    let Some(arr) = check.as_array() else {
        return Ok(());
    };
    if arr.first().and_then(Value::as_str) != Some("perm") {
        return Ok(());
    }
    let mut path = arr
        .get(1)
        .and_then(Value::as_str)
        .unwrap_or("/")
        .to_string();
    for (k, v) in params {
        path = path.replace(&format!("{{{k}}}"), v);
    }
    let privs: Vec<&str> = arr
        .get(2)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let any = arr.get(3).and_then(Value::as_str) == Some("any");
    ctx.cluster().check(caller, &path, &privs, any)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_swallows_the_rest_of_the_path() {
        let m = matches(
            "/nodes/{node}/storage/{storage}/content/{volume}",
            "/nodes/pve1/storage/local/content/local:9999/vm-9999-pvc-a.raw",
        )
        .unwrap();
        assert_eq!(m["volume"], "local:9999/vm-9999-pvc-a.raw");
        assert_eq!(m["node"], "pve1");
        assert!(matches("/nodes/{node}/qemu", "/nodes/pve1/qemu/100").is_none());
        assert!(matches("/version", "/version").is_some());
    }
}
