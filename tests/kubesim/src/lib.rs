//! kubesim: an in-memory Kubernetes API server for tests, serving the
//! resources and verbs the driver's tools use, with the deletion,
//! finalizer and binding rules that decide whether those tools lose data.
//! Each rule is cited beside its code (repository, file, function).
//!
//! Modelled:
//! - core/v1 Nodes, PersistentVolumes, PersistentVolumeClaims and Pods, and
//!   storage.k8s.io/v1 VolumeAttachments and CSINodes (cluster-scoped): get, list,
//!   create, replace, JSON merge patch, `/status`, delete, and watch with
//!   `resourceVersion`; `SelfSubjectAccessReview` (allowed unless the verb
//!   and resource were denied with [`Running::deny`]);
//! - one global `resourceVersion` that grows with every write, and a write
//!   that changes nothing is skipped (no new version, no event); `409
//!   Conflict` when a replace carries a stale one, `409 AlreadyExists`, `404
//!   NotFound` as Kubernetes `Status` objects;
//! - `metadata.finalizers`; the StorageObjectInUseProtection admission adds
//!   `kubernetes.io/pvc-protection` / `kubernetes.io/pv-protection` at create
//!   ([`Running::set_admission`] turns it off);
//! - DELETE: without finalizers the object goes (200 + the object, one
//!   DELETED); with finalizers it gets `deletionTimestamp` and
//!   `deletionGracePeriodSeconds: 0` (200 + the object, MODIFIED), and a
//!   repeated DELETE is 200 with no event; `propagationPolicy` Foreground /
//!   Orphan add `foregroundDeletion` / `orphan`; `preconditions` uid and
//!   resourceVersion answer 409 with the API server's texts;
//! - updates: the old `deletionTimestamp` wins; a new finalizer on a
//!   deleting object is 422; emptying the finalizers of a deleting object
//!   removes it (200 + the request's object, one DELETED); a claim's status
//!   changes only through `/status`;
//! - controllers on a tick ([`TICK`], each one leaving an object alone for
//!   [`Running::set_controller_delay`] after its last write): the garbage
//!   collector's `foregroundDeletion`/`orphan`, pvc-protection,
//!   pv-protection, the external-attacher of [`DRIVER`] (its finalizer
//!   [`ATTACHER_FINALIZER`] on volumes and attachments) and the
//!   external-provisioner's deleter, which records `DeleteVolume(<handle>)`
//!   ([`Running::deleted_volumes`]) and deletes a `Released` volume with
//!   policy `Delete`;
//! - the PersistentVolume binder with `claimRef.uid`: pre-bound volumes get
//!   the uid filled in, a uid that isn't the live claim's releases the
//!   volume, a Released volume whose claimRef names a live claim becomes
//!   Bound, a claim asking for a volume claimed by another stays Pending, a
//!   claim that was bound (`bind-completed`) goes Lost; a volume's phase is
//!   written apart from its claimRef, [`Running::set_binder_delay`] late;
//! - [`attachment_name`], the name Kubernetes gives a VolumeAttachment.
//!
//! Not modelled: authentication, label and field selectors, strategic merge
//! and JSON patch (treated as a merge patch), server-side apply, owner
//! references and dependents (the garbage collector finds none), graceful
//! deletion of pods (pods go at once), pods being scheduled or run,
//! dynamic provisioning and matching claims to unreserved volumes by size
//! and class, the external-provisioner's own finalizer, pvc-protection
//! adding its finalizer to old claims and exempting ephemeral volumes of
//! shut-down pods, status defaults at create (the binder writes the first
//! phase), validation (immutable fields such as a claim's spec; a
//! `deletionTimestamp` set by an update on an object that is not being
//! deleted is dropped, not refused with 422), `generation` beyond the bump
//! at deletion, the deprecated `orphanDependents` (and its 202), and any
//! other resource.

mod binder;
mod controllers;
mod store;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;

use store::{ApiError, Event, Store, api_version, resource, text};

