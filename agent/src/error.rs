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
            AgentError::Topology(_) | AgentError::Unstaged(_) => {
                Status::failed_precondition(e.to_string())
            }
        }
    }
}

/// hostd is down or restarting: retryable, said plainly.
pub fn hostd_status(s: Status) -> AgentError {
    if s.code() == Code::Unavailable && s.message().contains("onnect") {
        AgentError::Hostd(Status::unavailable(format!(
            "hostd is not reachable ({}); is the proxmox-csi-hostd service running on this node?",
            s.message()
        )))
    } else {
        AgentError::Hostd(s)
    }
}
