//! HTTP access to one Proxmox VE cluster: authentication, the `{"data": …}`
//! envelope, and Proxmox's error reporting (message in the reason phrase).

use std::time::Duration;

use proxmox_csi_common::Secret;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use crate::config::{Cluster, Credentials};

#[derive(Debug, thiserror::Error)]
pub enum PveError {
    #[error("Proxmox cluster {region}: TLS: {reason}")]
    Tls { region: String, reason: String },
    #[error("Proxmox cluster {region}: {method} {path}: {source}")]
    Transport {
        region: String,
        method: Method,
        path: String,
        source: reqwest::Error,
    },
    #[error("Proxmox cluster {region}: {method} {path}: HTTP {status}: {message}")]
    Api {
        region: String,
        method: Method,
        path: String,
        status: StatusCode,
        message: String,
    },
    #[error("Proxmox cluster {region}: {method} {path}: unexpected answer: {reason}")]
    Decode {
        region: String,
        method: Method,
        path: String,
        reason: String,
    },
}

/// `GET /version`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Version {
    pub version: String,
    pub release: String,
    pub repoid: String,
}

#[derive(Deserialize)]
struct Envelope<T> {
    data: T,
}

#[derive(Deserialize)]
struct Ticket {
    ticket: String,
    #[serde(rename = "CSRFPreventionToken")]
    csrf: String,
}

#[derive(Debug)]
struct Session {
    cookie: Secret<String>,
    csrf: Secret<String>,
}

/// A client for one cluster (region).
#[derive(Debug)]
pub struct Client {
    cluster: Cluster,
    http: reqwest::Client,
    session: Mutex<Option<Session>>,
}

impl Client {
    pub fn new(cluster: Cluster, timeout: Duration) -> Result<Self, PveError> {
        let tls = super::tls::client_config(&cluster).map_err(|reason| PveError::Tls {
            region: cluster.region.clone(),
            reason,
        })?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| PveError::Tls {
                region: cluster.region.clone(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            cluster,
            http,
            session: Mutex::new(None),
        })
    }

    pub fn region(&self) -> &str {
        &self.cluster.region
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub async fn version(&self) -> Result<Version, PveError> {
        self.get("/version").await
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, PveError> {
        self.call(Method::GET, path, &[]).await
    }

    /// One API call. `form` goes in the body for POST/PUT and in the query
    /// string otherwise, as the Proxmox API expects.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        form: &[(&str, String)],
    ) -> Result<T, PveError> {
        let url = format!("{}{}", self.cluster.url.as_str().trim_end_matches('/'), path);
        let mut req = self.http.request(method.clone(), &url);
        req = if matches!(method, Method::POST | Method::PUT) {
            req.form(form)
        } else {
            req.query(form)
        };
        req = self.authorize(req, &method).await?;
        let resp = req.send().await.map_err(|source| PveError::Transport {
            region: self.cluster.region.clone(),
            method: method.clone(),
            path: path.to_string(),
            source,
        })?;
        let status = resp.status();
        if !status.is_success() {
            // Proxmox puts the message in the status line (before PVE 8.4 only
            // there); newer servers repeat it, with detail, in the body.
            let reason = resp
                .extensions()
                .get::<hyper::ext::ReasonPhrase>()
                .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
                .or_else(|| status.canonical_reason().map(str::to_string))
                .unwrap_or_default();
            let body = resp.text().await.unwrap_or_default();
            let message = api_message(&body).unwrap_or(reason);
            if status == StatusCode::UNAUTHORIZED {
                *self.session.lock().await = None;
            }
            return Err(PveError::Api {
                region: self.cluster.region.clone(),
                method,
                path: path.to_string(),
                status,
                message,
            });
        }
        let bytes = resp.bytes().await.map_err(|source| PveError::Transport {
            region: self.cluster.region.clone(),
            method: method.clone(),
            path: path.to_string(),
            source,
        })?;
        serde_json::from_slice::<Envelope<T>>(&bytes)
            .map(|e| e.data)
            .map_err(|e| PveError::Decode {
                region: self.cluster.region.clone(),
                method,
                path: path.to_string(),
                reason: e.to_string(),
            })
    }

    async fn authorize(
        &self,
        req: reqwest::RequestBuilder,
        method: &Method,
    ) -> Result<reqwest::RequestBuilder, PveError> {
        match &self.cluster.credentials {
            Credentials::Token { id, secret } => Ok(req.header(
                reqwest::header::AUTHORIZATION,
                format!("PVEAPIToken={id}={}", secret.expose()),
            )),
            Credentials::Password { username, password } => {
                let mut session = self.session.lock().await;
                let s = match &mut *session {
                    Some(s) => &*s,
                    slot @ None => &*slot.insert(self.login(username, password).await?),
                };
                let mut req = req.header(
                    reqwest::header::COOKIE,
                    format!("PVEAuthCookie={}", s.cookie.expose()),
                );
                if *method != Method::GET {
                    req = req.header("CSRFPreventionToken", s.csrf.expose());
                }
                Ok(req)
            }
        }
    }

    async fn login(&self, username: &str, password: &Secret<String>) -> Result<Session, PveError> {
        let path = "/access/ticket";
        let url = format!("{}{path}", self.cluster.url.as_str().trim_end_matches('/'));
        let form = [("username", username), ("password", password.expose().as_str())];
        let transport = |source| PveError::Transport {
            region: self.cluster.region.clone(),
            method: Method::POST,
            path: path.to_string(),
            source,
        };
        let resp = self.http.post(url).form(&form).send().await.map_err(transport)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(PveError::Api {
                region: self.cluster.region.clone(),
                method: Method::POST,
                path: path.to_string(),
                status,
                message: format!("login as {username} failed"),
            });
        }
        let t: Envelope<Ticket> = resp.json().await.map_err(transport)?;
        Ok(Session {
            cookie: Secret::new(t.data.ticket),
            csrf: Secret::new(t.data.csrf),
        })
    }
}

/// Extracts `message` (and per-parameter `errors`) from an error body.
fn api_message(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let mut msg = v.get("message")?.as_str()?.trim().to_string();
    if let Some(errors) = v.get("errors").and_then(|e| e.as_object()) {
        let detail: Vec<String> = errors
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default().trim()))
            .collect();
        if !detail.is_empty() {
            msg = format!("{msg} ({})", detail.join("; "));
        }
    }
    Some(msg)
}
