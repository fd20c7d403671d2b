//! The object store and the generic registry rules of `k8s.io/apiserver`
//! that kubesim follows: create (with the StorageObjectInUseProtection
//! admission), update (finalizers, deletionTimestamp) and delete
//! (finalizers, propagationPolicy, preconditions).
//!
//! Sources: kubernetes/apiserver (pkg/registry/generic/registry/store.go,
//! pkg/registry/rest), kubernetes/apimachinery (pkg/api/validation).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::{FOREGROUND_DELETION, ORPHAN, PV_PROTECTION, PVC_PROTECTION};

/// (plural, namespace or "", name)
pub(crate) type Key = (String, String, String);
/// (resourceVersion, plural, event type, object)
pub(crate) type Event = (u64, String, &'static str, Value);
pub(crate) type Tx = broadcast::Sender<Event>;

pub(crate) const PVS: &str = "persistentvolumes";
pub(crate) const PVCS: &str = "persistentvolumeclaims";
pub(crate) const PODS: &str = "pods";
pub(crate) const VAS: &str = "volumeattachments";

/// The kind and API group of a resource.
pub(crate) fn resource(plural: &str) -> (&'static str, &'static str) {
    match plural {
        "nodes" => ("Node", ""),
        PVS => ("PersistentVolume", ""),
        PVCS => ("PersistentVolumeClaim", ""),
        PODS => ("Pod", ""),
        // kubernetes/api storage/v1/types.go:133-245: storage.k8s.io/v1, cluster-scoped.
        VAS => ("VolumeAttachment", "storage.k8s.io"),
        "namespaces" => ("Namespace", ""),
        // kubernetes/api storage/v1/types.go CSINode: storage.k8s.io/v1, cluster-scoped.
        "csinodes" => ("CSINode", "storage.k8s.io"),
        // kubernetes/api core/v1/types.go Event: core, namespaced.
        "events" => ("Event", ""),
        // external-snapshotter client/apis/volumesnapshot/v1/types.go: cluster-scoped.
        "volumesnapshotcontents" => ("VolumeSnapshotContent", "snapshot.storage.k8s.io"),
        _ => ("Unknown", ""),
    }
}

pub(crate) fn api_version(plural: &str) -> String {
    match resource(plural).1 {
        "" => "v1".to_string(),
        g => format!("{g}/v1"),
    }
}

/// `schema.GroupResource.String()` (apimachinery group_version.go): the
/// plural, with `.group` when the group is not core.
fn qualified_resource(plural: &str) -> String {
    match resource(plural).1 {
        "" => plural.to_string(),
        g => format!("{plural}.{g}"),
    }
}

/// `GroupKind.String()`: the kind, with `.group` when the group is not core.
fn qualified_kind(plural: &str) -> String {
    match resource(plural) {
        (k, "") => k.to_string(),
        (k, g) => format!("{k}.{g}"),
    }
}

/// A Kubernetes `Status` failure.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    pub(crate) fn new(code: StatusCode, reason: &'static str, message: String) -> Self {
        ApiError {
            code,
            reason,
            message,
            details: Value::Null,
        }
    }

    /// apimachinery `errors.NewNotFound`: `<resource> "<name>" not found`.
    pub(crate) fn not_found(plural: &str, name: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", qualified_resource(plural)),
        )
    }

    /// `rest.BeforeDelete` (apiserver pkg/registry/rest/delete.go) builds its
    /// Conflict with `GroupResource{Group, Resource: gvk.Kind}`, so the
    /// message names the Kind (apimachinery errors.go `NewConflict`).
    fn precondition(plural: &str, name: &str, why: String) -> Self {
        let (kind, group) = resource(plural);
        ApiError {
            details: json!({"name": name, "group": group, "kind": kind}),
            ..ApiError::new(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    qualified_kind(plural)
                ),
            )
        }
    }

    /// apimachinery errors.go:284 `NewInvalid` with one field error.
    fn invalid(plural: &str, name: &str, field: &str, cause: &str, body: String) -> Self {
        let (kind, group) = resource(plural);
        ApiError {
            details: json!({"name": name, "group": group, "kind": kind,
                "causes": [{"reason": cause, "message": body, "field": field}]}),
            ..ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!(
                    "{} \"{name}\" is invalid: {field}: {body}",
                    qualified_kind(plural)
                ),
            )
        }
    }

    pub(crate) fn body(&self) -> Value {
        let mut b = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code.as_u16()});
        if !self.details.is_null() {
            b["details"] = self.details.clone();
        }
        b
    }
}

