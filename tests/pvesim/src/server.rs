//! The HTTP(S) front: HTTP/1.1 only, like pveproxy. Every request goes
//! through one dispatcher that applies the fault knobs, authenticates,
//! validates against the schema, checks privileges and routes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api;
use crate::auth::Tickets;
use crate::ctx::Ctx;
use crate::locks::Locks;
use crate::reply;
use crate::schema::Schema;
use crate::state::{Cluster, State};

/// A simulator, configured and not yet listening. It always validates
/// requests against Proxmox's schema (`schema::default_path` unless another
/// is given): the privilege checks and texts the driver relies on come from it.
#[derive(Debug)]
pub struct Sim {
    state: State,
    tls: bool,
    schema: Option<Schema>,
    volume_dir: Option<std::path::PathBuf>,
    loop_host: Option<(u32, std::path::PathBuf)>,
}

/// A listening simulator. Dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct Running {
    pub addr: SocketAddr,
    /// The CA to trust, when serving HTTPS.
    pub ca_pem: Option<String>,
    pub ctx: Arc<Ctx>,
    stop: watch::Sender<bool>,
}

impl Running {
    /// `https://127.0.0.1:PORT/api2/json` (or `http://…`).
    pub fn api_url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}/api2/json", self.addr)
    }
}

impl Running {
    /// The faults taken so far.
    pub fn faults(&self) -> crate::knobs::Faults {
        self.ctx.cluster().faults.clone()
    }

    /// Sets knobs from a JSON object, as `POST /pvesim/knobs` does.
    pub fn set_knobs(&self, json: &str) -> anyhow::Result<()> {
        let patch: serde_json::Value = serde_json::from_str(json)?;
        self.ctx
            .cluster()
            .knobs
            .merge(&patch)
            .map_err(|e| anyhow::anyhow!("pvesim knobs {json}: {e}"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Sim {
    pub fn new(state: State) -> Self {
        Self {
            state,
            tls: true,
            schema: None,
            volume_dir: None,
            loop_host: None,
        }
    }

    /// Serve plain HTTP instead of HTTPS.
    pub fn plain_http(mut self) -> Self {
        self.tls = false;
        self
    }

    /// Validate requests against Proxmox's API schema.
    pub fn with_schema(mut self, schema: Schema) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Directory for the files backing volumes of QMP-bound VMs.
    pub fn volume_dir(mut self, dir: std::path::PathBuf) -> Self {
        self.volume_dir = Some(dir);
        self
    }

    /// VM `vmid`'s disks are "hot-plugged" into this host as loop devices
    /// backed by `<dir>/<wwn>.raw` (a hard link to the volume's backing
    /// file under `volume_dir`), which hostd's test resolver finds through
    /// the kernel's device events as it finds a SCSI disk by WWN.
    pub fn loop_host(mut self, vmid: u32, dir: std::path::PathBuf) -> Self {
        self.loop_host = Some((vmid, dir));
        self
    }

    pub async fn start(self, listen: &str) -> anyhow::Result<Running> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let certs = if self.tls {
            Some(crate::tls::generate(&[
                "localhost",
                "127.0.0.1",
                &addr.ip().to_string(),
            ])?)
        } else {
            None
        };
        let schema = match self.schema {
            Some(s) => s,
            None => Schema::load(&crate::schema::default_path())?,
        };
        let ctx = Arc::new(Ctx {
            cluster: Mutex::new(Cluster::from_state(self.state)?),
            tickets: Mutex::new(Tickets::default()),
            schema,
            locks: Arc::new(Locks::default()),
            volume_dir: self.volume_dir,
            loop_host: self.loop_host,
            daemon: std::sync::Mutex::new(None),
        });
        let (stop, stop_rx) = watch::channel(false);
        let acceptor = certs
            .as_ref()
            .map(|c| tokio_rustls::TlsAcceptor::from(c.server.clone()));
        tokio::spawn(accept_loop(listener, ctx.clone(), acceptor, stop_rx));
        Ok(Running {
            addr,
            ca_pem: certs.map(|c| c.ca_pem),
            ctx,
            stop,
        })
    }
}

/// Returned by the service to make hyper drop the connection unanswered.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by fault injection")
    }
}

impl std::error::Error for Dropped {}

async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        let ctx = ctx.clone();
        let acceptor = acceptor.clone();
        let mut conn_stop = stop.clone();
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let ctx = ctx.clone();
            async move { handle(ctx, req).await }
        });
        // A stopped simulator drops its open connections too, like a dead host.
        let conn = async move {
            let http = hyper::server::conn::http1::Builder::new();
            let result = match acceptor {
                Some(a) => match a.accept(stream).await {
                    Ok(tls) => http.serve_connection(TokioIo::new(tls), service).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => http.serve_connection(TokioIo::new(stream), service).await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                _ = conn_stop.wait_for(|s| *s) => {}
            }
        });
    }
}

