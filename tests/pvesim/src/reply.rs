//! Responses shaped like Proxmox's: `{"data": …}` on success; on failure the
//! first line of the message as the HTTP reason phrase, and `message` (plus
//! `errors` for parameter problems) in the body.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub errors: BTreeMap<String, String>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message: message.into(),
            errors: BTreeMap::new(),
        }
    }

    /// A handler's `die "…\n"`: HTTP 500 with the text.
    pub fn die(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// Schema or parameter validation failure, one text per parameter.
    pub fn params(errors: BTreeMap<String, String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: "Parameter verification failed.".into(),
            errors,
        }
    }

    pub fn param(name: &str, text: impl Into<String>) -> Self {
        Self::params(BTreeMap::from([(name.to_string(), text.into())]))
    }

    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(501, message)
    }

    pub fn forbidden(path: &str, privs: &str) -> Self {
        Self::new(403, format!("Permission check failed ({path}, {privs})"))
    }

    /// The error as a worker's exit status: a PVE::Exception stringifies
    /// with its code in front ("403 Permission check failed (…)"; pve-common
    /// src/PVE/Exception.pm stringify), a plain die as its text; newlines
    /// become spaces (pve-common RESTEnvironment.pm fork_worker).
    pub fn in_task(&self) -> String {
        let text = if self.status == StatusCode::INTERNAL_SERVER_ERROR {
            self.message.clone()
        } else {
            format!("{} {}", self.status.as_u16(), self.message)
        };
        text.trim_end().replace('\n', " ")
    }
}

pub fn ok(data: Value) -> Response {
    json_response(StatusCode::OK, None, &json!({ "data": data }))
}

pub fn error(e: &ApiError) -> Response {
    let mut body = json!({ "data": null, "message": format!("{}\n", e.message) });
    if !e.errors.is_empty() {
        body["errors"] = json!(e.errors);
    }
    // Only the first line goes into the status line, and only if it is clean.
    let first = e.message.lines().next().unwrap_or_default();
    let reason = (!first.contains('\r')).then_some(first);
    json_response(e.status, reason, &body)
}

/// A proxied call that never reached its daemon: status and reason only.
pub fn proxy_failure(status: u16, reason: &str) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes().to_vec()) {
        resp.extensions_mut().insert(phrase);
    }
    resp
}

fn json_response(status: StatusCode, reason: Option<&str>, body: &Value) -> Response {
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json;charset=UTF-8"),
    );
    if let Some(reason) = reason
        && let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes().to_vec())
    {
        resp.extensions_mut().insert(phrase);
    }
    resp
}
