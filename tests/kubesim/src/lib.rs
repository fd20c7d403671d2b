//! kubesim: an in-memory Kubernetes API server for tests, serving the
//! resources and verbs the driver's tools use.
//!
//! Modelled: core/v1 Nodes, PersistentVolumes, PersistentVolumeClaims and
//! Pods (get, list, create, replace, JSON merge patch, delete, and watch
//! with `resourceVersion`), `SelfSubjectAccessReview` (allowed unless the
//! verb and resource were denied with [`Running::deny`]); one global
//! `resourceVersion` that grows with every write, `409 Conflict` when a
//! replace carries a stale one, `409 AlreadyExists`, `404 NotFound` as
//! Kubernetes `Status` objects; a binder that binds a claim and a volume
//! that name each other (claimRef and volumeName) and marks a volume whose
//! claim is gone `Released`.
//!
//! Not modelled: authentication, admission, finalizers and graceful
//! deletion (objects go at once), label and field selectors, strategic
//! merge patch (treated as a merge patch), server-side apply, dynamic
//! provisioning, pods being scheduled or run, and any other resource.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// (plural, namespace or "", name)
type Key = (String, String, String);

#[derive(Debug, Default)]
struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    uid: u64,
    /// (resourceVersion, plural, event type, object)
    events: Vec<(u64, String, &'static str, Value)>,
    denied: BTreeSet<(String, String)>,
}

#[derive(Debug, Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    tx: broadcast::Sender<(u64, String, &'static str, Value)>,
}

