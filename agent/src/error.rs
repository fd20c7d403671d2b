//! The node plugin's errors and the one place that turns them into gRPC
//! status codes.
//!
//! An error that wraps another (hostd's answer, a Kubernetes API error, a
//! publish context the node cannot take) keeps it whole as its `#[source]`:
//! callers decide on its kind or its code, never on its text. Each
//! variant's `Display` already holds the words of its source (the text
//! kubelet has always read), so the crate prints `Display` only
//! (`From<AgentError> for Status`, the start error's log line) and never
//! walks the chain again.

use std::fmt::Display;

use proxmox_csi_common::contract::ContextError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A request field is missing or wrong; names the field.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// The publish context is not one the node can take.
    #[error("{field}: {0}", field = .0.field())]
    InvalidContext(#[source] ContextError),
    /// hostd answered with an error; its code and message pass through.
    #[error("hostd: {}", .0.message())]
    Hostd(#[source] Status),
    /// No answer came from hostd: it could not be reached, or the
    /// connection broke. Retryable, said plainly.
    #[error(
        "hostd is not reachable ({}); is the proxmox-csi-hostd service running on this node?",
        .0.message()
    )]
    HostdUnreachable(#[source] Status),
    /// A `volume_path` that could not hold a volume of ours: the spec's
    /// NOT_FOUND, with why the path is not one (an [`AgentError`], boxed as
    /// `dyn Error` so that `source()` downcasts to it, not to its box).
    #[error("no volume is published at {path:?}: {source}")]
    NoVolumeAt {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// hostd holds no volume at `volume_path` (its FAILED_PRECONDITION):
    /// the spec's NOT_FOUND.
    #[error("volume_path {path}: {}", .source.message())]
    NothingAt {
        path: String,
        #[source]
        source: Status,
    },
    /// Publish before stage: the spec's FAILED_PRECONDITION.
    #[error("{0}")]
    Unstaged(String),
    #[error("Kubernetes API: {what}: {source}")]
    Kubernetes {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("node topology: {0}")]
    Topology(String),
    /// hostd on this node is of a release without something the request
    /// needs.
    #[error("{}", upgrade(hostd, what))]
    HostdLacks { hostd: String, what: String },
    /// hostd does not implement the call at all: a release older than
    /// the Health capabilities.
    #[error("{}", upgrade("of an older release", format_args!("serve this call ({})", .0.message())))]
    HostdOlder(#[source] Status),
    /// hostd speaks another API version than this node plugin.
    #[error(
        "hostd {hostd} on this node serves API version {api}, this node plugin ({}) speaks version {}: install matching releases (docs/versioning.md)",
        env!("CARGO_PKG_VERSION"),
        proxmox_csi_common::hostd_api::API_VERSION
    )]
    HostdApi { hostd: String, api: u32 },
}

/// What a hostd that lacks something is told to do.
fn upgrade(hostd: &str, what: impl Display) -> String {
    format!(
        "hostd {hostd} on this node cannot {what}; this node plugin is {}: upgrade hostd (on Talos the proxmox-csi-hostd extension, with the node's image) to {} or later",
        env!("CARGO_PKG_VERSION"),
        env!("CARGO_PKG_VERSION")
    )
}

impl AgentError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Self::Invalid { .. } | Self::InvalidContext(_) => Code::InvalidArgument,
            // hostd's codes already follow the CSI spec.
            Self::Hostd(s) => s.code(),
            Self::HostdUnreachable(_) | Self::Kubernetes { .. } => Code::Unavailable,
            Self::NoVolumeAt { .. } | Self::NothingAt { .. } => Code::NotFound,
            Self::Topology(_)
            | Self::Unstaged(_)
            | Self::HostdLacks { .. }
            | Self::HostdOlder(_)
            | Self::HostdApi { .. } => Code::FailedPrecondition,
        }
    }
}

/// The one mapping to gRPC: the code, and the `Display` (see the module
/// doc); hostd's own answer passes through with its message as is.
impl From<AgentError> for Status {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::Hostd(s) => Status::new(s.code(), s.message().to_string()),
            e => Status::new(e.code(), e.to_string()),
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
        return AgentError::HostdOlder(s);
    }
    let unanswered = std::error::Error::source(&s).is_some();
    if s.code() == Code::Unavailable && unanswered {
        AgentError::HostdUnreachable(s)
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
        let words = down.message().to_string();
        let e = hostd_status(down);
        assert!(matches!(e, AgentError::HostdUnreachable(_)), "{e:?}");
        // tonic's own status, with the transport error under it, is kept.
        let kept = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<Status>());
        assert_eq!(kept.map(Status::code), Some(Code::Unavailable));
        assert!(kept.is_some_and(|s| std::error::Error::source(s).is_some()));
        let s = Status::from(e);
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(
            s.message(),
            format!(
                "hostd is not reachable ({words}); is the proxmox-csi-hostd service running on this node?"
            )
        );
        // hostd's own Unavailable, whatever its words, is hostd's answer.
        let said = Status::unavailable("connect the disk first: no device yet");
        let e = hostd_status(said);
        assert!(matches!(e, AgentError::Hostd(_)), "{e:?}");
        assert_eq!(
            std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<Status>())
                .map(Status::message),
            Some("connect the disk first: no device yet")
        );
        let s = Status::from(e);
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.message(), "connect the disk first: no device yet");
    }

    #[test]
    fn a_call_hostd_does_not_implement_keeps_its_status() {
        let e = hostd_status(Status::unimplemented("unknown method Expand"));
        let kept = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<Status>());
        assert_eq!(kept.map(Status::code), Some(Code::Unimplemented));
        let old = AgentError::HostdLacks {
            hostd: "of an older release".into(),
            what: "serve this call (unknown method Expand)".into(),
        };
        let s = Status::from(e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), old.to_string());
        assert!(
            s.message()
                .starts_with("hostd of an older release on this node cannot serve this call (unknown method Expand); this node plugin is "),
            "{}",
            s.message()
        );
    }

    #[test]
    fn a_publish_context_error_keeps_its_kind() {
        let e = AgentError::InvalidContext(ContextError::NoWwn);
        let kept = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<ContextError>());
        assert_eq!(kept, Some(&ContextError::NoWwn));
        let s = Status::from(e);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(
            s.message(),
            format!("{}: {}", ContextError::NoWwn.field(), ContextError::NoWwn)
        );
    }

    #[test]
    fn a_path_that_is_no_volume_keeps_why() {
        let why = AgentError::invalid("volume_path", "must be absolute");
        let e = AgentError::NoVolumeAt {
            path: "rel".into(),
            source: Box::new(why),
        };
        let kept = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<AgentError>());
        assert!(matches!(kept, Some(AgentError::Invalid { .. })), "{kept:?}");
        let s = Status::from(e);
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(
            s.message(),
            "no volume is published at \"rel\": volume_path: must be absolute"
        );
        let e = AgentError::NothingAt {
            path: "/k/pods/u/volumes/x/mount".into(),
            source: Status::failed_precondition("volume v1 is not staged"),
        };
        let kept = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<Status>());
        assert_eq!(kept.map(Status::code), Some(Code::FailedPrecondition));
        let s = Status::from(e);
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(
            s.message(),
            "volume_path /k/pods/u/volumes/x/mount: volume v1 is not staged"
        );
    }
}
