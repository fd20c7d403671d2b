//! The controllers that run on kubesim's tick: the garbage collector's
//! GC finalizers, pvc-protection, pv-protection, the CSI external-attacher
//! and the external-provisioner's deleter, then the binder.

use std::time::Instant;

use serde_json::{Value, json};

use crate::binder::PROVISIONED_BY;
use crate::store::{Key, PODS, PVCS, PVS, Store, Tx, VAS, finalizers, is_deleting, text};
use crate::{
    ATTACHER_FINALIZER, DRIVER, FOREGROUND_DELETION, ORPHAN, PV_PROTECTION, PVC_PROTECTION,
};

fn has(o: &Value, f: &str) -> bool {
    finalizers(o).iter().any(|x| x == f)
}

impl Store {
    /// One tick: every controller once, in a fixed order, then the binder.
    pub(crate) fn tick(&mut self, tx: &Tx, now: Instant) {
        self.garbage_collector(tx, now);
        self.pvc_protection(tx, now);
        self.pv_protection(tx, now);
        self.attacher(tx, now);
        self.provisioner(tx, now);
        self.bind_all(tx, now);
    }

    /// Keys of `plural` whose object passes `f` and may be acted on now.
    fn candidates(&self, plural: &str, now: Instant, f: impl Fn(&Value) -> bool) -> Vec<Key> {
        self.keys(plural)
            .into_iter()
            .filter(|k| self.objects.get(k).is_some_and(&f) && self.ready(k, now))
            .collect()
    }