/// The CSI driver whose attacher and provisioner kubesim plays.
pub const DRIVER: &str = "csi.proxmox.sinextra.dev";
/// kubernetes pkg/volume/util/finalizer.go `PVCProtectionFinalizer`.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// kubernetes pkg/volume/util/finalizer.go `PVProtectionFinalizer`.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
/// apimachinery types.go:126 `metav1.FinalizerDeleteDependents`.
pub const FOREGROUND_DELETION: &str = "foregroundDeletion";
/// apimachinery `metav1.FinalizerOrphanDependents`.
pub const ORPHAN: &str = "orphan";
/// The external-attacher's finalizer for [`DRIVER`]: `attacher_finalizer(DRIVER)`.
pub const ATTACHER_FINALIZER: &str = "external-attacher/csi-proxmox-sinextra-dev";
/// How often the controllers run.
pub const TICK: Duration = Duration::from_millis(20);

/// external-attacher util.go:139 `GetFinalizerName`: `external-attacher/` +
/// `SanitizeDriverName` (util.go:128: every char outside `[a-zA-Z0-9-]`
/// becomes `-`, and an `X` is appended if it then ends in `-`).
pub fn attacher_finalizer(driver: &str) -> String {
    let mut s: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.ends_with('-') {
        s.push('X');
    }
    format!("external-attacher/{s}")
}

/// The name of the VolumeAttachment of a volume on a node (kubernetes
/// pkg/volume/csi/csi_attacher.go `getAttachmentName`):
/// `csi-` + hex sha256 of handle, driver and node name, concatenated.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{volume_handle}{driver}{node}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

#[derive(Debug, Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    tx: broadcast::Sender<Event>,
    /// Requests served, watches apart (a watch is one long request).
    requests: Arc<std::sync::atomic::AtomicU64>,
    watches: Arc<std::sync::atomic::AtomicU64>,
    /// Objects answered by gets and lists (what a read costs the server).
    served: Arc<std::sync::atomic::AtomicU64>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
}

