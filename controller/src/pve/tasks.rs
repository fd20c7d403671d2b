//! Waiting for UPID tasks: polls that start fast (20 ms) and slow down to
//! 250 ms, stop at the deadline, and always check the exit status. (A
//! hot-plug of N disks lasts N times a plug, a second or a few; polling at
//! 1 s would add most of a second to each such task to save a few reads.)

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;

use super::client::{Client, Deadline, PveError};

#[derive(Debug, Clone, Deserialize)]
pub struct TaskStatus {
    pub status: String,
    #[serde(default)]
    pub exitstatus: Option<String>,
}

/// The node a UPID belongs to: its status is served there.
pub fn upid_node(upid: &str) -> Option<&str> {
    let mut parts = upid.split(':');
    (parts.next() == Some("UPID"))
        .then(|| parts.next())
        .flatten()
}

/// When the task a UPID names started (Unix seconds, the UPID's 5th field
/// in hex: pve-common src/PVE/UPID.pm create).
pub fn upid_started(upid: &str) -> Option<i64> {
    i64::from_str_radix(upid.split(':').nth(4)?, 16).ok()
}

#[derive(Debug, Clone, Deserialize)]
struct LogLine {
    #[serde(default)]
    t: String,
}

/// Where a task stands, without waiting for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    /// Still running; the last progress line of its log, if any.
    Running(Option<String>),
    Done,
    Failed(String),
}

/// A progress line of a task log: import-from's and the live mirror's
/// `transferred X of Y (NN.NN%)` (qemu-server QemuServer/QemuImage.pm
/// convert, QemuServer/BlockJob.pm monitor), dd's `N bytes (…) copied, …`
/// relayed by storage_migrate for offline migrations (pve-storage Storage.pm),
/// rbd export's `NN% complete`.
pub fn is_progress(line: &str) -> bool {
    line.starts_with("transferred ")
        || line.contains(": transferred ")
        || (line.contains(" bytes (") && line.contains(" copied, "))
        || line.contains("% complete")
}

impl Client {
    /// One look at `upid`: running (with its latest `transferred …` line),
    /// done, or failed with Proxmox's exit status.
    pub async fn task_state(&self, upid: &str, deadline: Deadline) -> Result<TaskState, PveError> {
        let node = upid_node(upid).unwrap_or_default();
        let st: TaskStatus = self
            .call(
                Method::GET,
                &format!("/nodes/{node}/tasks/{upid}/status"),
                &[],
                deadline,
            )
            .await?;
        if st.status != "running" {
            let exit = st.exitstatus.unwrap_or_default();
            return Ok(if exit == "OK" || exit.starts_with("WARNINGS") {
                TaskState::Done
            } else {
                TaskState::Failed(exit)
            });
        }
        let log: Vec<LogLine> = self
            .call(
                Method::GET,
                &format!("/nodes/{node}/tasks/{upid}/log"),
                &[("limit", "0".to_string())],
                deadline,
            )
            .await?;
        Ok(TaskState::Running(
            log.into_iter()
                .rev()
                .find(|l| is_progress(&l.t))
                .map(|l| l.t),
        ))
    }

    /// Waits for `upid` to stop. `OK` and `WARNINGS: n` succeed; anything
    /// else is `PveError::Task` with Proxmox's text.
    pub async fn wait_task(&self, upid: &str, deadline: Deadline) -> Result<(), PveError> {
        self.wait_task_expecting(upid, None, deadline)
            .await
            .map(|_| ())
    }

    /// `wait_task` for a task expected to last about `expect`: the polls
    /// gather around that time (`Polls`). How it was seen to end.
    pub async fn wait_task_expecting(
        &self,
        upid: &str,
        expect: Option<Duration>,
        deadline: Deadline,
    ) -> Result<TaskSeen, PveError> {
        let started = tokio::time::Instant::now();
        let mut last_running = None;
        let node = upid_node(upid).ok_or_else(|| PveError::Task {
            region: self.region().to_string(),
            upid: upid.to_string(),
            exitstatus: "not a UPID".into(),
        })?;
        let path = format!("/nodes/{node}/tasks/{upid}/status");
        let mut polls = Polls::new(expect);
        let mut wait = polls.next_wait();
        if expect.is_some() {
            // The first look comes when the schedule says, not at once.
            tokio::time::sleep(wait.min(deadline.remaining())).await;
            wait = polls.next_wait();
        }
        loop {
            let st: TaskStatus = self.call(Method::GET, &path, &[], deadline).await?;
            if st.status != "running" {
                let exit = st.exitstatus.unwrap_or_default();
                if exit == "OK" || exit.starts_with("WARNINGS") {
                    return Ok(TaskSeen {
                        running_at: last_running,
                        ended_by: started.elapsed(),
                    });
                }
                return Err(PveError::Task {
                    region: self.region().to_string(),
                    upid: upid.to_string(),
                    exitstatus: exit,
                });
            }
            if deadline.remaining() <= wait {
                return Err(PveError::Deadline {
                    region: self.region().to_string(),
                    what: format!("task {upid}"),
                    last: "still running".into(),
                });
            }
            last_running = Some(started.elapsed());
            tokio::time::sleep(wait).await;
            wait = polls.next_wait();
        }
    }
}

