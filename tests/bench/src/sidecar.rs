//! The external-attacher as it sends ControllerPublish calls, for the
//! bursts of `sidecar_burst`: a work queue of VolumeAttachments drained by
//! a fixed number of workers, a deadline per call, and a per-item
//! exponential backoff after a failure.
//!
//! Each figure is the attacher's default, from kubernetes-csi/external-attacher:
//! - `--worker-threads` 10 (cmd/csi-attacher/main.go): at most 10 calls in
//!   flight;
//! - `--timeout` 15 s (main.go; `csiAttach` in pkg/controller/csi_handler.go
//!   wraps each ControllerPublish in `context.WithTimeout`);
//! - `--retry-interval-start` 1 s and `--retry-interval-max` 5 min
//!   (main.go, `NewTypedItemExponentialFailureRateLimiter`): a failed item
//!   is queued again after 1 s, 2 s, 4 s … (`SyncNewOrUpdatedVolumeAttachment`
//!   `AddRateLimited`);
//! - the queue hands items out in the order they were added (client-go
//!   workqueue), one worker each.
//!
//! After a successful call the attacher writes the VolumeAttachment's
//! status before its worker takes the next item; that write is a
//! Kubernetes API call, not modelled here (it costs the same for every
//! driver).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use tokio::sync::{Mutex, Notify};

/// The attacher's settings.
#[derive(Debug, Clone, Copy)]
pub struct Attacher {
    pub workers: usize,
    pub timeout: Duration,
    pub retry_start: Duration,
    pub retry_max: Duration,
}

impl Default for Attacher {
    fn default() -> Self {
        Self {
            workers: 10,
            timeout: Duration::from_secs(15),
            retry_start: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
        }
    }
}

/// What a run cost the attacher.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Run {
    /// From the first VolumeAttachment to the last one attached.
    pub seconds: f64,
    /// Calls that failed (an error or the deadline) and were queued again.
    pub retries: u64,
    /// The largest number of calls in flight at once.
    pub in_flight: usize,
}

struct Queue {
    items: VecDeque<usize>,
    /// Items not attached yet, queued or in flight or backing off.
    left: usize,
}

/// Sends `requests[i]` once `arrivals[i]` has passed (from the start),
/// through the attacher's workers, until every one succeeded.
pub async fn publish_all(
    ctl: &ControllerService,
    attacher: Attacher,
    requests: Vec<csi::ControllerPublishVolumeRequest>,
    arrivals: &[Duration],
) -> Result<Run> {
    anyhow::ensure!(requests.len() == arrivals.len(), "one arrival per request");
    let started = Instant::now();
    let queue = Arc::new(Mutex::new(Queue {
        items: VecDeque::new(),
        left: requests.len(),
    }));
    let wake = Arc::new(Notify::new());
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| arrivals[i]);
    let feeder = {
        let (queue, wake) = (queue.clone(), wake.clone());
        let arrivals = arrivals.to_vec();
        tokio::spawn(async move {
            for i in order {
                tokio::time::sleep_until((started + arrivals[i]).into()).await;
                queue.lock().await.items.push_back(i);
                wake.notify_waiters();
            }
        })
    };
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let retries = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let requests = Arc::new(requests);
    let workers = (0..attacher.workers).map(|_| {
        let (queue, wake, requests) = (queue.clone(), wake.clone(), requests.clone());
        let (in_flight, peak, retries) = (in_flight.clone(), peak.clone(), retries.clone());
        let ctl = ctl.clone();
        tokio::spawn(async move {
            let mut failures = std::collections::HashMap::<usize, u32>::new();
            loop {
                let next = {
                    let notified = wake.notified();
                    let mut q = queue.lock().await;
                    if q.left == 0 {
                        return;
                    }
                    match q.items.pop_front() {
                        Some(i) => Some(i),
                        None => {
                            drop(q);
                            // Woken by an arrival or a requeue; the timeout
                            // covers a wake between the check and the wait.
                            let _ = tokio::time::timeout(Duration::from_millis(5), notified).await;
                            None
                        }
                    }
                };
                let Some(i) = next else { continue };
                let now = in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                let mut req = tonic::Request::new(requests[i].clone());
                req.set_timeout(attacher.timeout);
                let ok = matches!(
                    tokio::time::timeout(attacher.timeout, ctl.controller_publish_volume(req))
                        .await,
                    Ok(Ok(_))
                );
                in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                if ok {
                    queue.lock().await.left -= 1;
                    wake.notify_waiters();
                    continue;
                }
                retries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let n = failures.entry(i).or_default();
                let backoff = attacher
                    .retry_start
                    .saturating_mul(1 << (*n).min(16))
                    .min(attacher.retry_max);
                *n += 1;
                let (queue, wake) = (queue.clone(), wake.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(backoff).await;
                    queue.lock().await.items.push_back(i);
                    wake.notify_waiters();
                });
            }
        })
    });
    for w in futures::future::join_all(workers).await {
        w?;
    }
    feeder.await?;
    Ok(Run {
        seconds: started.elapsed().as_secs_f64(),
        retries: retries.load(std::sync::atomic::Ordering::SeqCst),
        in_flight: peak.load(std::sync::atomic::Ordering::SeqCst),
    })
}

