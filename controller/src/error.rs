//! The controller's errors and the one place that maps them to gRPC codes.

use tonic::{Code, Status};

use crate::params::ParamError;
use crate::pve::PveError;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// Proxmox is busy or unreachable: the sidecar should retry.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Unimplemented(String),
    /// The spec's answer to a pagination token we did not give out.
    #[error("{0}")]
    Aborted(String),
    #[error(transparent)]
    Proxmox(PveError),
    /// A Proxmox error shared by several callers (one config write for many).
    #[error("{0}")]
    Internal(String),
}

impl CtlError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<PveError> for CtlError {
    fn from(e: PveError) -> Self {
        // A task that failed for a reason the error corpus does not know may
        // have done part or all of its work (a worker dying after it): the
        // sidecars must treat the operation as possibly in progress and
        // call again, and the next call finds out what was done
        // (external-provisioner pkg/controller/controller.go checkError:
        // only Unavailable, Aborted, DeadlineExceeded and Canceled mean
        // "in progress").
        let unknown_task_failure =
            matches!(e, PveError::Task { .. }) && e.kind() == crate::pve::errors::ErrorKind::Other;
        if e.kind() == crate::pve::errors::ErrorKind::PermissionDenied {
            Self::FailedPrecondition(permission_remedy(&e))
        } else if e.is_transient() || unknown_task_failure {
            Self::Unavailable(e.to_string())
        } else {
            Self::Proxmox(e)
        }
    }
}

/// A refused privilege, however it came (an HTTP 403, or a task's exit
/// status when Proxmox checks in the worker): not worth retrying until
/// someone grants it, so the sidecar's backoff is FailedPrecondition, and
/// the text names what to grant where.
pub fn permission_remedy(e: &PveError) -> String {
    let message = e.message();
    match crate::pve::errors::denied_privilege(&message) {
        Some(_) if crate::pve::errors::is_tag_refusal(&message) => format!(
            "{e}: the cluster's tag policy (datacenter.cfg user-tag-access or registered-tags) keeps the API token \
             from setting a tag of the driver's VMs; allow the driver's tags (pvecsictl doctor lists them) or grant \
             Sys.Modify on / to the CSI role"
        ),
        Some((path, privs)) => format!(
            "{e}: the API token lacks {privs} on {path}; grant it to the CSI role (docs/proxmox-role.md)"
        ),
        None => format!(
            "{e}: Proxmox refused the API token a privilege it did not name; compare the CSI role with docs/proxmox-role.md"
        ),
    }
}

impl From<ParamError> for CtlError {
    fn from(e: ParamError) -> Self {
        Self::Invalid {
            field: format!("parameters.{}", e.key),
            reason: e.reason,
        }
    }
}

impl From<CtlError> for Status {
    fn from(e: CtlError) -> Self {
        let code = match &e {
            CtlError::Invalid { .. } => Code::InvalidArgument,
            CtlError::NotFound(_) => Code::NotFound,
            CtlError::AlreadyExists(_) => Code::AlreadyExists,
            CtlError::FailedPrecondition(_) => Code::FailedPrecondition,
            CtlError::OutOfRange(_) => Code::OutOfRange,
            CtlError::ResourceExhausted(_) => Code::ResourceExhausted,
            CtlError::Unavailable(_) => Code::Unavailable,
            CtlError::Unimplemented(_) => Code::Unimplemented,
            CtlError::Aborted(_) => Code::Aborted,
            CtlError::Proxmox(_) | CtlError::Internal(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}
