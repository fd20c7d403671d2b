//! Routing of `/api2/json/...` paths to handlers, and request parameters.

mod access;
mod version;

use std::collections::BTreeMap;

use axum::http::{HeaderMap, Method, header};
use serde_json::Value;

use crate::auth;
use crate::reply::ApiError;
use crate::server::Ctx;

/// Request parameters, from the query string and (for POST/PUT) the body.
/// Query parameters override body keys, as in pve-http-server.
#[derive(Debug, Default, Clone)]
pub struct Params(pub BTreeMap<String, String>);

impl Params {
    pub fn from_request(
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Self, ApiError> {
        let mut map = BTreeMap::new();
        if !body.is_empty() {
            if matches!(*method, Method::GET | Method::DELETE) {
                return Err(ApiError::not_implemented(format!(
                    "Unexpected content for method '{method}'"
                )));
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
        // The cache buster is dropped silently.
        map.remove("_dc");
        Ok(Self(map))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

/// Routes one request. `path` is what follows `/api2/json`.
pub fn route(
    ctx: &Ctx,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    params: Params,
) -> Result<Value, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // The one unauthenticated endpoint.
    if let (&Method::POST, ["access", "ticket"]) = (method, segs.as_slice()) {
        return access::ticket(ctx, &params);
    }
    let caller = {
        let state = ctx.state.lock().map_err(|_| ApiError::die("state poisoned"))?;
        let tickets = ctx
            .tickets
            .lock()
            .map_err(|_| ApiError::die("state poisoned"))?;
        auth::authenticate(&state, &tickets, method, headers)?
    };
    match (method, segs.as_slice()) {
        (&Method::GET, ["version"]) => version::get(ctx, &caller),
        _ => Err(not_implemented(method, path)),
    }
}

fn not_implemented(method: &Method, path: &str) -> ApiError {
    ApiError::not_implemented(format!("Method '{method} {path}' not implemented"))
}

