//! The controller's errors and the one place that maps them to gRPC codes.
//!
//! An error that wraps another keeps it as its `#[source]` (a caller or a
//! test can walk `std::error::Error::source` down to the `PveError`, the
//! `kube::Error`, the handle's parse error) instead of flattening it into a
//! `String`. Chains are printed once: each variant's Display already holds
//! what its source says (`{source}`, or the Proxmox message for the ones
//! that name a remedy), and `From<CtlError> for Status` prints that Display
//! only, never the chain again.

use proxmox_csi_common::NodeIdError;
use proxmox_csi_common::handles::HandleError;
use tonic::{Code, Status};

use crate::params::ParamError;
use crate::pve::PveError;
use crate::pve::errors::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// A request field that is not a handle of this driver at all.
    #[error("{field}: {source}")]
    InvalidHandle {
        field: String,
        #[source]
        source: HandleError,
    },
    #[error("{0}")]
    NotFound(String),
    /// A handle this driver could never have issued names nothing
    /// (`what`: volume, snapshot): NOT_FOUND, the spec's answer.
    #[error("{what} {raw} does not exist: {source}")]
    UnknownHandle {
        what: &'static str,
        raw: String,
        #[source]
        source: HandleError,
    },
    /// A node id this driver could never have issued.
    #[error("node {raw} does not exist: {source}")]
    UnknownNode {
        raw: String,
        #[source]
        source: NodeIdError,
    },
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
    /// The Kubernetes API did not answer `what`: the sidecar retries.
    #[error("Kubernetes API: {what}: {source}")]
    Kubernetes {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Unimplemented(String),
    /// The spec's answer to a pagination token we did not give out.
    #[error("{0}")]
    Aborted(String),
    /// A Proxmox error no caller settled: INTERNAL.
    #[error("{0}")]
    Proxmox(#[source] PveError),
    /// Proxmox busy or unreachable, or a task that failed for a reason the
    /// corpus does not know (see `From<PveError>`): UNAVAILABLE.
    #[error("{0}")]
    ProxmoxUnavailable(#[source] PveError),
    /// A refused privilege (`permission_remedy`): FAILED_PRECONDITION.
    #[error("{}: {}", .0, remedy(.0))]
    ProxmoxDenied(#[source] PveError),
    /// A step Proxmox refused the API token: FAILED_PRECONDITION.
    #[error(transparent)]
    ProxmoxRefused(Box<Refused>),
    /// The token may not create the controller's own VM: FAILED_PRECONDITION.
    #[error(transparent)]
    NoVmOfItsOwn(Box<NoVmOfItsOwn>),
    /// A copy whose claim is gone could not be destroyed yet: the next
    /// call tries again, so UNAVAILABLE whatever stopped it.
    #[error(
        "volume {volume}: its claim {claim} is gone, and its copy VM is not destroyed yet: {source}; the next call tries again"
    )]
    CopyNotDestroyed {
        volume: String,
        claim: String,
        #[source]
        source: Box<CtlError>,
    },
    /// A Proxmox error shared by several callers (one config write for many).
    #[error("{0}")]
    Internal(String),
    /// One error answered to each of several callers (one config write for
    /// many volumes): every caller gets its code, its text and its chain.
    #[error(transparent)]
    Shared(std::sync::Arc<CtlError>),
}

/// What Proxmox refused the API token (`what`), its message, and what to
/// grant (`remedy`). Only the message is shown, as before the source was
/// kept; the whole `PveError` is the source. Boxed in `CtlError`, as is
/// `NoVmOfItsOwn`: context beside a `PveError` would make every `CtlError`
/// larger (clippy result_large_err).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {}; {remedy}", .source.message())]
pub struct Refused {
    pub what: String,
    pub remedy: String,
    #[source]
    pub source: PveError,
}

/// The token may not create the controller's own VM `name` on `node`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the controller needs a VM of its own on {node} ({name}) and the API token may not create one ({}); grant {privileges} to the CSI role",
    .source.message()
)]
pub struct NoVmOfItsOwn {
    pub node: String,
    pub name: String,
    pub privileges: String,
    #[source]
    pub source: PveError,
}

