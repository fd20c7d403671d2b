//! Progress of a CreateVolume that copies (a clone or a restore), shown as
//! progress and not as failure.
//!
//! The external-provisioner turns every error answer into a Warning
//! `ProvisioningFailed` event on the claim, Aborted included, and calls
//! again (pkg/controller/controller.go checkError: Aborted, DeadlineExceeded,
//! Unavailable and Canceled mean "still in progress"; sig-storage-lib-
//! external-provisioner controller.go provisionClaimOperation records the
//! Warning). So CreateVolume waits for the copy within the call's deadline
//! (the chart gives the provisioner a long `--timeout`), and meanwhile the
//! controller posts Normal `Copying` events on the claim itself, named by
//! the provisioner's `--extra-create-metadata` parameters, and a gauge of
//! each running copy's progress.
//!
//! A claim deleted while its copy runs is never bound: the provisioner calls
//! again with the claim it remembers, or not at all (it forgets claims on a
//! restart), and never calls DeleteVolume for a volume it was not given.
//! So the claim is read along with the events, and the copy of a claim that
//! is gone is destroyed once its import ends (`ctl::copy`).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::kube::Kube;

/// The parameters `--extra-create-metadata` adds to CreateVolume
/// (external-provisioner pkg/controller/controller.go pvcNameKey,
/// pvcNamespaceKey).
pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";

pub use crate::kube::COMPONENT;

/// The event reasons on the claim.
pub const COPYING: &str = "Copying";
pub const COPIED: &str = "Copied";

/// How often a running copy's claim is read and an event posted, at most.
pub const DEFAULT_EVENT_INTERVAL: Duration = Duration::from_secs(30);

/// A copy not heard of for this long is forgotten (its claim was deleted,
/// or another controller took over): its gauge goes.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The claim a CreateVolume provisions, from its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
}

impl ClaimRef {
    /// The claim named by `--extra-create-metadata`; `None` without it.
    pub fn from_parameters(parameters: &HashMap<String, String>) -> Option<Self> {
        let name = parameters.get(PVC_NAME_KEY).filter(|n| !n.is_empty())?;
        let namespace = parameters
            .get(PVC_NAMESPACE_KEY)
            .filter(|n| !n.is_empty())?;
        Some(Self {
            namespace: namespace.clone(),
            name: name.clone(),
        })
    }
}

/// What is being copied, for the messages: "restoring snapshot <id>" or
/// "cloning volume <id>".
#[derive(Debug, Clone)]
pub struct CopyJob<'a> {
    /// The CSI volume name (`pvc-<uid>`).
    pub volume: &'a str,
    pub claim: Option<ClaimRef>,
    pub what: String,
}

/// The fraction done in a progress line of a task log (`tasks::is_progress`):
/// `transferred X of Y (NN.NN%)` or rbd's `NN% complete`; `None` for a
/// line without a percentage (dd's byte counts).
pub fn fraction(line: &str) -> Option<f64> {
    let end = line.find("%)").or_else(|| line.find("% complete"))?;
    let head = &line[..end];
    let number = &head[head
        .trim_end_matches(|c: char| c.is_ascii_digit() || c == '.')
        .len()..];
    let p: f64 = number.parse().ok()?;
    (0.0..=100.0).contains(&p).then_some(p / 100.0)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    volume: String,
}

static PROGRESS: LazyLock<Family<Labels, Gauge<f64, AtomicU64>>> = LazyLock::new(Family::default);

pub fn register(registry: &mut Registry) {
    registry.register(
        "volume_copy_progress_ratio",
        "Fraction done of each clone or restore CreateVolume is waiting for",
        PROGRESS.clone(),
    );
}

/// What one read of a copy's claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimRead {
    /// A claim of that name, with this UID.
    Found(String),
    /// No claim of that name.
    Missing,
    /// Not read: no claim named, no Kubernetes API, an error, or not due.
    Unknown,
}

impl ClaimRead {
    /// Whether the claim the copy is for (of UID `expected`, when known) is
    /// gone: no claim of its name, or another claim under it. Nothing will
    /// take the copy then.
    pub fn gone(&self, expected: Option<&str>) -> bool {
        match self {
            Self::Missing => true,
            Self::Found(uid) => expected.is_some_and(|e| e != uid),
            Self::Unknown => false,
        }
    }
}

