//! A coalescing queue: jobs are queued by key (a VM), and each key's worker
//! takes what has gathered as one batch, so that the changes of a burst are
//! written to a VM in one config update (as aws-ebs-csi-driver's coalescer
//! merges the modifications of one volume).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};

/// How long a worker goes on gathering after a job, while more keep coming:
/// each within `gap` of the last, for at most `max` in all.
#[derive(Debug, Clone, Copy)]
pub struct Gather {
    pub gap: Duration,
    pub max: Duration,
}

/// Per-key queues, each drained by a worker of its own.
pub struct Coalescer<K, J> {
    queues: Mutex<HashMap<K, mpsc::UnboundedSender<J>>>,
}

impl<K, J> Default for Coalescer<K, J> {
    fn default() -> Self {
        Self {
            queues: Mutex::default(),
        }
    }
}

impl<K: Eq + Hash + Clone, J> Coalescer<K, J> {
    /// Queues `job` for `key`. A key without a live worker (the first job,
    /// or a worker that ended) gets one from `spawn`, which is handed the
    /// worker's end of the queue.
    pub async fn push(&self, key: K, job: J, spawn: impl FnOnce(mpsc::UnboundedReceiver<J>)) {
        let mut queues = self.queues.lock().await;
        let job = match queues.get(&key) {
            Some(sender) => match sender.send(job) {
                Ok(()) => return,
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        spawn(receiver);
        // The receiver is alive: it was just handed to the new worker.
        let _ = sender.send(job);
        queues.insert(key, sender);
    }
}

/// `batch` and every job that follows within `gather.gap` of the last,
/// for at most `gather.max`, then whatever is queued already.
pub async fn gather<J>(
    mut batch: Vec<J>,
    rx: &mut mpsc::UnboundedReceiver<J>,
    gather: Gather,
) -> Vec<J> {
    let until = tokio::time::Instant::now() + gather.max;
    loop {
        let gap = gather
            .gap
            .min(until.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(gap, rx.recv()).await {
            Ok(Some(j)) => batch.push(j),
            Ok(None) | Err(_) => break,
        }
    }
    batch.extend(backlog(rx));
    batch
}

/// Every job queued already, without waiting.
pub fn backlog<J>(rx: &mut mpsc::UnboundedReceiver<J>) -> Vec<J> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next batch of a worker's queue: the first job to come, then
    /// [`gather`]. `None` once the queue is closed and empty.
    async fn next_batch<J>(rx: &mut mpsc::UnboundedReceiver<J>, gather: Gather) -> Option<Vec<J>> {
        let first = rx.recv().await?;
        Some(super::gather(vec![first], rx, gather).await)
    }

    const GATHER: Gather = Gather {
        gap: Duration::from_millis(30),
        max: Duration::from_millis(150),
    };

    /// Sends `0..n`, one every `every`.
    fn arrivals(tx: mpsc::UnboundedSender<u32>, n: u32, every: Duration) {
        tokio::spawn(async move {
            for i in 0..n {
                let _ = tx.send(i);
                tokio::time::sleep(every).await;
            }
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_within_the_gap_is_one_batch() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        arrivals(tx, 5, Duration::from_millis(20));
        assert_eq!(next_batch(&mut rx, GATHER).await, Some(vec![0, 1, 2, 3, 4]));
        assert_eq!(next_batch(&mut rx, GATHER).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_longer_than_the_gap_starts_the_next_batch() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        arrivals(tx, 3, Duration::from_millis(40));
        for i in 0..3 {
            assert_eq!(next_batch(&mut rx, GATHER).await, Some(vec![i]));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_is_cut_at_the_maximum() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        arrivals(tx, 40, Duration::from_millis(7));
        let first = next_batch(&mut rx, GATHER).await.unwrap_or_default();
        // 0 ms, then one every 7 ms up to 147 ms.
        assert_eq!(first, (0..=21).collect::<Vec<_>>());
        let second = next_batch(&mut rx, GATHER).await.unwrap_or_default();
        assert_eq!(second, (22..40).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn jobs_queued_already_start_the_batch_and_are_all_kept() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 0..3 {
            let _ = tx.send(i);
        }
        let waiting = backlog(&mut rx);
        assert_eq!(waiting, [0, 1, 2]);
        arrivals(tx, 2, Duration::from_millis(10));
        assert_eq!(gather(waiting, &mut rx, GATHER).await, [0, 1, 2, 0, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn each_key_has_one_worker_and_a_dead_one_is_replaced() {
        let coalescer: Coalescer<&str, u32> = Coalescer::default();
        let spawned = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (done_tx, mut done) = mpsc::unbounded_channel();
        let spawn = |mut rx: mpsc::UnboundedReceiver<u32>| {
            spawned.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                while let Some(batch) = next_batch(&mut rx, GATHER).await {
                    let _ = done_tx.send(batch);
                }
            });
        };
        coalescer.push("vm-1", 1, spawn).await;
        coalescer.push("vm-1", 2, spawn).await;
        coalescer.push("vm-2", 3, spawn).await;
        let mut batches = vec![done.recv().await, done.recv().await];
        batches.sort();
        assert_eq!(batches, vec![Some(vec![1, 2]), Some(vec![3])]);
        assert_eq!(spawned.load(std::sync::atomic::Ordering::SeqCst), 2);
        // A worker that ended (its receiver dropped) is replaced.
        let dead = |rx: mpsc::UnboundedReceiver<u32>| drop(rx);
        coalescer.push("vm-3", 4, dead).await;
        coalescer.push("vm-3", 5, spawn).await;
        assert_eq!(done.recv().await, Some(vec![5]));
        assert_eq!(spawned.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