pub(crate) fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

pub(crate) fn finalizers(o: &Value) -> Vec<String> {
    o["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn set_finalizers(o: &mut Value, f: Vec<String>) {
    if let Some(m) = o["metadata"].as_object_mut() {
        if f.is_empty() {
            m.remove("finalizers");
        } else {
            m.insert("finalizers".into(), json!(f));
        }
    }
}

pub(crate) fn is_deleting(o: &Value) -> bool {
    !o["metadata"]["deletionTimestamp"].is_null()
}

pub(crate) fn annotation<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o["metadata"]["annotations"][k].as_str()
}

pub(crate) fn set_annotation(o: &mut Value, k: &str, v: &str) {
    if !o["metadata"]["annotations"].is_object() {
        o["metadata"]["annotations"] = json!({});
    }
    o["metadata"]["annotations"][k] = json!(v);
}

/// Now as RFC 3339 in seconds, as `metav1.Time` serialises.
pub(crate) fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Go's `%#v` of a `[]string`.
fn go_strings(v: &[String]) -> String {
    let quoted: Vec<String> = v.iter().map(|s| json!(s).to_string()).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

#[derive(Debug)]
pub(crate) struct Store {
    pub objects: BTreeMap<Key, Value>,
    pub rv: u64,
    pub uid: u64,
    pub events: Vec<Event>,
    pub denied: BTreeSet<(String, String)>,
    /// When each object was last written, for the controllers' delay.
    pub touched: HashMap<Key, Instant>,
    /// StorageObjectInUseProtection admission on or off.
    pub admission: bool,
    /// How long the binder takes to write a PersistentVolume's phase.
    pub binder_delay: Duration,
    /// How long the tick controllers leave an object after its last write.
    pub controller_delay: Duration,
    /// PersistentVolume name → when its pending phase write is due.
    pub phase_due: BTreeMap<String, Instant>,
    /// What the provisioner actor deleted in the storage backend.
    pub deleted_volumes: Vec<String>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            rv: 0,
            uid: 0,
            events: Vec::new(),
            denied: BTreeSet::new(),
            touched: HashMap::new(),
            admission: true,
            binder_delay: Duration::ZERO,
            controller_delay: Duration::ZERO,
            phase_due: BTreeMap::new(),
            deleted_volumes: Vec::new(),
        }
    }
}

