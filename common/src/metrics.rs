//! Prometheus metrics: one registry per process, served on `/metrics` when a
//! `--metrics-address` is given.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: String,
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub method: String,
    pub code: String,
}

/// The process's metrics. Cheap to clone; components register their own
/// families into [`Metrics::registry_mut`] before serving.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    rpc_total: Family<RpcLabels, Counter>,
    rpc_seconds: Family<RpcLabels, Histogram>,
}

impl Metrics {
    pub fn new(component: &str, version: &str) -> Self {
        let mut registry = Registry::with_prefix("proxmox_csi");
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                component: component.to_string(),
                version: version.to_string(),
            })
            .set(1);
        registry.register("build_info", "Build of the running binary", build);
        let start_time = Gauge::<i64>::default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        start_time.set(i64::try_from(now).unwrap_or_default());
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch",
            start_time,
        );
        let rpc_total = Family::<RpcLabels, Counter>::default();
        registry.register(
            "grpc_requests",
            "gRPC requests served, by method and status code",
            rpc_total.clone(),
        );
        let rpc_seconds = Family::<RpcLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        registry.register(
            "grpc_request_duration_seconds",
            "gRPC request latency, by method and status code",
            rpc_seconds.clone(),
        );
        Self {
            registry,
            rpc_total,
            rpc_seconds,
        }
    }

    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Records one served RPC. `method` is the gRPC method name, e.g. `Probe`.
    pub fn observe_rpc(&self, method: &str, code: tonic::Code, started: Instant) {
        let labels = RpcLabels {
            method: method.to_string(),
            code: format!("{code:?}"),
        };
        self.rpc_total.get_or_create(&labels).inc();
        self.rpc_seconds
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// A tower layer that counts and times every gRPC call by method and status.
#[derive(Debug, Clone)]
pub struct GrpcMetricsLayer(pub std::sync::Arc<Metrics>);

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: std::sync::Arc<Metrics>,
}

impl<S, B, R> tower::Service<http::Request<B>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            // Unary errors are "trailers-only": the status is in the headers.
            // A success carries it in the trailers, which is always OK here.
            let code = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map(tonic::Code::from_i32)
                .unwrap_or(tonic::Code::Ok);
            // A path no service answers to names no method: one label for
            // all of them, so a caller cannot grow the label set.
            let method = if code == tonic::Code::Unimplemented {
                "unknown"
            } else {
                method.as_str()
            };
            metrics.observe_rpc(method, code, started);
            Ok(resp)
        })
    }
}

/// Lets the layer wrap one service inside another (hostd counts only the
/// calls its peer check let through).
impl<S: tonic::server::NamedService> tonic::server::NamedService for GrpcMetricsService<S> {
    const NAME: &'static str = S::NAME;
}

/// Serves `/metrics` on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(listener, metrics, shutdown).await
}

/// Like [`serve`], on a listener the caller bound (tests bind port 0).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    StatusCode::OK,
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.render(),
                )
                    .into_response()
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn paths_nobody_serves_share_one_label() {
        use tower::{Layer, Service};
        let metrics = std::sync::Arc::new(Metrics::new("t", "0"));
        let inner = tower::service_fn(|req: http::Request<()>| async move {
            let status = if req.uri().path().ends_with("/Probe") {
                "0"
            } else {
                "12"
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .header("grpc-status", status)
                    .body(())
                    .unwrap(),
            )
        });
        let mut svc = GrpcMetricsLayer(metrics.clone()).layer(inner);
        for path in ["/csi.v1.Identity/Probe", "/x/AaaaRandom1", "/y/BbbbRandom2"] {
            svc.call(http::Request::builder().uri(path).body(()).unwrap())
                .await
                .unwrap();
        }
        let text = metrics.render();
        assert!(text.contains("method=\"Probe\""), "{text}");
        assert!(text.contains("method=\"unknown\""), "{text}");
        assert!(!text.contains("Random"), "{text}");
    }
}
