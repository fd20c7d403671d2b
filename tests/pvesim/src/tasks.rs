//! Worker tasks: UPIDs, status, logs.

use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub upid: String,
    pub node: String,
    pub kind: String,
    pub id: String,
    pub user: String,
    pub pid: u32,
    pub pstart: u64,
    pub starttime: u64,
    /// `None` while running; the exit status once stopped.
    pub exitstatus: Option<String>,
    pub log: Vec<String>,
}

static NEXT_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0x3A1F2);

impl Task {
    pub fn new(node: &str, kind: &str, id: &str, user: &str) -> Self {
        let pid = NEXT_PID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let starttime = crate::clock::now();
        let pstart = 0x01B2_C3D4 + u64::from(pid);
        let upid =
            format!("UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{kind}:{id}:{user}:");
        Self {
            upid,
            node: node.into(),
            kind: kind.into(),
            id: id.into(),
            user: user.into(),
            pid,
            pstart,
            starttime,
            exitstatus: None,
            log: Vec::new(),
        }
    }

    /// Ends the task: `Ok` → `TASK OK`; `Err(text)` → `TASK ERROR: text`,
    /// with newlines turned into spaces as Proxmox does.
    pub fn finish(&mut self, result: Result<(), String>) {
        match result {
            // log_warn's lines make a task that ends well end with
            // "WARNINGS: n" (pve-common RESTEnvironment.pm fork_worker).
            Ok(()) => {
                let warnings = self.log.iter().filter(|l| l.starts_with("WARN: ")).count();
                if warnings == 0 {
                    self.log.push("TASK OK".into());
                    self.exitstatus = Some("OK".into());
                } else {
                    self.log.push(format!("TASK WARNINGS: {warnings}"));
                    self.exitstatus = Some(format!("WARNINGS: {warnings}"));
                }
            }
            Err(e) => {
                let text = e.trim_end_matches('\n').replace('\n', " ");
                self.log.push(format!("TASK ERROR: {text}"));
                self.exitstatus = Some(text);
            }
        }
    }

    pub fn status_json(&self) -> Value {
        let mut v = json!({
            "upid": self.upid,
            "node": self.node,
            "pid": self.pid,
            "pstart": self.pstart,
            "starttime": self.starttime,
            "type": self.kind,
            "id": self.id,
            "status": if self.exitstatus.is_some() { "stopped" } else { "running" },
        });
        match self.user.split_once('!') {
            Some((u, t)) => {
                v["user"] = json!(u);
                v["tokenid"] = json!(t);
            }
            None => v["user"] = json!(self.user),
        }
        if let Some(e) = &self.exitstatus {
            v["exitstatus"] = json!(e);
        }
        v
    }
}

/// Checks a UPID's syntax; returns its node.
pub fn parse_upid(upid: &str) -> Option<String> {
    let re = regex::Regex::new(
        r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$",
    )
    .ok()?;
    re.captures(upid).map(|c| c[1].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upids_have_proxmox_syntax() {
        let t = Task::new("pve1", "qmconfig", "100", "kubernetes-csi@pve!csi");
        assert_eq!(parse_upid(&t.upid).as_deref(), Some("pve1"), "{}", t.upid);
        assert!(t.upid.ends_with(":qmconfig:100:kubernetes-csi@pve!csi:"));
        let e = Task::new("pve1", "imgdel", "", "root@pam");
        assert!(
            parse_upid(&e.upid).is_some(),
            "empty id allowed: {}",
            e.upid
        );
        assert_eq!(parse_upid("UPID:bad"), None);
    }

    #[test]
    fn errors_are_one_line_in_the_log() {
        let mut t = Task::new("pve1", "qmconfig", "100", "root@pam");
        t.finish(Err(
            "400 Parameter verification failed.\nscsi1: hotplug problem - x\n".into(),
        ));
        assert_eq!(
            t.exitstatus.as_deref(),
            Some("400 Parameter verification failed. scsi1: hotplug problem - x")
        );
        assert_eq!(t.status_json()["status"], "stopped");
    }
}