impl CtlError {
    /// See `Refused`.
    pub fn refused(what: impl Into<String>, remedy: impl Into<String>, source: PveError) -> Self {
        Self::ProxmoxRefused(Box::new(Refused {
            what: what.into(),
            remedy: remedy.into(),
            source,
        }))
    }

    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The gRPC code of the error: the one mapping of the crate.
    pub fn code(&self) -> Code {
        match self {
            Self::Invalid { .. } | Self::InvalidHandle { .. } => Code::InvalidArgument,
            Self::NotFound(_) | Self::UnknownHandle { .. } | Self::UnknownNode { .. } => {
                Code::NotFound
            }
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::FailedPrecondition(_)
            | Self::ProxmoxDenied(_)
            | Self::ProxmoxRefused(_)
            | Self::NoVmOfItsOwn(_) => Code::FailedPrecondition,
            Self::OutOfRange(_) => Code::OutOfRange,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::Unavailable(_)
            | Self::Kubernetes { .. }
            | Self::ProxmoxUnavailable(_)
            | Self::CopyNotDestroyed { .. } => Code::Unavailable,
            Self::Unimplemented(_) => Code::Unimplemented,
            Self::Aborted(_) => Code::Aborted,
            Self::Proxmox(_) | Self::Internal(_) => Code::Internal,
            Self::Shared(e) => e.code(),
        }
    }
}

impl From<PveError> for CtlError {
    fn from(e: PveError) -> Self {
        match e.kind() {
            ErrorKind::PermissionDenied => Self::ProxmoxDenied(e),
            ErrorKind::Busy | ErrorKind::Transient => Self::ProxmoxUnavailable(e),
            // A task that failed for a reason the error corpus does not know
            // may have done part or all of its work (a worker dying after
            // it): the sidecars must treat the operation as possibly in
            // progress and call again, and the next call finds out what was
            // done (external-provisioner pkg/controller/controller.go
            // checkError: only Unavailable, Aborted, DeadlineExceeded and
            // Canceled mean "in progress").
            ErrorKind::Other if matches!(e, PveError::Task { .. }) => Self::ProxmoxUnavailable(e),
            // Left to the call sites that know what a missing or existing
            // object means for their RPC; unsettled, INTERNAL.
            ErrorKind::NotFound
            | ErrorKind::AlreadyExists
            | ErrorKind::DigestMismatch
            | ErrorKind::HotplugFailed
            | ErrorKind::Other => Self::Proxmox(e),
        }
    }
}

/// A refused privilege, however it came (an HTTP 403, or a task's exit
/// status when Proxmox checks in the worker): not worth retrying until
/// someone grants it, so the sidecar's backoff is FailedPrecondition, and
/// the text names what to grant where.
pub fn permission_remedy(e: &PveError) -> String {
    format!("{e}: {}", remedy(e))
}

