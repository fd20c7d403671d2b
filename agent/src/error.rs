//! The node plugin's errors and the one place that turns them into gRPC
//! status codes.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A request field is missing or wrong; names the field.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// hostd answered with an error; its code and message pass through.
    #[error("hostd: {}", .0.message())]
    Hostd(Status),
    #[error("{0}")]
    NotFound(String),
    /// Publish before stage: the spec's FAILED_PRECONDITION.
    #[error("{0}")]
    Unstaged(String),
    #[error("Kubernetes API: {0}")]
    Kubernetes(String),
    #[error("node topology: {0}")]
    Topology(String),
    /// hostd on this node is of a release without something the request
    /// needs.
    #[error(
        "hostd {hostd} on this node cannot {what}; this node plugin is {}: upgrade hostd (on Talos the proxmox-csi-hostd extension, with the node's image) to {} or later",
        env!("CARGO_PKG_VERSION"),
        env!("CARGO_PKG_VERSION")
    )]
    HostdLacks { hostd: String, what: String },
    /// hostd speaks another API version than this node plugin.
    #[error(
        "hostd {hostd} on this node serves API version {api}, this node plugin ({}) speaks version {}: install matching releases (docs/versioning.md)",
        env!("CARGO_PKG_VERSION"),
        proxmox_csi_common::hostd_api::API_VERSION
    )]
    HostdApi { hostd: String, api: u32 },
}

impl AgentError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::Invalid { .. } => Status::invalid_argument(e.to_string()),
            // hostd's codes already follow the CSI spec; keep its message as is.
            AgentError::Hostd(s) => Status::new(s.code(), s.message().to_string()),
            AgentError::NotFound(_) => Status::not_found(e.to_string()),
            AgentError::Kubernetes(_) => Status::unavailable(e.to_string()),
            AgentError::Topology(_)
            | AgentError::Unstaged(_)
            | AgentError::HostdLacks { .. }
            | AgentError::HostdApi { .. } => Status::failed_precondition(e.to_string()),
        }
    }
}

/// hostd is down or restarting: retryable, said plainly. A call hostd does
/// not implement: a hostd of an older release.
pub fn hostd_status(s: Status) -> AgentError {
    if s.code() == Code::Unimplemented {
        return AgentError::HostdLacks {
            hostd: "of an older release".into(),
            what: format!("serve this call ({})", s.message()),
        };
    }
    if s.code() == Code::Unavailable && s.message().contains("onnect") {
        AgentError::Hostd(Status::unavailable(format!(
            "hostd is not reachable ({}); is the proxmox-csi-hostd service running on this node?",
            s.message()
        )))
    } else {
        AgentError::Hostd(s)
    }
}