/// The claim UID a volume name carries: the external-provisioner names a
/// volume `pvc-<claim UID>` (pkg/controller/controller.go makeVolumeName,
/// with the default prefix and `--volume-name-uuid-length`); `None` for any
/// other name, such as another prefix or a UID cut short or without dashes.
pub fn claim_uid_of(volume: &str) -> Option<&str> {
    let uid = volume.strip_prefix("pvc-")?;
    let groups: Vec<&str> = uid.split('-').collect();
    let canonical = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()));
    canonical.then_some(uid)
}

/// One running copy, as this controller has seen it.
#[derive(Debug)]
struct Running {
    started: Instant,
    seen: Instant,
    /// When the claim was last read.
    last_look: Option<Instant>,
    /// The progress of the last event posted.
    last_text: Option<String>,
    /// The claim's UID, once read: events are matched to their object by it
    /// (`kubectl describe` selects on `involvedObject.uid`).
    claim_uid: Option<String>,
}

/// The copies being waited for, by volume name.
#[derive(Debug)]
pub struct Progress {
    running: tokio::sync::Mutex<HashMap<String, Running>>,
    /// How often a running copy's claim is read and an event posted, at most.
    pub event_interval: Duration,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            running: Default::default(),
            event_interval: DEFAULT_EVENT_INTERVAL,
        }
    }
}

impl Progress {
    /// Reads the job's claim now.
    pub async fn read_claim(&self, kube: Option<&Kube>, job: &CopyJob<'_>) -> ClaimRead {
        let (Some(kube), Some(claim)) = (kube, job.claim.as_ref()) else {
            return ClaimRead::Unknown;
        };
        match kube.claim_uid(&claim.namespace, &claim.name).await {
            Ok(Some(uid)) if !uid.is_empty() => ClaimRead::Found(uid),
            Ok(Some(_)) => ClaimRead::Unknown,
            Ok(None) => ClaimRead::Missing,
            Err(e) => {
                tracing::warn!(volume = job.volume, "reading the copy's claim: {e}");
                ClaimRead::Unknown
            }
        }
    }

    /// The copy for `job` (made for the claim of UID `expected`, when
    /// known) is still running at `progress` (a task log line, or what the
    /// controller is doing): the gauge follows; at the first sight and then
    /// once per interval the claim is read, and a Normal event posted on it
    /// when the progress changed. Returns what that read found (`Unknown`
    /// when not due).
    pub async fn copying(
        &self,
        kube: Option<&Kube>,
        job: &CopyJob<'_>,
        progress: &str,
        expected: Option<&str>,
    ) -> ClaimRead {
        let now = Instant::now();
        let mut running = self.running.lock().await;
        running.retain(|volume, r| {
            let keep = now.duration_since(r.seen) < FORGET_AFTER;
            if !keep {
                PROGRESS.remove(&Labels {
                    volume: volume.clone(),
                });
            }
            keep
        });
        let entry = running.entry(job.volume.to_string()).or_insert(Running {
            started: now,
            seen: now,
            last_look: None,
            last_text: None,
            claim_uid: None,
        });
        entry.seen = now;
        if let Some(f) = fraction(progress) {
            PROGRESS
                .get_or_create(&Labels {
                    volume: job.volume.to_string(),
                })
                .set(f);
        }
        if entry
            .last_look
            .is_some_and(|t| now.duration_since(t) < self.event_interval)
        {
            return ClaimRead::Unknown;
        }
        entry.last_look = Some(now);
        let changed = entry.last_text.as_deref() != Some(progress);
        drop(running);
        let read = self.read_claim(kube, job).await;
        let ClaimRead::Found(uid) = &read else {
            return read;
        };
        if read.gone(expected) {
            return read;
        }
        if let Some(r) = self.running.lock().await.get_mut(job.volume) {
            r.claim_uid = Some(uid.clone());
            if changed {
                r.last_text = Some(progress.to_string());
            }
        }
        if changed {
            let message = format!("{} into {}: {progress}", job.what, job.volume);
            tracing::info!(volume = job.volume, "{message}");
            self.post(kube, job, uid, COPYING, &message).await;
        }
        read
    }

    /// The copy for `job` is done: a last Normal event (when the claim saw
    /// the copy run), and its gauge goes.
    pub async fn copied(&self, kube: Option<&Kube>, job: &CopyJob<'_>, bytes: u64) {
        let Some(r) = self.forget(job.volume).await else {
            return;
        };
        let message = format!(
            "{} into {}: done, {} in {} s",
            job.what,
            job.volume,
            human_bytes(bytes),
            r.started.elapsed().as_secs()
        );
        tracing::info!(volume = job.volume, "{message}");
        if let (Some(uid), Some(_)) = (&r.claim_uid, &r.last_text) {
            self.post(kube, job, uid, COPIED, &message).await;
        }
    }