impl Store {
    /// Stores `obj` under `key` (or removes it) with a new resourceVersion,
    /// and records the watch event.
    pub(crate) fn write(
        &mut self,
        tx: &Tx,
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
                self.touched.insert(key.clone(), Instant::now());
                o.clone()
            }
            None => {
                self.touched.remove(&key);
                // etcd3 watcher.go prepareObjects: a DELETED event "sends the
                // *old* object with the etcd revision for the time at which it
                // gets deleted".
                let mut last = self.objects.remove(&key).unwrap_or(Value::Null);
                if last.is_object() {
                    last["metadata"]["resourceVersion"] = json!(rv.to_string());
                }
                last
            }
        };
        let ev = (rv, key.0.clone(), kind, event_obj);
        self.events.push(ev.clone());
        let _ = tx.send(ev);
        rv
    }

    pub(crate) fn keys(&self, plural: &str) -> Vec<Key> {
        self.objects
            .keys()
            .filter(|k| k.0 == plural)
            .cloned()
            .collect()
    }

    /// Whether the tick controllers may act on `key` yet (its last write is
    /// at least `controller_delay` old).
    pub(crate) fn ready(&self, key: &Key, now: Instant) -> bool {
        self.controller_delay.is_zero()
            || self
                .touched
                .get(key)
                .is_none_or(|t| now.saturating_duration_since(*t) >= self.controller_delay)
    }

    /// Admission plugin StorageObjectInUseProtection (kubernetes
    /// plugin/pkg/admission/storage/storageobjectinuseprotection/admission.go
    /// admitPVC / admitPV): on CREATE, adds `kubernetes.io/pvc-protection` to
    /// claims and `kubernetes.io/pv-protection` to volumes.
    pub(crate) fn admit(&self, plural: &str, obj: &mut Value) {
        let f = match plural {
            PVCS => PVC_PROTECTION,
            PVS => PV_PROTECTION,
            _ => return,
        };
        if !self.admission {
            return;
        }
        let mut fs = finalizers(obj);
        if !fs.iter().any(|x| x == f) {
            fs.push(f.to_string());
            set_finalizers(obj, fs);
        }
    }

    /// POST: AlreadyExists, or the object stored with a new uid (after admission).
    pub(crate) fn create(
        &mut self,
        tx: &Tx,
        plural: &str,
        ns: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        let n = text(&obj["metadata"]["name"]).to_string();
        let key = (plural.to_string(), ns.to_string(), n.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{n}\" already exists", qualified_resource(plural)),
            ));
        }
        self.uid += 1;
        obj["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
        if !ns.is_empty() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        obj["kind"] = json!(resource(plural).0);
        obj["apiVersion"] = json!(api_version(plural));
        self.admit(plural, &mut obj);
        self.write(tx, key.clone(), Some(obj), "ADDED");
        Ok(self.objects.get(&key).cloned().unwrap_or_default())
    }

    /// An update (PUT, PATCH, a controller's write) of `key` to `new`, or of
    /// its status only, by the rules of apiserver `Store.Update` (store.go:685).
    pub(crate) fn update(
        &mut self,
        tx: &Tx,
        key: &Key,
        new: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let (plural, name) = (key.0.as_str(), key.2.as_str());
        let Some(old) = self.objects.get(key).cloned() else {
            return Err(ApiError::not_found(plural, name));
        };
        let mut new = if status_only {
            // The /status subresource (kubernetes/api storage/v1/types.go for
            // VolumeAttachment; core status): only `status` changes.
            let mut o = old.clone();
            o["status"] = new["status"].clone();
            o
        } else {
            new
        };
        new["metadata"]["uid"] = old["metadata"]["uid"].clone();
        new["kind"] = old["kind"].clone();
        new["apiVersion"] = old["apiVersion"].clone();
        if plural == PVCS && !status_only {
            // PVC PrepareForUpdate copies the old status: status only via
            // /status (kubernetes pkg/registry/core/persistentvolumeclaim/strategy.go).
            new["status"] = old["status"].clone();
        }
        let old_deleting = is_deleting(&old);
        if old_deleting {
            // rest.BeforeUpdate (apiserver pkg/registry/rest/update.go:114): "an
            // update can never remove/change a deletion timestamp"; a nil grace
            // period gets the old one back.
            new["metadata"]["deletionTimestamp"] = old["metadata"]["deletionTimestamp"].clone();
            new["metadata"]["deletionGracePeriodSeconds"] =
                old["metadata"]["deletionGracePeriodSeconds"].clone();
            // ValidateNoNewFinalizers (apimachinery pkg/api/validation/objectmeta.go:127),
            // from ValidateObjectMetaAccessorUpdate (objectmeta.go:337) when the
            // old object is being deleted: 422 Invalid.
            let had: BTreeSet<String> = finalizers(&old).into_iter().collect();
            let extra: BTreeSet<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !had.contains(f))
                .collect();
            if !extra.is_empty() {
                let extra: Vec<String> = extra.into_iter().collect();
                return Err(ApiError::invalid(
                    plural,
                    name,
                    "metadata.finalizers",
                    "FieldValueForbidden",
                    format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {}",
                        go_strings(&extra)
                    ),
                ));
            }
        } else if let Some(m) = new["metadata"].as_object_mut() {
            // Not modelled: setting a deletionTimestamp on an object that is
            // not being deleted is a 422 (objectmeta.go:360 ValidateImmutableField);
            // kubesim drops it instead.
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
        }
        if old_deleting
            && finalizers(&new).is_empty()
            && new["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .is_none_or(|g| g == 0)
        {
            // ShouldDeleteDuringUpdate (store.go:633) → deleteWithoutFinalizers
            // (store.go:658): nothing is written, the object is deleted (one
            // DELETED event carrying the last *stored* state), and the answer is
            // 200 with the request's object.
            self.write(tx, key.clone(), None, "DELETED");
            self.phase_due.remove(name);
            return Ok(new);
        }
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if new == old {
            // etcd3 GuaranteedUpdate (apiserver pkg/storage/etcd3/store.go:562
            // `bytes.Equal(data, origState.data)`) skips an identical write: no
            // new resourceVersion, no event.
            return Ok(old);
        }
        self.write(tx, key.clone(), Some(new), "MODIFIED");
        Ok(self.objects.get(key).cloned().unwrap_or_default())
    }

    /// DELETE with `opts` (a DeleteOptions body), by apiserver `Store.Delete`
    /// (store.go:1203). PV, PVC and VolumeAttachment have no graceful
    /// deletion (no `CheckGracefulDelete`), so finalizers alone decide.
    pub(crate) fn delete(&mut self, tx: &Tx, key: &Key, opts: &Value) -> Result<Value, ApiError> {
        let (plural, name) = (key.0.as_str(), key.2.as_str());
        let Some(cur) = self.objects.get(key).cloned() else {
            return Err(ApiError::not_found(plural, name));
        };
        // rest.BeforeDelete (apiserver pkg/registry/rest/delete.go) checks the
        // preconditions first, "to fail early": 409 Conflict.
        let pre = &opts["preconditions"];
        if let Some(uid) = pre["uid"].as_str()
            && uid != text(&cur["metadata"]["uid"])
        {
            return Err(ApiError::precondition(
                plural,
                name,
                format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
                    text(&cur["metadata"]["uid"])
                ),
            ));
        }
        if let Some(rv) = pre["resourceVersion"].as_str()
            && rv != text(&cur["metadata"]["resourceVersion"])
        {
            return Err(ApiError::precondition(
                plural,
                name,
                format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                    text(&cur["metadata"]["resourceVersion"])
                ),
            ));
        }
        // deletionFinalizersForGarbageCollection (store.go:1048): both GC
        // finalizers are taken out and put back as the policy says
        // (shouldOrphanDependents / shouldDeleteDependentsInForeground, store.go:1004);
        // without a policy the existing ones stay. Foreground adds
        // `foregroundDeletion` (metav1.FinalizerDeleteDependents, apimachinery
        // types.go:126), Orphan adds `orphan`, Background adds nothing.
        let old_f = finalizers(&cur);
        let has = |f: &str| old_f.iter().any(|x| x == f);
        let (orphan, foreground) = match opts["propagationPolicy"].as_str() {
            Some("Orphan") => (true, false),
            Some("Foreground") => (false, true),
            Some("Background") => (false, false),
            _ => (has(ORPHAN), has(FOREGROUND_DELETION)),
        };
        let mut new_f: Vec<String> = old_f
            .iter()
            .filter(|f| *f != ORPHAN && *f != FOREGROUND_DELETION)
            .cloned()
            .collect();
        if orphan {
            new_f.push(ORPHAN.into());
        }
        if foreground {
            new_f.push(FOREGROUND_DELETION.into());
        }
        if new_f.iter().collect::<BTreeSet<_>>() == old_f.iter().collect::<BTreeSet<_>>() {
            new_f = old_f.clone();
        }
        if new_f.is_empty() {
            // No pending finalizers: deleted at once (errDeleteNow); 200 with
            // the last stored object (finalizeDelete, store.go:1458, and
            // ReturnDeletedObject), one DELETED event.
            self.write(tx, key.clone(), None, "DELETED");
            self.phase_due.remove(name);
            return Ok(cur);
        }
        // updateForGracefulDeletionAndFinalizers (store.go:1116) → markAsDeleting
        // (store.go:1083): deletionTimestamp = now if unset, grace 0, generation+1
        // if > 0 and not yet deleting. 200 with the updated object, MODIFIED.
        let mut new = cur.clone();
        set_finalizers(&mut new, new_f);
        if !is_deleting(&cur) {
            new["metadata"]["deletionTimestamp"] = json!(rfc3339_now());
            if let Some(g) = cur["metadata"]["generation"].as_i64()
                && g > 0
            {
                new["metadata"]["generation"] = json!(g + 1);
            }
        }
        new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        if new == cur {
            // A repeated DELETE changes nothing: etcd3 store.go:562 skips the
            // write; 200 + the current object, no event.
            return Ok(cur);
        }
        self.write(tx, key.clone(), Some(new), "MODIFIED");
        Ok(self.objects.get(key).cloned().unwrap_or_default())
    }

    /// Removes finalizer `f` from `key` by an update (as the controllers do).
    pub(crate) fn remove_finalizer(&mut self, tx: &Tx, key: &Key, f: &str) {
        if let Some(o) = self.objects.get(key) {
            let mut o = o.clone();
            let fs: Vec<String> = finalizers(&o).into_iter().filter(|x| x != f).collect();
            set_finalizers(&mut o, fs);
            let _ = self.update(tx, key, o, false);
        }
    }

    /// Adds finalizer `f` to `key` by an update, unless it is there.
    pub(crate) fn add_finalizer(&mut self, tx: &Tx, key: &Key, f: &str) {
        if let Some(o) = self.objects.get(key) {
            let mut fs = finalizers(o);
            if fs.iter().any(|x| x == f) {
                return;
            }
            let mut o = o.clone();
            fs.push(f.to_string());
            set_finalizers(&mut o, fs);
            let _ = self.update(tx, key, o, false);
        }
    }
}
