//! HTTP access to one Proxmox VE cluster: authentication, the `{"data": …}`
//! envelope, Proxmox's error reporting (message in the reason phrase), and
//! retries of what is worth retrying (lock timeouts, locked VMs, 5xx,
//! dropped connections) within the caller's deadline.

use std::time::{Duration, Instant};

use proxmox_csi_common::Secret;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use super::errors::{ErrorKind, Origin, classify, task_type};
use super::metrics::{ApiMetrics, Retry};
use crate::config::{Cluster, Credentials};

/// How a write's answer was lost.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    /// The connection failed after the request went out.
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
    /// A proxy on the way answered in place of Proxmox after it passed the
    /// request on: pveproxy's 596 (AnyEvent::HTTP's status for an error
    /// while sending the request or awaiting its header, its 30 s timeout
    /// included; 597 while reading the body; pve-http-server
    /// src/PVE/APIServer/AnyEvent.pm proxy_request), or a gateway's
    /// 502/503/504 in front of it.
    #[error("HTTP {status}: {reason}")]
    Status { status: u16, reason: String },
}

/// Proxy statuses after which a write may have been applied. 595 is not
/// one: AnyEvent::HTTP answers it when the connection to the daemon could
/// not be made, before anything was sent.
pub const MAYBE_APPLIED: &[u16] = &[502, 503, 504, 596, 597];

#[derive(Debug, thiserror::Error)]
pub enum PveError {
    #[error("Proxmox cluster {region}: TLS: {source}")]
    Tls {
        region: String,
        #[source]
        source: super::tls::TlsError,
    },
    #[error("Proxmox cluster {region}: credentials: {reason}")]
    Credentials { region: String, reason: String },
    #[error("Proxmox cluster {region}: {method} {path}: {source}")]
    Transport {
        region: String,
        method: Method,
        path: String,
        source: reqwest::Error,
    },
    #[error("Proxmox cluster {region}: {method} {path}: {message}")]
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
    #[error("Proxmox cluster {region}: task {upid} failed: {exitstatus}")]
    Task {
        region: String,
        upid: String,
        exitstatus: String,
    },
    /// A write was sent and no answer came back: Proxmox may have done it.
    /// Not repeated blindly (a second allocation, a second VM); the next
    /// call of the operation finds out what happened and goes on from there.
    #[error(
        "Proxmox cluster {region}: {method} {path}: the answer was lost ({source}); whether Proxmox did it is not known, the next call finds out"
    )]
    AnswerLost {
        region: String,
        method: Method,
        path: String,
        source: Lost,
    },
    /// Something could not be learnt because part of the cluster did not
    /// answer (a node down): worth asking again later.
    #[error("Proxmox cluster {region}: {what}")]
    Unknown { region: String, what: String },
    #[error("Proxmox cluster {region}: {what}: gave up at the deadline; last error: {last}")]
    Deadline {
        region: String,
        what: String,
        last: String,
    },
}

impl PveError {
    /// The Proxmox message, for matching known texts.
    pub fn message(&self) -> String {
        match self {
            Self::Api { message, .. } => message.clone(),
            Self::Task { exitstatus, .. } => exitstatus.clone(),
            other => other.to_string(),
        }
    }

    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// What the error means (see `errors`): the HTTP status first, then
    /// the text against the cited corpus.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Transport { .. }
            | Self::AnswerLost { .. }
            | Self::Deadline { .. }
            | Self::Unknown { .. } => ErrorKind::Transient,
            Self::Api {
                method,
                path,
                status,
                message,
                ..
            } => classify(
                Some(status.as_u16()),
                message,
                Origin::Call {
                    method: method.as_str(),
                    endpoint: &super::metrics::template(path),
                },
            ),
            Self::Task {
                upid, exitstatus, ..
            } => classify(None, exitstatus, Origin::Task(task_type(upid))),
            Self::Tls { .. } | Self::Credentials { .. } | Self::Decode { .. } => ErrorKind::Other,
        }
    }

    /// Worth trying again: a lock, quorum, an unreachable node. Most 500s
    /// are permanent answers ("storage 'x' does not exist", "illegal name").
    pub fn is_transient(&self) -> bool {
        matches!(self.kind(), ErrorKind::Busy | ErrorKind::Transient)
    }

    /// Proxmox said the object is not there.
    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }
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
    issued: Instant,
}

/// A login ticket is renewed this long after it was issued: Proxmox
/// accepts one for 2 hours (pve-access-control AccessControl.pm
/// `$ticket_lifetime`), so no call meets an expired one.
const SESSION_RENEWAL: Duration = Duration::from_secs(3600);

