//! The PersistentVolume controller's binder (kubernetes
//! `pkg/controller/volume/persistentvolume/pv_controller.go`, `syncVolume`,
//! `syncClaim`, `bind`), with claimRef.uid as the real one uses it.
//!
//! A volume's phase is written apart from its claimRef (`updateVolumePhase`
//! is its own UpdateStatus), and [`Store::binder_delay`] late, so the window
//! in which a volume is `Released` with a new claimRef exists here too.

use std::collections::BTreeSet;
use std::time::Instant;

use serde_json::{Value, json};

use crate::store::{Key, PVCS, PVS, Store, Tx, annotation, is_deleting, set_annotation, text};

/// component-helpers storage/volume pv_helpers.go: `AnnBindCompleted`.
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// pv_helpers.go: `AnnBoundByController`.
const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// pv_helpers.go: `AnnDynamicallyProvisioned`.
pub(crate) const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

fn pv_key(name: &str) -> Key {
    (PVS.to_string(), String::new(), name.to_string())
}

fn pvc_key(ns: &str, name: &str) -> Key {
    (PVCS.to_string(), ns.to_string(), name.to_string())
}

/// `storagehelpers.IsVolumeBoundToClaim` (component-helpers pv_helpers.go:159):
/// claimRef names the claim, and its uid is empty or the claim's.
fn is_bound_to(pv: &Value, claim: &Value) -> bool {
    let r = &pv["spec"]["claimRef"];
    !r.is_null()
        && text(&r["name"]) == text(&claim["metadata"]["name"])
        && text(&r["namespace"]) == text(&claim["metadata"]["namespace"])
        && (text(&r["uid"]).is_empty() || r["uid"] == claim["metadata"]["uid"])
}

/// A Kubernetes quantity in bytes (enough for storage sizes).
fn quantity(q: &Value) -> f64 {
    let s = text(q).trim();
    let units: [(&str, f64); 13] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
        ("m", 1e-3),
    ];
    for (suffix, mult) in units {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<f64>().unwrap_or(0.0) * mult;
        }
    }
    s.parse().unwrap_or(0.0)
}

