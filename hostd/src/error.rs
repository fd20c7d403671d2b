//! hostd's errors, each naming the operation that failed, and the one place
//! that maps them to gRPC codes.

use std::path::PathBuf;

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum HostdError {
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("{field}: {path} is not one of kubelet's CSI paths under {root}: expected {expected}")]
    PathOutsideKubelet {
        field: &'static str,
        path: PathBuf,
        root: PathBuf,
        expected: String,
    },
    /// kubelet makes the directories above every path before it calls.
    #[error("{field}: the directory above {path} does not exist")]
    ParentMissing { field: &'static str, path: PathBuf },
    /// The path is this driver's, but it belongs to another volume, or
    /// holds what this volume did not put there.
    #[error("{field}: {path} is not volume {volume_id}'s: {reason}")]
    NotThisVolume {
        field: &'static str,
        path: PathBuf,
        volume_id: String,
        reason: String,
    },
    #[error("device with WWN {wwn} did not appear: {reason}")]
    DeviceNotFound { wwn: String, reason: String },
    #[error("device {device} refused: {reason}")]
    DeviceRefused { device: PathBuf, reason: String },
    #[error("device {device} already holds {found}; refusing to format it")]
    HoldsData { device: PathBuf, found: String },
    #[error("{path} is already {what}, which differs from this request: {detail}")]
    StagedDifferently {
        path: PathBuf,
        what: &'static str,
        detail: String,
    },
    #[error("volume {0} is not staged")]
    NotStaged(String),
    /// Stats or Expand of a path that holds no volume: NOT_FOUND, as the
    /// spec answers a volume that does not exist there.
    #[error("volume {0} is not staged")]
    NothingAt(String),
    #[error(
        "volume {volume_id} is SINGLE_NODE_SINGLE_WRITER and already published read-write at {other}"
    )]
    PublishedElsewhere { volume_id: String, other: PathBuf },
    #[error("volume {volume_id} is still published at {}; unpublish it first", .targets.iter().map(|t| t.display().to_string()).collect::<Vec<_>>().join(", "))]
    StillPublished {
        volume_id: String,
        targets: Vec<PathBuf>,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("{action} {target}: {reason}")]
    Failed {
        action: &'static str,
        target: String,
        reason: String,
    },
}

impl HostdError {
    pub fn failed(
        action: &'static str,
        target: impl std::fmt::Display,
        reason: impl std::fmt::Display,
    ) -> Self {
        Self::Failed {
            action,
            target: target.to_string(),
            reason: reason.to_string(),
        }
    }

    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. }
            | Self::PathOutsideKubelet { .. }
            | Self::ParentMissing { .. } => Code::InvalidArgument,
            Self::NotThisVolume { .. } => Code::FailedPrecondition,
            // Retryable: the attach may still be on its way.
            Self::DeviceNotFound { .. } => Code::Unavailable,
            Self::DeviceRefused { .. } | Self::HoldsData { .. } => Code::FailedPrecondition,
            Self::StagedDifferently { .. } => Code::AlreadyExists,
            Self::NotStaged(_) | Self::PublishedElsewhere { .. } | Self::StillPublished { .. } => {
                Code::FailedPrecondition
            }
            Self::NothingAt(_) => Code::NotFound,
            Self::Unsupported(_) => Code::Unimplemented,
            Self::Failed { .. } => Code::Internal,
        }
    }
}

impl From<HostdError> for Status {
    fn from(e: HostdError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}