/// Proxmox's floor for these arrivals through the attacher's workers: each
/// call is answered the moment its own disk is plugged (an ideal driver),
/// its VM plugs one disk after another (`per_disk`), and each call costs
/// the POST and one task status read (`api` each). Workers take the items
/// in arrival order. In seconds from the first arrival.
pub fn floor(
    workers: usize,
    arrivals: &[Duration],
    vms: &[u32],
    per_disk: Duration,
    api: Duration,
) -> f64 {
    let mut order: Vec<usize> = (0..arrivals.len()).collect();
    order.sort_by_key(|&i| arrivals[i]);
    let mut free = vec![Duration::ZERO; workers.max(1)];
    let mut vm_free = std::collections::HashMap::<u32, Duration>::new();
    let mut last = Duration::ZERO;
    for i in order {
        // The worker free soonest takes the next item.
        let w = (0..free.len()).min_by_key(|&w| free[w]).unwrap_or(0);
        let start = free[w].max(arrivals[i]);
        let vm = vm_free.entry(vms[i]).or_default();
        let plugged = (start + api).max(*vm) + per_disk;
        *vm = plugged;
        let done = plugged + api;
        free[w] = done;
        last = last.max(done);
    }
    let first = arrivals.iter().min().copied().unwrap_or_default();
    (last - first).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_floor_of_a_burst_on_one_vm_is_its_disks_in_turn() {
        let at = vec![Duration::ZERO; 24];
        let f = floor(10, &at, &[200; 24], MS(300), MS(20));
        assert!((f - 7.24).abs() < 1e-9, "{f}");
    }

    #[test]
    fn the_floor_of_many_vms_is_bound_by_the_workers() {
        // 30 VMs x 4, VM after VM: 10 workers on 3 VMs at a time.
        let at = vec![Duration::ZERO; 120];
        let vms: Vec<u32> = (0..120).map(|i| 200 + i / 4).collect();
        let bound = floor(10, &at, &vms, MS(300), MS(20));
        let unbounded = floor(120, &at, &vms, MS(300), MS(20));
        assert!((unbounded - 1.24).abs() < 1e-9, "{unbounded}");
        assert!(bound > 4.0 * unbounded, "{bound}");
    }

    #[test]
    fn a_late_arrival_waits_for_nothing_but_its_own_disk() {
        let at = [MS(0), MS(5000)];
        let f = floor(10, &at, &[200, 200], MS(300), MS(20));
        assert!((f - 5.34).abs() < 1e-9, "{f}");
    }
}