/// `checkVolumeSatisfyClaim` (pv_controller.go): not deleting ("the volume
/// is marked for deletion"), big enough, same class, volume mode and access modes.
fn satisfies(pv: &Value, claim: &Value) -> bool {
    let mode = |v: &Value| match text(&v["spec"]["volumeMode"]) {
        "" => "Filesystem".to_string(),
        m => m.to_string(),
    };
    let pv_modes: Vec<&Value> = pv["spec"]["accessModes"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    !is_deleting(pv)
        && quantity(&pv["spec"]["capacity"]["storage"])
            >= quantity(&claim["spec"]["resources"]["requests"]["storage"])
        && text(&pv["spec"]["storageClassName"]) == text(&claim["spec"]["storageClassName"])
        && mode(pv) == mode(claim)
        && claim["spec"]["accessModes"]
            .as_array()
            .is_none_or(|a| a.iter().all(|m| pv_modes.contains(&m)))
}

impl Store {
    /// Runs the binder until nothing changes (a pending delayed phase write
    /// counts as nothing yet).
    pub(crate) fn bind_all(&mut self, tx: &Tx, now: Instant) {
        for _ in 0..16 {
            let before = self.rv;
            for k in self.keys(PVS) {
                self.sync_volume(tx, &k.2, now);
            }
            for k in self.keys(PVCS) {
                self.sync_claim(tx, &k, now);
            }
            if self.rv == before {
                break;
            }
        }
        let live: BTreeSet<String> = self.keys(PVS).into_iter().map(|k| k.2).collect();
        self.phase_due.retain(|n, _| live.contains(n));
    }

    /// `updateVolumePhase`: the volume's phase, written on its own, once
    /// `binder_delay` has passed since the binder first wanted it. The write
    /// is decided again when due, from the state then.
    fn set_pv_phase(&mut self, tx: &Tx, name: &str, phase: &str, now: Instant) {
        let key = pv_key(name);
        let Some(pv) = self.objects.get(&key) else {
            return;
        };
        if text(&pv["status"]["phase"]) == phase {
            self.phase_due.remove(name);
            return;
        }
        if !self.binder_delay.is_zero() {
            match self.phase_due.get(name) {
                None => {
                    self.phase_due
                        .insert(name.to_string(), now + self.binder_delay);
                    return;
                }
                Some(due) if *due > now => return,
                Some(_) => {
                    self.phase_due.remove(name);
                }
            }
        }
        let mut status = match &pv["status"] {
            Value::Object(m) => Value::Object(m.clone()),
            _ => json!({}),
        };
        status["phase"] = json!(phase);
        if let Some(m) = status.as_object_mut() {
            m.remove("message");
        }
        let _ = self.update(tx, &key, json!({"status": status}), true);
    }

    /// `updateClaimStatus(phase, volume)`: phase, and access modes and
    /// capacity from the volume (reset without one; capacity only when the
    /// phase changes).
    fn set_claim_status(&mut self, tx: &Tx, key: &Key, phase: &str, volume: Option<&Value>) {
        let Some(c) = self.objects.get(key) else {
            return;
        };
        let mut st = match &c["status"] {
            Value::Object(m) => Value::Object(m.clone()),
            _ => json!({}),
        };
        let changing = text(&st["phase"]) != phase;
        st["phase"] = json!(phase);
        match volume {
            None => {
                if let Some(m) = st.as_object_mut() {
                    m.remove("accessModes");
                    m.remove("capacity");
                }
            }
            Some(pv) => {
                st["accessModes"] = pv["spec"]["accessModes"].clone();
                if changing {
                    st["capacity"] = pv["spec"]["capacity"].clone();
                }
            }
        }
        if st != c["status"] {
            let _ = self.update(tx, key, json!({"status": st}), true);
        }
    }

    /// `syncVolume` (kubernetes pkg/controller/volume/persistentvolume/pv_controller.go).
    fn sync_volume(&mut self, tx: &Tx, name: &str, now: Instant) {
        let Some(pv) = self.objects.get(&pv_key(name)).cloned() else {
            return;
        };
        let r = &pv["spec"]["claimRef"];
        // Steps 1-2: no claimRef → unused; claimRef without uid → pre-bound
        // ("the PVC sync will handle it"). Both Available.
        if r.is_null() || text(&r["uid"]).is_empty() {
            self.set_pv_phase(tx, name, "Available", now);
            return;
        }
        // Step 3: the claim by namespace/name; a different uid means "claim has
        // a newer UID than pv.ClaimRef, the old one must have been deleted".
        let claim = self
            .objects
            .get(&pvc_key(text(&r["namespace"]), text(&r["name"])))
            .filter(|c| c["metadata"]["uid"] == r["uid"])
            .cloned();
        let phase = text(&pv["status"]["phase"]);
        match claim {
            // Step 4: claim == nil → Released (unless Released or Failed), then
            // reclaimVolume: Retain does nothing; for Delete the external
            // provisioner deletes the disk (the provisioner actor).
            None => {
                if phase != "Failed" {
                    self.set_pv_phase(tx, name, "Released", now);
                }
            }
            Some(c) => {
                let volume_name = text(&c["spec"]["volumeName"]);
                if volume_name.is_empty() {
                    // Step 5: the claim sync binds it.
                } else if volume_name == name {
                    // Step 6: bound properly; also how a Released volume becomes
                    // Bound again once claimRef names a live claim with the right uid.
                    self.set_pv_phase(tx, name, "Bound", now);
                } else if annotation(&pv, PROVISIONED_BY).is_some()
                    && text(&pv["spec"]["persistentVolumeReclaimPolicy"]) == "Delete"
                {
                    // Step 7: a provisioned Delete volume whose claim is bound elsewhere.
                    if phase != "Failed" {
                        self.set_pv_phase(tx, name, "Released", now);
                    }
                } else {
                    // Step 7, unbindVolume: bound by the controller → claimRef
                    // and annotation go; pre-bound by a user → only claimRef.uid.
                    let mut n = pv.clone();
                    if annotation(&pv, BOUND_BY_CONTROLLER).is_some() {
                        n["spec"]["claimRef"] = Value::Null;
                        if let Some(a) = n["metadata"]["annotations"].as_object_mut() {
                            a.remove(BOUND_BY_CONTROLLER);
                        }
                    } else if let Some(m) = n["spec"]["claimRef"].as_object_mut() {
                        m.remove("uid");
                    }
                    let _ = self.update(tx, &pv_key(name), n, false);
                    self.set_pv_phase(tx, name, "Available", now);
                }
            }
        }
    }

    /// `syncClaim` → `syncUnboundClaim` / `syncBoundClaim` (by the
    /// `pv.kubernetes.io/bind-completed` annotation).
    fn sync_claim(&mut self, tx: &Tx, key: &Key, now: Instant) {
        let Some(c) = self.objects.get(key).cloned() else {
            return;
        };
        let volume_name = text(&c["spec"]["volumeName"]).to_string();
        let pv = (!volume_name.is_empty())
            .then(|| self.objects.get(&pv_key(&volume_name)).cloned())
            .flatten();
        if annotation(&c, BIND_COMPLETED).is_none() {
            if volume_name.is_empty() {
                // findBestMatchForClaim: a volume pre-bound to this claim comes
                // first; deleting volumes and volumes claimed by others are skipped.
                // Not modelled: matching unreserved volumes by size and class.
                let found = self
                    .keys(PVS)
                    .into_iter()
                    .filter_map(|k| self.objects.get(&k))
                    .find(|v| is_bound_to(v, &c) && !is_deleting(v))
                    .map(|v| text(&v["metadata"]["name"]).to_string());
                match found {
                    Some(v) => self.bind(tx, &v, key, now),
                    None => self.set_claim_status(tx, key, "Pending", None),
                }
                return;
            }
            match pv {
                // The requested volume does not exist: Pending, retried.
                None => self.set_claim_status(tx, key, "Pending", None),
                Some(v) if v["spec"]["claimRef"].is_null() => {
                    if satisfies(&v, &c) {
                        self.bind(tx, &volume_name, key, now);
                    } else {
                        self.set_claim_status(tx, key, "Pending", None);
                    }
                }
                // "volume already bound, finishing the binding" (adds the claim uid).
                Some(v) if is_bound_to(&v, &c) => self.bind(tx, &volume_name, key, now),
                Some(_) => {
                    // "volume %q already bound to a different claim.": Pending,
                    // retried. With bound-by-controller on the claim it is an
                    // error ("THIS SHOULD NEVER HAPPEN") and nothing is written.
                    if annotation(&c, BOUND_BY_CONTROLLER).is_none() {
                        self.set_claim_status(tx, key, "Pending", None);
                    }
                }
            }
            return;
        }
        // syncBoundClaim: no volumeName or no volume → Lost; volume unbound →
        // bind again; claimRef.uid == claim uid → bind (all is well); else Lost
        // ("Two claims are bound to the same volume, this one is bound incorrectly").
        match pv {
            None => self.set_claim_status(tx, key, "Lost", None),
            Some(v)
                if v["spec"]["claimRef"].is_null()
                    || v["spec"]["claimRef"]["uid"] == c["metadata"]["uid"] =>
            {
                self.bind(tx, &volume_name, key, now);
            }
            Some(_) => self.set_claim_status(tx, key, "Lost", None),
        }
    }

    /// `bind`: `bindVolumeToClaim` (PV update) → `updateVolumePhase(Bound)`
    /// (its own write, delayed) → `bindClaimToVolume` (claim update) →
    /// `updateClaimStatus(Bound)`; the claim writes follow the phase write.
    fn bind(&mut self, tx: &Tx, pv_name: &str, claim: &Key, now: Instant) {
        let (Some(pv), Some(c)) = (
            self.objects.get(&pv_key(pv_name)).cloned(),
            self.objects.get(claim).cloned(),
        ) else {
            return;
        };
        // GetBindVolumeToClaim (component-helpers pv_helpers.go:120): claimRef
        // rewritten with reference.GetReference(claim), so the uid is filled in,
        // when name, namespace or uid differ; bound-by-controller set if the
        // volume was not bound to that claim already.
        let was_bound = is_bound_to(&pv, &c);
        let r = &pv["spec"]["claimRef"];
        let mut n = pv.clone();
        if r.is_null()
            || r["name"] != c["metadata"]["name"]
            || r["namespace"] != c["metadata"]["namespace"]
            || r["uid"] != c["metadata"]["uid"]
        {
            n["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": c["metadata"]["namespace"], "name": c["metadata"]["name"],
                "uid": c["metadata"]["uid"], "resourceVersion": c["metadata"]["resourceVersion"]});
        }
        if !was_bound && annotation(&n, BOUND_BY_CONTROLLER).is_none() {
            set_annotation(&mut n, BOUND_BY_CONTROLLER, "yes");
        }
        if n != pv {
            let _ = self.update(tx, &pv_key(pv_name), n, false);
        }
        self.set_pv_phase(tx, pv_name, "Bound", now);
        let Some(pv) = self.objects.get(&pv_key(pv_name)).cloned() else {
            return;
        };
        if text(&pv["status"]["phase"]) != "Bound" {
            return;
        }
        // bindClaimToVolume: volumeName (with bound-by-controller when it
        // changes) and bind-completed.
        let Some(c) = self.objects.get(claim).cloned() else {
            return;
        };
        let mut n = c.clone();
        if text(&c["spec"]["volumeName"]) != pv_name {
            n["spec"]["volumeName"] = json!(pv_name);
            if annotation(&n, BOUND_BY_CONTROLLER).is_none() {
                set_annotation(&mut n, BOUND_BY_CONTROLLER, "yes");
            }
        }
        if annotation(&n, BIND_COMPLETED).is_none() {
            set_annotation(&mut n, BIND_COMPLETED, "yes");
        }
        if n != c {
            let _ = self.update(tx, claim, n, false);
        }
        self.set_claim_status(tx, claim, "Bound", Some(&pv));
    }
}