fn kind_of(plural: &str) -> &'static str {
    match plural {
        "nodes" => "Node",
        "persistentvolumes" => "PersistentVolume",
        "persistentvolumeclaims" => "PersistentVolumeClaim",
        "pods" => "Pod",
        _ => "Unknown",
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
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

impl Store {
    fn write(
        &mut self,
        tx: &broadcast::Sender<(u64, String, &'static str, Value)>,
        key: Key,
        mut obj: Option<Value>,
        kind: &'static str,
    ) -> u64 {
        self.rv += 1;
        let rv = self.rv;
        if let Some(o) = obj.as_mut() {
            o["metadata"]["resourceVersion"] = json!(rv.to_string());
        }
        let event_obj = match &obj {
            Some(o) => {
                self.objects.insert(key.clone(), o.clone());
                o.clone()
            }
            None => self.objects.remove(&key).unwrap_or(Value::Null),
        };
        let ev = (rv, key.0.clone(), kind, event_obj);
        self.events.push(ev.clone());
        let _ = tx.send(ev);
        rv
    }

    /// Binds claims and volumes that name each other; releases volumes
    /// whose claim is gone.
    fn bind(&mut self, tx: &broadcast::Sender<(u64, String, &'static str, Value)>) {
        let pvs: Vec<(Key, Value)> = self
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "persistentvolumes")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (pv_key, pv) in pvs {
            let claim = &pv["spec"]["claimRef"];
            let phase = pv["status"]["phase"].as_str().unwrap_or("").to_string();
            let want = if claim.is_null() {
                "Available".to_string()
            } else {
                let ck = (
                    "persistentvolumeclaims".to_string(),
                    claim["namespace"].as_str().unwrap_or("").to_string(),
                    claim["name"].as_str().unwrap_or("").to_string(),
                );
                match self.objects.get(&ck).cloned() {
                    Some(pvc)
                        if pvc["spec"]["volumeName"] == pv["metadata"]["name"]
                            && (claim["uid"].is_null()
                                || claim["uid"] == pvc["metadata"]["uid"]) =>
                    {
                        if pvc["status"]["phase"] != "Bound" {
                            let mut pvc = pvc.clone();
                            pvc["status"] = json!({"phase": "Bound", "capacity": pv["spec"]["capacity"].clone(), "accessModes": pv["spec"]["accessModes"].clone()});
                            self.write(tx, ck, Some(pvc), "MODIFIED");
                        }
                        "Bound".to_string()
                    }
                    Some(_) => "Available".to_string(),
                    None => "Released".to_string(),
                }
            };
            if phase != want {
                let mut pv = self.objects.get(&pv_key).cloned().unwrap_or(pv);
                pv["status"] = json!({"phase": want});
                self.write(tx, pv_key, Some(pv), "MODIFIED");
            }
        }
    }
}

/// A running kubesim.
#[derive(Debug, Clone)]
pub struct Running {
    pub url: String,
    shared: Shared,
}

impl Running {
    /// Stores `obj` (its `kind` and metadata name, and namespace when namespaced).
    pub fn put(&self, plural: &str, obj: Value) {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        let mut s = self.shared.store.lock().unwrap_or_else(|e| e.into_inner());
        let mut obj = obj;
        s.uid += 1;
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{}", s.uid));
        }
        obj["kind"] = json!(kind_of(plural));
        obj["apiVersion"] = json!("v1");
        s.write(
            &self.shared.tx,
            (plural.to_string(), ns, name),
            Some(obj),
            "ADDED",
        );
        s.bind(&self.shared.tx);
    }

    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let s = self.shared.store.lock().unwrap_or_else(|e| e.into_inner());
        s.objects
            .get(&(plural.to_string(), namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Makes SelfSubjectAccessReviews for `verb` on `resource` answer no.
    pub fn deny(&self, verb: &str, resource: &str) {
        let mut s = self.shared.store.lock().unwrap_or_else(|e| e.into_inner());
        s.denied.insert((verb.to_string(), resource.to_string()));
    }
}

/// Starts kubesim on 127.0.0.1 (a free port).
pub async fn start() -> std::io::Result<Running> {
    let (tx, _) = broadcast::channel(1024);
    let shared = Shared {
        store: Arc::new(Mutex::new(Store::default())),
        tx,
    };
    let app = Router::new().fallback(handle).with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(Running { url, shared })
}

/// `(plural, namespace, name)` from a request path, for the paths served.
fn route(path: &str) -> Option<(String, String, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segs.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    match rest {
        ["namespaces", ns, plural] => Some((plural.to_string(), ns.to_string(), None)),
        ["namespaces", ns, plural, name] => {
            Some((plural.to_string(), ns.to_string(), Some(name.to_string())))
        }
        [plural] => Some((plural.to_string(), String::new(), None)),
        [plural, name] => Some((plural.to_string(), String::new(), Some(name.to_string()))),
        _ => None,
    }
}

async fn handle(
    State(sh): State<Shared>,
    method: Method,
    uri: Uri,
    Query(q): Query<BTreeMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    let Some((plural, ns, name)) = route(uri.path()) else {
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
            attrs["verb"].as_str().unwrap_or("").to_string(),
            attrs["resource"].as_str().unwrap_or("").to_string(),
        );
        let allowed = !sh
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .denied
            .contains(&key);
        let mut out = body.clone();
        out["status"] = json!({"allowed": allowed});
        return (StatusCode::CREATED, axum::Json(out)).into_response();
    }
    let kind = kind_of(&plural);
    let mut s = sh.store.lock().unwrap_or_else(|e| e.into_inner());
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
            axum::Json(json!({"kind": format!("{kind}List"), "apiVersion": "v1", "metadata": {"resourceVersion": s.rv.to_string()}, "items": items})).into_response()
        }
        (Method::GET, Some(n)) => match s.objects.get(&(plural.clone(), ns.clone(), n.clone())) {
            Some(o) => axum::Json(o.clone()).into_response(),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{plural} \"{n}\" not found"),
            ),
        },
        (Method::POST, None) => {
            let mut obj = body;
            let n = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            let key = (plural.clone(), ns.clone(), n.clone());
            if s.objects.contains_key(&key) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("{plural} \"{n}\" already exists"),
                );
            }
            s.uid += 1;
            obj["metadata"]["uid"] = json!(format!("uid-{}", s.uid));
            if !ns.is_empty() {
                obj["metadata"]["namespace"] = json!(ns);
            }
            obj["kind"] = json!(kind);
            obj["apiVersion"] = json!("v1");
            s.write(&sh.tx, key.clone(), Some(obj), "ADDED");
            s.bind(&sh.tx);
            (
                StatusCode::CREATED,
                axum::Json(s.objects.get(&key).cloned().unwrap_or_default()),
            )
                .into_response()
        }
        (m @ (Method::PUT | Method::PATCH), Some(n)) => {
            let key = (plural.clone(), ns.clone(), n.clone());
            let Some(current) = s.objects.get(&key).cloned() else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{plural} \"{n}\" not found"),
                );
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
                let mut b = body;
                b["metadata"]["uid"] = current["metadata"]["uid"].clone();
                b
            } else {
                let mut t = current;
                merge(&mut t, &body);
                t
            };
            s.write(&sh.tx, key.clone(), Some(next), "MODIFIED");
            s.bind(&sh.tx);
            axum::Json(s.objects.get(&key).cloned().unwrap_or_default()).into_response()
        }
        (Method::DELETE, Some(n)) => {
            let key = (plural.clone(), ns.clone(), n.clone());
            let Some(current) = s.objects.get(&key).cloned() else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{plural} \"{n}\" not found"),
                );
            };
            s.write(&sh.tx, key, None, "DELETED");
            s.bind(&sh.tx);
            axum::Json(current).into_response()
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{} is not served here", uri.path()),
        ),
    }
}

use futures::StreamExt as _;