async fn handle(
    ctx: Arc<Ctx>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Dropped> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(Dropped),
    };
    // Fault knobs apply to the Proxmox API, not to the admin API.
    if !parts.uri.path().starts_with("/pvesim/") {
        let (latency, drop, fail) = {
            let mut c = ctx.cluster();
            let drop = crate::knobs::take(&mut c.knobs.drop_connections);
            let rate = c.knobs.error_5xx_rate;
            let fail = !drop
                && (crate::knobs::take(&mut c.knobs.fail_5xx)
                    || (rate > 0.0 && rand::random::<f64>() < rate));
            (c.knobs.api_latency_ms, drop, fail)
        };
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if drop {
            ctx.cluster().faults.dropped_connections += 1;
            return Err(Dropped);
        }
        if fail {
            ctx.cluster().faults.errors_5xx += 1;
            // What a client sees when pveproxy cannot reach the daemon behind
            // it (pvedaemon restarting, a node going away): AnyEvent::HTTP's
            // pseudo status 595 with the errno text as the reason and an
            // empty body, passed through unchanged (pve-http-server
            // src/PVE/APIServer/AnyEvent.pm proxy_request; AnyEvent::HTTP
            // `Status => 595, Reason => "$!"`).
            return Ok(reply::proxy_failure(595, "Connection refused"));
        }
    }
    let write =
        parts.method != axum::http::Method::GET && !parts.uri.path().starts_with("/pvesim/");
    let result = match ctx.daemon().filter(|_| write) {
        None => api::dispatch(&ctx, &parts.method, &parts.uri, &parts.headers, &body).await,
        Some(workers) => {
            // A write waits for one of pvedaemon's workers; pveproxy gives up
            // waiting for the answer after its timeout and answers 596, while
            // the write stays queued and is carried out later.
            let (c2, p2, b2) = (ctx.clone(), parts.clone(), body.clone());
            let work = tokio::spawn(async move {
                let _worker = workers.acquire_owned().await;
                api::dispatch(&c2, &p2.method, &p2.uri, &p2.headers, &b2).await
            });
            let timeout = Duration::from_millis(ctx.cluster().knobs.proxy_timeout_ms);
            match tokio::time::timeout(timeout, work).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => return Err(Dropped),
                Err(_) => {
                    ctx.cluster().faults.proxy_timeouts += 1;
                    return Ok(reply::proxy_failure(596, "Connection timed out"));
                }
            }
        }
    };
    if result.is_ok()
        && parts.method != axum::http::Method::GET
        && !parts.uri.path().starts_with("/pvesim/")
    {
        let mut c = ctx.cluster();
        if c.knobs.lose_answers > 0 && !crate::knobs::take(&mut c.knobs.lose_answers_skip) {
            c.knobs.lose_answers -= 1;
            c.faults.lost_answers += 1;
            return match c.knobs.lost_answer_status {
                0 => Err(Dropped),
                status => Ok(reply::proxy_failure(status, "Connection timed out")),
            };
        }
    }
    Ok(match result {
        Ok(data) => reply::ok(data),
        Err(e) => {
            tracing::debug!(method = %parts.method, path = parts.uri.path(), status = %e.status, message = %e.message, "request failed");
            reply::error(&e)
        }
    })
}