/// When a task was seen to end, from the start of the wait: between the
/// last answer that said it was running (none: the first look found it
/// over) and the answer that said it had ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSeen {
    pub running_at: Option<Duration>,
    pub ended_by: Duration,
}

/// The waits between a task's status polls. Without an expectation: 20 ms,
/// then doubling to 250 ms. With one (a hot-plug whose VM's pace is known,
/// `attach::pace`): a look every second while the task is not due (a task
/// that fails early is seen failing within a second), one a little before
/// it is due, then a look every 20 ms until a while after, then doubling to
/// 250 ms again: a task seen ending 20 ms late instead of up to 250 ms, for
/// a few looks more around its end.
#[derive(Debug, Clone)]
pub struct Polls {
    elapsed: Duration,
    /// When the look just before the expected end is due.
    due: Option<Duration>,
    /// Poll every `DENSE` until this much has passed; then back off.
    dense_until: Duration,
    backoff: Duration,
}

const DENSE: Duration = Duration::from_millis(20);
const SPARSE: Duration = Duration::from_secs(1);
const SLOWEST: Duration = Duration::from_millis(250);

impl Polls {
    pub fn new(expect: Option<Duration>) -> Self {
        let (due, dense_until) = match expect {
            Some(e) => {
                // Early by a twentieth (20–100 ms), dense until a quarter
                // later (100 ms – 1 s): a pace that drifts costs looks, not
                // a late answer.
                let early = (e / 20).clamp(DENSE, Duration::from_millis(100));
                let late = (e / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
                (Some(e.saturating_sub(early).max(DENSE)), e + late)
            }
            None => (None, Duration::ZERO),
        };
        Self {
            elapsed: Duration::ZERO,
            dense_until,
            // Past the dense looks, the backoff goes on from there.
            backoff: if due.is_some() { DENSE * 2 } else { DENSE },
            due,
        }
    }

    /// The wait before the next poll.
    pub fn next_wait(&mut self) -> Duration {
        let wait = match self.due {
            Some(due) => {
                let left = due.saturating_sub(self.elapsed);
                if left > SPARSE {
                    SPARSE
                } else {
                    self.due = None;
                    left.max(DENSE)
                }
            }
            None if self.elapsed < self.dense_until => DENSE,
            None => {
                let w = self.backoff;
                self.backoff = (self.backoff * 2).min(SLOWEST);
                w
            }
        };
        self.elapsed += wait;
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::{Polls, upid_node};
    use std::time::Duration;

    fn ms(mut polls: Polls, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| polls.next_wait().as_millis() as u64)
            .collect()
    }

    #[test]
    fn without_an_expectation_polls_double_to_a_quarter_second() {
        assert_eq!(ms(Polls::new(None), 7), [20, 40, 80, 160, 250, 250, 250]);
    }

    #[test]
    fn an_expected_task_is_polled_densely_around_its_end() {
        // 300 ms expected: first look at 280 ms, then every 20 ms until
        // 400 ms, then backing off.
        let waits = ms(Polls::new(Some(Duration::from_millis(300))), 9);
        assert_eq!(waits, [280, 20, 20, 20, 20, 20, 20, 40, 80]);
        // 7.2 s (24 disks): a look every second, the last 100 ms early,
        // dense for a second after.
        let mut long = Polls::new(Some(Duration::from_millis(7200)));
        let sparse: Vec<u64> = (0..8)
            .map(|_| long.next_wait().as_millis() as u64)
            .collect();
        assert_eq!(sparse, [1000, 1000, 1000, 1000, 1000, 1000, 1000, 100]);
        let dense = std::iter::from_fn(|| Some(long.next_wait()))
            .take_while(|w| *w == Duration::from_millis(20))
            .count();
        assert_eq!(dense, 55);
        // A tiny expectation never waits under one poll.
        assert_eq!(ms(Polls::new(Some(Duration::from_millis(5))), 2), [20, 20]);
    }

    #[test]
    fn finds_the_start_of_a_upid() {
        assert_eq!(
            super::upid_started("UPID:pve2:0003A1F2:01B665C6:6B0C4CAF:qmconfig:112:root@pam:"),
            Some(0x6B0C4CAF)
        );
        assert_eq!(super::upid_started("nope"), None);
    }

    #[test]
    fn finds_the_node_of_a_upid() {
        assert_eq!(
            upid_node("UPID:pve2:0003A1F2:01B665C6:6B0C4CAF:qmconfig:112:root@pam:"),
            Some("pve2")
        );
        assert_eq!(upid_node("nope"), None);
    }
}
