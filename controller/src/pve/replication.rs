//! Proxmox's storage replication jobs (`/cluster/replication`) and the
//! offline migration that moves a replicated guest to its replica.

use reqwest::Method;
use serde::Deserialize;

use super::client::{Client, Deadline, PveError};

/// A replication job, as `GET /cluster/replication` lists it.
#[derive(Debug, Deserialize)]
pub struct ReplicationJob {
    pub id: String,
    /// Proxmox answers it as a JSON string (the parser makes it a hash
    /// key: pve-guest-common src/PVE/ReplicationConfig.pm); a number too.
    #[serde(default, deserialize_with = "number_or_string")]
    pub guest: u32,
    #[serde(default)]
    pub target: String,
    /// Set while the job is being removed (`full`: with its replicas).
    #[serde(default)]
    pub remove_job: Option<String>,
}

fn number_or_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| serde::de::Error::custom("not a VMID")),
        serde_json::Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        other => Err(serde::de::Error::custom(format!("not a VMID: {other}"))),
    }
}

/// A new local replication job (`POST /cluster/replication`, type `local`).
#[derive(Debug, Clone)]
pub struct NewReplicationJob<'a> {
    /// `<guest>-<n>`.
    pub id: &'a str,
    pub target: &'a str,
    pub schedule: &'a str,
    pub comment: &'a str,
}

impl Client {
    pub async fn replication_jobs(&self, d: Deadline) -> Result<Vec<ReplicationJob>, PveError> {
        self.call(Method::GET, "/cluster/replication", &[], d).await
    }

    pub async fn create_replication_job(
        &self,
        job: &NewReplicationJob<'_>,
        d: Deadline,
    ) -> Result<(), PveError> {
        let form = [
            ("id", job.id.to_string()),
            ("type", "local".to_string()),
            ("target", job.target.to_string()),
            ("schedule", job.schedule.to_string()),
            ("comment", job.comment.to_string()),
        ];
        self.call::<Option<serde_json::Value>>(Method::POST, "/cluster/replication", &form, d)
            .await
            .map(drop)
    }

    /// Marks job `id` for removal with its replicas; Proxmox's scheduler
    /// removes it within a minute.
    pub async fn delete_replication_job(&self, id: &str, d: Deadline) -> Result<(), PveError> {
        let path = format!("/cluster/replication/{id}");
        self.call::<Option<serde_json::Value>>(Method::DELETE, &path, &[], d)
            .await
            .map(drop)
    }

    /// Starts the offline migration of VM `vmid` from `node` to `target`;
    /// its task's UPID.
    pub async fn migrate_offline(
        &self,
        node: &str,
        vmid: u32,
        target: &str,
        d: Deadline,
    ) -> Result<String, PveError> {
        let path = format!("/nodes/{node}/qemu/{vmid}/migrate");
        let form = [("target", target.to_string()), ("online", "0".to_string())];
        self.call(Method::POST, &path, &form, d).await
    }
}