fn failure(e: &ApiError) -> Response {
    (e.code, axum::Json(e.body())).into_response()
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// A running kubesim.
#[derive(Debug, Clone)]
pub struct Running {
    pub url: String,
    shared: Shared,
}

impl Running {
    /// Stores `obj` (its `kind` and metadata name, and namespace when
    /// namespaced) as it is, replacing what is there; a new object passes the
    /// admission first, as a create would.
    pub fn put(&self, plural: &str, obj: Value) {
        self.put_all(plural, [obj]);
    }

    /// [`put`](Self::put) for many objects, with one pass of the binder at
    /// the end (a cluster of thousands of volumes is set up in one step).
    pub fn put_all(&self, plural: &str, objs: impl IntoIterator<Item = Value>) {
        let mut s = self.shared.lock();
        for mut obj in objs {
            let ns = text(&obj["metadata"]["namespace"]).to_string();
            let name = text(&obj["metadata"]["name"]).to_string();
            let key = (plural.to_string(), ns, name);
            s.uid += 1;
            if obj["metadata"]["uid"].is_null() {
                obj["metadata"]["uid"] = json!(format!("uid-{}", s.uid));
            }
            obj["kind"] = json!(resource(plural).0);
            obj["apiVersion"] = json!(api_version(plural));
            let event = if s.objects.contains_key(&key) {
                "MODIFIED"
            } else {
                s.admit(plural, &mut obj);
                "ADDED"
            };
            s.write(&self.shared.tx, key, Some(obj), event);
        }
        s.bind_all(&self.shared.tx, Instant::now());
    }

    /// Requests served so far, not counting watches: what a client's reads
    /// and writes cost the API server.
    pub fn requests(&self) -> u64 {
        self.shared
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Objects answered by gets and lists so far.
    pub fn objects_served(&self) -> u64 {
        self.shared
            .served
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Watch requests served so far (each one stream).
    pub fn watches(&self) -> u64 {
        self.shared
            .watches
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&(plural.to_string(), namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Makes SelfSubjectAccessReviews for `verb` on `resource` answer no.
    pub fn deny(&self, verb: &str, resource: &str) {
        self.shared
            .lock()
            .denied
            .insert((verb.to_string(), resource.to_string()));
    }

    /// Turns the StorageObjectInUseProtection admission on (the default) or off.
    pub fn set_admission(&self, on: bool) {
        self.shared.lock().admission = on;
    }

    /// Makes the binder write a volume's phase `delay` after it decides to
    /// (zero, the default: at once). ClaimRef writes are not delayed.
    pub fn set_binder_delay(&self, delay: Duration) {
        self.shared.lock().binder_delay = delay;
    }

    /// Makes the tick controllers (garbage collector, protection, attacher,
    /// provisioner) leave an object alone until `delay` after its last write.
    pub fn set_controller_delay(&self, delay: Duration) {
        self.shared.lock().controller_delay = delay;
    }

    /// What the provisioner actor deleted in the storage backend, in order:
    /// `DeleteVolume(<csi.volumeHandle>)`.
    pub fn deleted_volumes(&self) -> Vec<String> {
        self.shared.lock().deleted_volumes.clone()
    }

    /// The watch events of `plural` so far: (type, object), oldest first.
    pub fn events(&self, plural: &str) -> Vec<(String, Value)> {
        self.shared
            .lock()
            .events
            .iter()
            .filter(|e| e.1 == plural)
            .map(|e| (e.2.to_string(), e.3.clone()))
            .collect()
    }
}

/// Starts kubesim on 127.0.0.1 (a free port), with its controllers ticking.
pub async fn start() -> std::io::Result<Running> {
    let (tx, _) = broadcast::channel(4096);
    let shared = Shared {
        store: Arc::new(Mutex::new(Store::default())),
        tx,
        requests: Arc::default(),
        watches: Arc::default(),
        served: Arc::default(),
    };
    let app = Router::new().fallback(handle).with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let ticking = shared.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            ticking.lock().tick(&ticking.tx, Instant::now());
        }
    });
    Ok(Running { url, shared })
}

/// A request path: plural, namespace, name and subresource.
#[derive(Debug)]
struct Route {
    plural: String,
    ns: String,
    name: Option<String>,
    sub: Option<String>,
}

/// The route of a request path, for the paths served.
fn route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segs.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    let r = |plural: &str, ns: &str, name: Option<&str>, sub: Option<&str>| Route {
        plural: plural.to_string(),
        ns: ns.to_string(),
        name: name.map(String::from),
        sub: sub.map(String::from),
    };
    match rest {
        ["namespaces", ns, plural] => Some(r(plural, ns, None, None)),
        ["namespaces", ns, plural, name] => Some(r(plural, ns, Some(name), None)),
        ["namespaces", ns, plural, name, sub] => Some(r(plural, ns, Some(name), Some(sub))),
        [plural] => Some(r(plural, "", None, None)),
        [plural, name] => Some(r(plural, "", Some(name), None)),
        [plural, name, sub] => Some(r(plural, "", Some(name), Some(sub))),
        _ => None,
    }
}

/// DeleteOptions from the body, with `propagationPolicy` also read from the query.
fn delete_options(body: &Value, q: &BTreeMap<String, String>) -> Value {
    let mut opts = if body.is_object() {
        body.clone()
    } else {
        json!({})
    };
    if opts["propagationPolicy"].is_null()
        && let Some(p) = q.get("propagationPolicy")
    {
        opts["propagationPolicy"] = json!(p);
    }
    opts
}

async fn handle(
    State(sh): State<Shared>,
    method: Method,
    uri: Uri,
    Query(q): Query<BTreeMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    let Some(Route {
        plural,
        ns,
        name,
        sub,
    }) = route(uri.path())
    else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource ({})",
                uri.path()
            ),
        );
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if plural == "selfsubjectaccessreviews" {
        let attrs = &body["spec"]["resourceAttributes"];
        let key = (
            text(&attrs["verb"]).to_string(),
            text(&attrs["resource"]).to_string(),
        );
        let allowed = !sh.lock().denied.contains(&key);
        let mut out = body.clone();
        out["status"] = json!({"allowed": allowed});
        return (StatusCode::CREATED, axum::Json(out)).into_response();
    }
    if sub.as_deref().is_some_and(|s| s != "status") {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource ({})",
                uri.path()
            ),
        );
    }
    let (kind, _) = resource(&plural);
    let watch = method == Method::GET
        && name.is_none()
        && q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let counter = if watch { &sh.watches } else { &sh.requests };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut s = sh.lock();
    let now = Instant::now();
    match (method, name) {
        (Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            let since: u64 = q
                .get("resourceVersion")
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let timeout = Duration::from_secs(
                q.get("timeoutSeconds")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(5),
            );
            let past: Vec<Value> = s
                .events
                .iter()
                .filter(|(rv, p, _, o)| {
                    *rv > since
                        && *p == plural
                        && (ns.is_empty() || o["metadata"]["namespace"] == json!(ns))
                })
                .map(|(_, _, t, o)| json!({"type": t, "object": o}))
                .collect();
            let rx = sh.tx.subscribe();
            drop(s);
            let (plural2, ns2) = (plural.clone(), ns.clone());
            let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |e| {
                let keep = e.ok().filter(|(rv, p, _, o)| {
                    *rv > since
                        && *p == plural2
                        && (ns2.is_empty() || o["metadata"]["namespace"] == json!(ns2))
                });
                async move { keep.map(|(_, _, t, o)| json!({"type": t, "object": o})) }
            });
            let stream = futures::stream::iter(past)
                .chain(live)
                .map(|v| Ok::<_, std::io::Error>(format!("{v}\n")));
            let stream = tokio_stream::StreamExt::timeout(stream, timeout)
                .take_while(|r| futures::future::ready(r.is_ok()))
                .filter_map(|r| async move { r.ok() });
            Response::builder()
                .header("content-type", "application/json")
                .body(Body::from_stream(stream))
                .unwrap_or_default()
        }
        (Method::GET, None) => {
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|(k, _)| k.0 == plural && (ns.is_empty() || k.1 == ns))
                .map(|(_, v)| v.clone())
                .collect();
            sh.served
                .fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
            axum::Json(json!({"kind": format!("{kind}List"), "apiVersion": api_version(&plural), "metadata": {"resourceVersion": s.rv.to_string()}, "items": items})).into_response()
        }
        (Method::GET, Some(n)) => match s.objects.get(&(plural.clone(), ns.clone(), n.clone())) {
            Some(o) => {
                sh.served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                axum::Json(o.clone()).into_response()
            }
            None => failure(&ApiError::not_found(&plural, &n)),
        },
        (Method::POST, None) => match s.create(&sh.tx, &plural, &ns, body) {
            Ok(created) => {
                s.bind_all(&sh.tx, now);
                (StatusCode::CREATED, axum::Json(created)).into_response()
            }
            Err(e) => failure(&e),
        },
        (m @ (Method::PUT | Method::PATCH), Some(n)) => {
            let key = (plural.clone(), ns.clone(), n.clone());
            let Some(current) = s.objects.get(&key).cloned() else {
                return failure(&ApiError::not_found(&plural, &n));
            };
            let next = if m == Method::PUT {
                // A replace: the stored version must be the one read.
                if body["metadata"]["resourceVersion"].is_string()
                    && body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]
                {
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {plural} \"{n}\": the object has been modified; please apply your changes to the latest version and try again"
                        ),
                    );
                }
                body
            } else {
                let mut t = current;
                merge(&mut t, &body);
                t
            };
            match s.update(&sh.tx, &key, next, sub.is_some()) {
                Ok(out) => {
                    s.bind_all(&sh.tx, now);
                    axum::Json(out).into_response()
                }
                Err(e) => failure(&e),
            }
        }
        (Method::DELETE, Some(n)) if sub.is_none() => {
            let key = (plural.clone(), ns.clone(), n.clone());
            match s.delete(&sh.tx, &key, &delete_options(&body, &q)) {
                Ok(out) => {
                    s.bind_all(&sh.tx, now);
                    axum::Json(out).into_response()
                }
                Err(e) => failure(&e),
            }
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{} is not served here", uri.path()),
        ),
    }
}
