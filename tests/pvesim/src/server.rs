//! The HTTP(S) front: HTTP/1.1 only, like pveproxy; every request goes
//! through one dispatcher that authenticates and routes it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State as AxState;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, Params};
use crate::auth::Tickets;
use crate::reply::{self, ApiError};
use crate::state::State;

/// Shared by every request.
#[derive(Debug)]
pub struct Ctx {
    pub state: Mutex<State>,
    pub tickets: Mutex<Tickets>,
}

/// A simulator, configured and not yet listening.
#[derive(Debug)]
pub struct Sim {
    state: State,
    tls: bool,
}

/// A listening simulator. Dropping it stops it.
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
        let scheme = if self.ca_pem.is_some() { "https" } else { "http" };
        format!("{scheme}://{}/api2/json", self.addr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Sim {
    pub fn new(state: State) -> Self {
        Self { state, tls: true }
    }

    /// Serve plain HTTP instead of HTTPS.
    pub fn plain_http(mut self) -> Self {
        self.tls = false;
        self
    }

    pub async fn start(self, listen: &str) -> anyhow::Result<Running> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let certs = if self.tls {
            Some(crate::tls::generate(&["localhost", "127.0.0.1", &addr.ip().to_string()])?)
        } else {
            None
        };
        let ctx = Arc::new(Ctx {
            state: Mutex::new(self.state),
            tickets: Mutex::new(Tickets::default()),
        });
        let app = Router::new().fallback(dispatch).with_state(ctx.clone());
        let (stop, stop_rx) = watch::channel(false);
        let acceptor = certs
            .as_ref()
            .map(|c| tokio_rustls::TlsAcceptor::from(c.server.clone()));
        tokio::spawn(accept_loop(listener, app, acceptor, stop_rx));
        Ok(Running {
            addr,
            ca_pem: certs.map(|c| c.ca_pem),
            ctx,
            stop,
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    app: Router,
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
        let app = app.clone();
        let acceptor = acceptor.clone();
        let mut conn_stop = stop.clone();
        // A stopped simulator drops its open connections too, like a dead host.
        let conn = async move {
            let service = TowerToHyperService::new(app);
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

async fn dispatch(
    AxState(ctx): AxState<Arc<Ctx>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match handle(&ctx, &method, &uri, &headers, &body) {
        Ok(data) => reply::ok(data),
        Err(e) => {
            tracing::debug!(%method, path = uri.path(), status = %e.status, message = %e.message, "request failed");
            reply::error(&e)
        }
    }
}

fn handle(
    ctx: &Ctx,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<serde_json::Value, ApiError> {
    let path = percent_decode(uri.path());
    let Some(rest) = path.strip_prefix("/api2/") else {
        return Err(ApiError::not_implemented("no such uri"));
    };
    let (format, api_path) = rest.split_once('/').unwrap_or((rest, ""));
    if format != "json" {
        if api_path.is_empty() && !format.is_empty() {
            return Err(ApiError::not_implemented("no such uri"));
        }
        return Err(ApiError::not_implemented(format!(
            "no formatter for uri /{api_path}, {format}"
        )));
    }
    let params = Params::from_request(method, uri.query(), headers, body)?;
    api::route(ctx, method, &format!("/{api_path}"), headers, params)
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("p={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_string())
}