/// A client for one cluster (region).
#[derive(Debug)]
pub struct Client {
    cluster: Cluster,
    http: reqwest::Client,
    session: Mutex<Option<Session>>,
    /// See `SESSION_RENEWAL`.
    session_renewal: Duration,
    metrics: ApiMetrics,
}

/// How long a call may keep retrying.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Instant);

impl Deadline {
    pub fn after(d: Duration) -> Self {
        Self(Instant::now() + d)
    }

    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    pub fn passed(&self) -> bool {
        self.remaining().is_zero()
    }

    /// This deadline, or `max` from now if that comes first.
    pub fn capped(&self, max: Duration) -> Self {
        Self(self.0.min(Instant::now() + max))
    }
}

/// Jittered exponential backoff: 50 ms doubling to 2 s.
pub fn backoff(attempt: u32) -> Duration {
    let base = 50u64.saturating_mul(1 << attempt.min(6)).min(2000);
    let jitter = rand::random::<u64>() % (base / 2 + 1);
    Duration::from_millis(base / 2 + jitter)
}

impl Client {
    pub fn new(cluster: Cluster, timeout: Duration, metrics: ApiMetrics) -> Result<Self, PveError> {
        let tls = super::tls::client_config(&cluster).map_err(|source| PveError::Tls {
            region: cluster.region.clone(),
            source,
        })?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| PveError::Tls {
                region: cluster.region.clone(),
                source: super::tls::TlsError::Client(e),
            })?;
        Ok(Self {
            cluster,
            http,
            session: Mutex::new(None),
            session_renewal: SESSION_RENEWAL,
            metrics,
        })
    }

    /// A client that renews its login ticket after `every` (tests, against
    /// a simulator whose tickets live a few seconds).
    pub fn with_session_renewal(mut self, every: Duration) -> Self {
        self.session_renewal = every;
        self
    }

    pub fn region(&self) -> &str {
        &self.cluster.region
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub async fn version(&self) -> Result<Version, PveError> {
        self.once(Method::GET, "/version", &[]).await
    }

    /// A call retried while its error is transient and the deadline allows.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        form: &[(&str, String)],
        deadline: Deadline,
    ) -> Result<T, PveError> {
        let mut attempt = 0;
        // Proxmox refuses a write whose digest is stale, so such a write is
        // safe to send again; reads always are.
        let repeatable = method == Method::GET || form.iter().any(|(k, _)| *k == "digest");
        // A repeated write whose first answer was lost and whose digest is
        // now stale may have been applied by that first attempt.
        let mut lost: Option<Lost> = None;
        loop {
            match self.once(method.clone(), path, form).await {
                Ok(v) => return Ok(v),
                Err(e) if e.kind() == ErrorKind::DigestMismatch => {
                    return Err(match lost {
                        Some(source) => PveError::AnswerLost {
                            region: self.cluster.region.clone(),
                            method,
                            path: path.to_string(),
                            source,
                        },
                        None => e,
                    });
                }
                Err(PveError::Transport {
                    region,
                    method,
                    path,
                    source,
                }) if !repeatable && !source.is_connect() => {
                    return Err(PveError::AnswerLost {
                        region,
                        method,
                        path,
                        source: Lost::Transport(source),
                    });
                }
                // A proxy's answer for a write it passed on: the write may
                // have happened, and a second one would make a second VM or
                // disk. The operation's next call looks for its own work.
                Err(PveError::Api {
                    region,
                    method,
                    path,
                    status,
                    message,
                }) if method != Method::GET && MAYBE_APPLIED.contains(&status.as_u16()) => {
                    let source = Lost::Status {
                        status: status.as_u16(),
                        reason: message,
                    };
                    let wait = backoff(attempt);
                    if repeatable && deadline.remaining() > wait {
                        // Sent again with its digest: Proxmox refuses it if
                        // the first one changed the config.
                        lost = Some(source);
                        self.metrics.retried(
                            &self.cluster.region,
                            &method,
                            &path,
                            Retry::Transient,
                        );
                        tokio::time::sleep(wait).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(PveError::AnswerLost {
                        region,
                        method,
                        path,
                        source,
                    });
                }
                Err(PveError::Transport { source, .. }) if method != Method::GET => {
                    let wait = backoff(attempt);
                    if deadline.remaining() <= wait {
                        return Err(PveError::AnswerLost {
                            region: self.cluster.region.clone(),
                            method,
                            path: path.to_string(),
                            source: Lost::Transport(source),
                        });
                    }
                    if !source.is_connect() {
                        lost = Some(Lost::Transport(source));
                    }
                    self.metrics
                        .retried(&self.cluster.region, &method, path, Retry::Transport);
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(e) if e.is_transient() => {
                    let wait = backoff(attempt);
                    if deadline.remaining() <= wait {
                        return Err(PveError::Deadline {
                            region: self.cluster.region.clone(),
                            what: format!("{method} {path}"),
                            last: e.message(),
                        });
                    }
                    tracing::debug!(%method, path, attempt, error = %e, "transient Proxmox error, retrying");
                    self.metrics
                        .retried(&self.cluster.region, &method, path, Retry::Transient);
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One API call. `form` goes in the body for POST/PUT and in the query
    /// string otherwise, as the Proxmox API expects.
    pub async fn once<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        form: &[(&str, String)],
    ) -> Result<T, PveError> {
        let started = Instant::now();
        let result = self.send(method.clone(), path, form).await;
        let code = match &result {
            Ok(_) => "200".to_string(),
            Err(PveError::Api { status, .. }) => status.as_u16().to_string(),
            Err(_) => "error".to_string(),
        };
        self.metrics
            .observe(&self.cluster.region, &method, path, &code, started);
        result
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        form: &[(&str, String)],
    ) -> Result<T, PveError> {
        let url = format!(
            "{}{}",
            self.cluster.url.as_str().trim_end_matches('/'),
            path
        );
        let mut req = self.http.request(method.clone(), &url);
        req = if matches!(method, Method::POST | Method::PUT) {
            req.form(form)
        } else {
            req.query(form)
        };
        req = self.authorize(req, &method).await?;
        let transport = |source| PveError::Transport {
            region: self.cluster.region.clone(),
            method: method.clone(),
            path: path.to_string(),
            source,
        };
        let resp = req.send().await.map_err(transport)?;
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
            let message = api_message(&body, &reason);
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
        let bytes = resp.bytes().await.map_err(transport)?;
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
                sensitive(
                    &self.cluster.region,
                    &format!("PVEAPIToken={id}={}", secret.expose()),
                )?,
            )),
            Credentials::Password { username, password } => {
                let mut session = self.session.lock().await;
                if session
                    .as_ref()
                    .is_some_and(|s| s.issued.elapsed() >= self.session_renewal)
                {
                    tracing::debug!(region = self.cluster.region, "renewing the login ticket");
                    *session = None;
                }
                let s = match &mut *session {
                    Some(s) => &*s,
                    slot @ None => &*slot.insert(self.login(username, password).await?),
                };
                let mut req = req.header(
                    reqwest::header::COOKIE,
                    sensitive(
                        &self.cluster.region,
                        &format!("PVEAuthCookie={}", s.cookie.expose()),
                    )?,
                );
                if *method != Method::GET {
                    req = req.header(
                        "CSRFPreventionToken",
                        sensitive(&self.cluster.region, s.csrf.expose())?,
                    );
                }
                Ok(req)
            }
        }
    }

    async fn login(&self, username: &str, password: &Secret<String>) -> Result<Session, PveError> {
        let path = "/access/ticket";
        let url = format!("{}{path}", self.cluster.url.as_str().trim_end_matches('/'));
        let form = [
            ("username", username),
            ("password", password.expose().as_str()),
        ];
        let transport = |source| PveError::Transport {
            region: self.cluster.region.clone(),
            method: Method::POST,
            path: path.to_string(),
            source,
        };
        let resp = self
            .http
            .post(url)
            .form(&form)
            .send()
            .await
            .map_err(transport)?;
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
            issued: Instant::now(),
        })
    }
}

