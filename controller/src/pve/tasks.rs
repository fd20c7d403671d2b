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
        let node = upid_node(upid).ok_or_else(|| PveError::Task {
            region: self.region().to_string(),
            upid: upid.to_string(),
            exitstatus: "not a UPID".into(),
        })?;
        let path = format!("/nodes/{node}/tasks/{upid}/status");
        let mut wait = Duration::from_millis(20);
        loop {
            let st: TaskStatus = self.call(Method::GET, &path, &[], deadline).await?;
            if st.status != "running" {
                let exit = st.exitstatus.unwrap_or_default();
                if exit == "OK" || exit.starts_with("WARNINGS") {
                    return Ok(());
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
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(250));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::upid_node;

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