    /// Stops following the copy for `volume`: its gauge goes.
    async fn forget(&self, volume: &str) -> Option<Running> {
        PROGRESS.remove(&Labels {
            volume: volume.to_string(),
        });
        self.running.lock().await.remove(volume)
    }

    /// The copy for `job` is given up (its claim is gone).
    pub async fn abandoned(&self, job: &CopyJob<'_>) {
        self.forget(job.volume).await;
    }

    /// Posts a Normal event on the job's claim. A failure is logged, never
    /// the call's: the copy goes on regardless.
    async fn post(
        &self,
        kube: Option<&Kube>,
        job: &CopyJob<'_>,
        uid: &str,
        reason: &str,
        message: &str,
    ) {
        let (Some(kube), Some(claim)) = (kube, job.claim.as_ref()) else {
            return;
        };
        if let Err(e) = kube
            .claim_event((&claim.namespace, &claim.name), uid, reason, message)
            .await
        {
            tracing::warn!(
                volume = job.volume,
                claim = %format!("{}/{}", claim.namespace, claim.name),
                "posting a {reason} event on the claim: {e}"
            );
        }
    }
}

/// Bytes as Proxmox's task logs write them (`1.5 GiB`).
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_come_from_the_progress_lines_proxmox_writes() {
        assert_eq!(
            fraction("transferred 4.0 GiB of 10.0 GiB (40.00%)"),
            Some(0.4)
        );
        // qemu-server BlockJob.pm monitor.
        assert_eq!(
            fraction("drive-scsi0: transferred 1.0 GiB of 4.0 GiB (25.00%) in 3s"),
            Some(0.25)
        );
        assert_eq!(fraction("Importing image: 42% complete..."), Some(0.42));
        assert_eq!(
            fraction("1073741824 bytes (1.1 GB, 1.0 GiB) copied, 2 s, 537 MB/s"),
            None
        );
        assert_eq!(fraction("transferred 0 B of 1.0 GiB (120.00%)"), None);
        assert_eq!(fraction("task UPID:pve1:… started"), None);
    }

    #[test]
    fn the_claim_comes_from_the_provisioners_extra_metadata() {
        let p: HashMap<String, String> = [
            (PVC_NAME_KEY, "data"),
            (PVC_NAMESPACE_KEY, "apps"),
            ("storage", "local-lvm"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            ClaimRef::from_parameters(&p),
            Some(ClaimRef {
                namespace: "apps".into(),
                name: "data".into()
            })
        );
        let mut without = p.clone();
        without.remove(PVC_NAMESPACE_KEY);
        assert_eq!(ClaimRef::from_parameters(&without), None);
    }

    #[test]
    fn a_claim_is_gone_when_deleted_or_replaced_under_its_name() {
        let uid = "5bc58ec7-1f2a-4c3b-9d8e-0123456789ab";
        let found = ClaimRead::Found(uid.into());
        assert!(!found.gone(Some(uid)));
        assert!(
            !found.gone(None),
            "no UID known: only a missing claim is gone"
        );
        assert!(ClaimRead::Missing.gone(Some(uid)));
        assert!(ClaimRead::Missing.gone(None));
        assert!(
            ClaimRead::Found("0e9d8c7b-6a5f-4e3d-2c1b-a09876543210".into()).gone(Some(uid)),
            "a new claim of the same name is not the one the copy is for"
        );
        assert!(!ClaimRead::Unknown.gone(Some(uid)));
    }

    #[test]
    fn only_a_whole_uid_after_the_default_prefix_is_read_from_a_volume_name() {
        let uid = "5bc58ec7-1f2a-4c3b-9d8e-0123456789ab";
        assert_eq!(claim_uid_of(&format!("pvc-{uid}")), Some(uid));
        assert_eq!(claim_uid_of("pvc-data"), None);
        // --volume-name-prefix=pvc-abc --volume-name-uuid-length=32: the
        // UID without its dashes after another prefix.
        assert_eq!(
            claim_uid_of("pvc-abc-5bc58ec71f2a4c3b9d8e0123456789ab"),
            None
        );
        assert_eq!(
            claim_uid_of("pvc-abc-5bc58ec7-1f2a-4c3b-9d8e-0123456789"),
            None
        );
        assert_eq!(claim_uid_of(&format!("vol-{uid}")), None);
    }

    #[test]
    fn sizes_read_as_in_task_logs() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(10 << 30), "10.0 GiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
    }
}