/// The error text: the body's `message` with per-parameter `errors`, or the
/// reason phrase.
fn api_message(body: &str, reason: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return reason.to_string();
    };
    let mut msg = v
        .get("message")
        .and_then(|m| m.as_str())
        .map(|m| m.trim().to_string())
        .unwrap_or_else(|| reason.to_string());
    if let Some(errors) = v.get("errors").and_then(|e| e.as_object()) {
        let detail: Vec<String> = errors
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default().trim()))
            .collect();
        if !detail.is_empty() {
            msg = format!("{msg} ({})", detail.join("; "));
        }
    }
    msg
}

/// A credential header, marked sensitive: hyper and reqwest leave it out of
/// their debug output and HTTP/2 never indexes it.
fn sensitive(region: &str, value: &str) -> Result<reqwest::header::HeaderValue, PveError> {
    let mut v =
        reqwest::header::HeaderValue::from_str(value).map_err(|_| PveError::Credentials {
            region: region.to_string(),
            reason: "they hold characters an HTTP header cannot carry".into(),
        })?;
    v.set_sensitive(true);
    Ok(v)
}

#[cfg(test)]
mod sensitive_tests {
    #[test]
    fn credential_headers_are_sensitive() {
        assert!(
            super::sensitive("r", "PVEAPIToken=u@pve!t=s")
                .unwrap()
                .is_sensitive()
        );
        assert!(super::sensitive("r", "bad\nvalue").is_err());
    }
}