    /// The garbage collector removes `foregroundDeletion` once no dependent
    /// blocks it (kubernetes pkg/controller/garbagecollector/garbagecollector.go
    /// processDeletingDependentsItem), and `orphan` after orphaning. Owner
    /// references are not modelled: nothing depends on anything, so both go
    /// on the next tick.
    fn garbage_collector(&mut self, tx: &Tx, now: Instant) {
        let plurals: Vec<String> = self
            .objects
            .keys()
            .map(|k| k.0.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for p in plurals {
            for k in self.candidates(&p, now, |o| {
                is_deleting(o) && (has(o, FOREGROUND_DELETION) || has(o, ORPHAN))
            }) {
                self.remove_finalizer(tx, &k, FOREGROUND_DELETION);
                self.remove_finalizer(tx, &k, ORPHAN);
            }
        }
    }

    /// pvc-protection (kubernetes pkg/controller/volume/pvcprotection/
    /// pvc_protection_controller.go `processPVC`): a deleting claim loses
    /// `kubernetes.io/pvc-protection` once no pod uses it. `podUsesPVC`: a pod
    /// with `spec.nodeName` set that names the claim, whatever its phase
    /// (unscheduled pods don't count). Not modelled: the exemption of
    /// ephemeral volumes of shut-down pods, and the controller adding the
    /// finalizer to old claims.
    fn pvc_protection(&mut self, tx: &Tx, now: Instant) {
        for k in self.candidates(PVCS, now, |c| is_deleting(c) && has(c, PVC_PROTECTION)) {
            let used = self.keys(PODS).into_iter().any(|pk| {
                let Some(p) = self.objects.get(&pk) else {
                    return false;
                };
                pk.1 == k.1
                    && !text(&p["spec"]["nodeName"]).is_empty()
                    && p["spec"]["volumes"].as_array().is_some_and(|vs| {
                        vs.iter()
                            .any(|v| text(&v["persistentVolumeClaim"]["claimName"]) == k.2)
                    })
            });
            if !used {
                self.remove_finalizer(tx, &k, PVC_PROTECTION);
            }
        }
    }

    /// pv-protection (kubernetes pkg/controller/volume/pvprotection/
    /// pv_protection_controller.go `processPV`): a deleting volume loses
    /// `kubernetes.io/pv-protection` once it is not in use, i.e. its phase is
    /// not Bound.
    fn pv_protection(&mut self, tx: &Tx, now: Instant) {
        for k in self.candidates(PVS, now, |v| {
            is_deleting(v) && has(v, PV_PROTECTION) && text(&v["status"]["phase"]) != "Bound"
        }) {
            self.remove_finalizer(tx, &k, PV_PROTECTION);
        }
    }

    /// The CSI external-attacher of [`DRIVER`] (kubernetes-csi/external-attacher
    /// pkg/controller/csi_handler.go), for VolumeAttachments whose
    /// `spec.attacher` is the driver:
    /// - not deleting: `syncAttach` → `csiAttach` refuses a deleting volume
    ///   ("PersistentVolume %q is marked for deletion"), else adds its finalizer
    ///   to the volume (`addPVFinalizer`, csi_handler.go:342) and to the
    ///   attachment (`prepareVAFinalizer`, :312), then `markAsAttached`;
    /// - deleting: `syncDetach` → `markAsDetached` (util.go:58) removes the
    ///   attachment's finalizer (ControllerUnpublish always succeeds here);
    /// - a deleting volume loses the finalizer once no VolumeAttachment has
    ///   `spec.source.persistentVolumeName` = its name
    ///   (`SyncNewOrUpdatedPersistentVolume`, csi_handler.go:646).
    fn attacher(&mut self, tx: &Tx, now: Instant) {
        for k in self.candidates(VAS, now, |va| text(&va["spec"]["attacher"]) == DRIVER) {
            let Some(va) = self.objects.get(&k).cloned() else {
                continue;
            };
            if is_deleting(&va) {
                self.remove_finalizer(tx, &k, ATTACHER_FINALIZER);
                if let Some(va) = self.objects.get(&k).cloned()
                    && va["status"]["attached"] != json!(false)
                {
                    let mut st = va["status"].clone();
                    st["attached"] = json!(false);
                    let _ = self.update(tx, &k, json!({"status": st}), true);
                }
                continue;
            }
            let pv_name = text(&va["spec"]["source"]["persistentVolumeName"]);
            let pv_key = (PVS.to_string(), String::new(), pv_name.to_string());
            let Some(pv) = self.objects.get(&pv_key).cloned() else {
                continue;
            };
            if is_deleting(&pv) {
                let message = format!("PersistentVolume \"{pv_name}\" is marked for deletion");
                if va["status"]["attachError"]["message"] != json!(message) {
                    let mut st = match &va["status"] {
                        Value::Object(m) => Value::Object(m.clone()),
                        _ => json!({}),
                    };
                    st["attachError"] = json!({"message": message});
                    let _ = self.update(tx, &k, json!({"status": st}), true);
                }
                continue;
            }
            self.add_finalizer(tx, &pv_key, ATTACHER_FINALIZER);
            self.add_finalizer(tx, &k, ATTACHER_FINALIZER);
            if let Some(va) = self.objects.get(&k).cloned()
                && va["status"]["attached"] != json!(true)
            {
                let _ = self.update(tx, &k, json!({"status": {"attached": true}}), true);
            }
        }
        let named: Vec<String> = self
            .keys(VAS)
            .into_iter()
            .filter_map(|k| self.objects.get(&k))
            .map(|va| text(&va["spec"]["source"]["persistentVolumeName"]).to_string())
            .collect();
        for k in self.candidates(PVS, now, |v| is_deleting(v) && has(v, ATTACHER_FINALIZER)) {
            if !named.contains(&k.2) {
                self.remove_finalizer(tx, &k, ATTACHER_FINALIZER);
            }
        }
    }

    /// The external-provisioner's deleter (sig-storage-lib-external-provisioner
    /// v13 controller.go `syncVolume`): for volumes of [`DRIVER`]
    /// (`isProvisionerForVolume`: `provisioned-by` names it, or a static CSI
    /// volume of the driver), `shouldDelete` (controller.go:1284) = not
    /// deleting, phase Released, reclaimPolicy Delete; it never looks at the
    /// claim. `csiProvisioner.Delete` refuses while a VolumeAttachment names the
    /// volume (`canDeleteVolume`, external-provisioner pkg/controller/controller.go:1526);
    /// else DeleteVolume is recorded and the volume DELETEd
    /// (`deleteVolumeOperation`).
    fn provisioner(&mut self, tx: &Tx, now: Instant) {
        let attached: Vec<String> = self
            .keys(VAS)
            .into_iter()
            .filter_map(|k| self.objects.get(&k))
            .map(|va| text(&va["spec"]["source"]["persistentVolumeName"]).to_string())
            .collect();
        for k in self.candidates(PVS, now, |v| {
            let ours = match v["metadata"]["annotations"][PROVISIONED_BY].as_str() {
                Some(p) => p == DRIVER,
                None => text(&v["spec"]["csi"]["driver"]) == DRIVER,
            };
            ours && !is_deleting(v)
                && text(&v["status"]["phase"]) == "Released"
                && text(&v["spec"]["persistentVolumeReclaimPolicy"]) == "Delete"
        }) {
            if attached.contains(&k.2) {
                continue;
            }
            let handle = self
                .objects
                .get(&k)
                .map(|v| text(&v["spec"]["csi"]["volumeHandle"]).to_string())
                .unwrap_or_default();
            self.deleted_volumes.push(format!("DeleteVolume({handle})"));
            let _ = self.delete(tx, &k, &json!({}));
        }
    }
}
