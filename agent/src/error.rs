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
///
/// Which is which is read from the status's origin, not its wording: a
/// status hostd sent is decoded from its answer and has no source, while
/// one tonic made because no answer came (it could not connect, or the
/// connection broke) keeps the transport error as its source (tonic
/// src/status.rs try_from_error: a ConnectError becomes Unavailable).
pub fn hostd_status(s: Status) -> AgentError {
    if s.code() == Code::Unimplemented {
        return AgentError::HostdLacks {
            hostd: "of an older release".into(),
            what: format!("serve this call ({})", s.message()),
        };
    }
    let unanswered = std::error::Error::source(&s).is_some();
    if s.code() == Code::Unavailable && unanswered {
        AgentError::Hostd(Status::unavailable(format!(
            "hostd is not reachable ({}); is the proxmox-csi-hostd service running on this node?",
            s.message()
        )))
    } else {
        AgentError::Hostd(s)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proxmox_csi_proto::hostd::v1::HealthRequest;

    use super::*;

    #[tokio::test]
    async fn hostd_down_is_said_plainly_and_hostds_own_answers_pass_through() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let mut client = crate::hostd::connect(socket, Duration::from_secs(2));
        let down = client.health(HealthRequest {}).await.unwrap_err();
        let AgentError::Hostd(s) = hostd_status(down) else {
            panic!("not a hostd error");
        };
        assert_eq!(s.code(), Code::Unavailable);
        assert!(
            s.message().starts_with("hostd is not reachable ("),
            "{}",
            s.message()
        );
        // hostd's own Unavailable, whatever its words, is hostd's answer.
        let said = Status::unavailable("connect the disk first: no device yet");
        let AgentError::Hostd(s) = hostd_status(said) else {
            panic!("not a hostd error");
        };
        assert_eq!(s.message(), "connect the disk first: no device yet");
    }
}