/// What `permission_remedy` says after the error itself.
fn remedy(e: &PveError) -> String {
    let message = e.message();
    match crate::pve::errors::denied_privilege(&message) {
        Some(_) if crate::pve::errors::is_tag_refusal(&message) => {
            "the cluster's tag policy (datacenter.cfg user-tag-access or registered-tags) keeps the API token \
             from setting a tag of the driver's VMs; allow the driver's tags (pvecsictl doctor lists them) or grant \
             Sys.Modify on / to the CSI role"
                .to_string()
        }
        Some((path, privs)) => format!(
            "the API token lacks {privs} on {path}; grant it to the CSI role (docs/proxmox-role.md)"
        ),
        None => "Proxmox refused the API token a privilege it did not name; compare the CSI role with docs/proxmox-role.md".to_string(),
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
        // Display only: it already holds each source's text (module comment).
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use reqwest::{Method, StatusCode};

    use super::*;

    fn api(status: u16, message: &str) -> PveError {
        PveError::Api {
            region: "r1".into(),
            method: Method::PUT,
            path: "/nodes/pve1/qemu/100/config".into(),
            status: StatusCode::from_u16(status).unwrap(),
            message: message.into(),
        }
    }

    /// A wrapped error answers with the text and code it had when it was
    /// formatted into a String.
    #[test]
    fn a_wrapped_error_keeps_its_text_and_code() {
        let e = kube::Error::TlsRequired;
        let old = format!("Kubernetes API: listing CSINodes: {e}");
        let status = Status::from(CtlError::Kubernetes {
            what: "listing CSINodes".into(),
            source: e,
        });
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), old);

        let e = proxmox_csi_common::handles::VolumeId::parse("nope").unwrap_err();
        let status = Status::from(crate::ctl::volume_ref("volume_id", "nope").unwrap_err());
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), format!("volume nope does not exist: {e}"));

        let e = api(403, "Permission check failed (/vms/100, VM.Config.Disk)");
        let old = permission_remedy(&e);
        let status = Status::from(CtlError::from(e));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), old);
        assert!(
            old.ends_with(
                "lacks VM.Config.Disk on /vms/100; grant it to the CSI role (docs/proxmox-role.md)"
            ),
            "{old}"
        );
    }

    /// The source is the original error, not its text.
    #[test]
    fn the_source_is_the_original_error() {
        let e = CtlError::Kubernetes {
            what: "reading Node n1".into(),
            source: kube::Error::TlsRequired,
        };
        let source = e.source().and_then(|s| s.downcast_ref::<kube::Error>());
        assert!(
            matches!(source, Some(kube::Error::TlsRequired)),
            "{source:?}"
        );

        let e = crate::ctl::snapshot_ref("snapshot_id", "a/b").unwrap_err();
        let source = e.source().and_then(|s| s.downcast_ref::<HandleError>());
        assert_eq!(
            source,
            proxmox_csi_common::handles::SnapshotId::parse("a/b")
                .err()
                .as_ref()
        );

        let e = CtlError::from(api(500, "cluster not ready - no quorum?"));
        let source = e.source().and_then(|s| s.downcast_ref::<PveError>());
        assert_eq!(
            source.map(PveError::message).as_deref(),
            Some("cluster not ready - no quorum?")
        );
    }

    /// Each caller of a shared config write gets the error's code, text and
    /// source, not a copy of its text under another code.
    #[test]
    fn a_shared_error_keeps_code_text_and_source() {
        let e = CtlError::from(api(
            403,
            "Permission check failed (/vms/100, VM.Config.Disk)",
        ));
        let (code, text) = (e.code(), e.to_string());
        let shared = std::sync::Arc::new(e);
        for _ in 0..2 {
            let each = CtlError::Shared(shared.clone());
            let source = each.source().and_then(|s| s.downcast_ref::<PveError>());
            assert!(
                matches!(source, Some(PveError::Api { status, .. }) if status.as_u16() == 403),
                "{source:?}"
            );
            let status = Status::from(each);
            assert_eq!((status.code(), status.message()), (code, text.as_str()));
        }
        assert_eq!(code, Code::FailedPrecondition);
    }

    /// The codes `From<PveError>` gives, kind by kind.
    #[test]
    fn proxmox_errors_get_their_codes() {
        let task = |exitstatus: &str| PveError::Task {
            region: "r1".into(),
            upid: "UPID:pve1:0003A1F2:01B665C6:6B0C4CAF:qmconfig:100:root@pam:".into(),
            exitstatus: exitstatus.into(),
        };
        let cases = [
            (
                api(500, "cluster not ready - no quorum?"),
                Code::Unavailable,
            ),
            (api(500, "VM is locked (backup)"), Code::Unavailable),
            (api(500, "illegal name 'x'"), Code::Internal),
            (
                api(
                    500,
                    "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist",
                ),
                Code::Internal,
            ),
            (task("worker died"), Code::Unavailable),
            (task("hotplug problem - scsi1: x"), Code::Internal),
            (
                api(403, "Permission check failed"),
                Code::FailedPrecondition,
            ),
        ];
        for (e, code) in cases {
            let text = e.to_string();
            let status = Status::from(CtlError::from(e));
            assert_eq!(status.code(), code, "{text}");
            assert!(status.message().starts_with(&text), "{text}");
        }
    }
}
