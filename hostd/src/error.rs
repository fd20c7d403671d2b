//! hostd's errors, each naming the operation that failed, and the one place
//! that maps them to gRPC codes and prints them.
//!
//! An operation that failed on another error (an io error, an errno,
//! libcryptsetup's) keeps that error whole as its `source`: callers decide
//! on it (its kind, its errno), never on text. Its `Display` is the context
//! alone; [`HostdError::message`] appends the source, once, and is what a
//! caller, the audit line and the health file read. hostd's other errors
//! ([`NotOurs`] for kubelet's ties, [`MonitorDied`] for the udev monitor,
//! [`crate::server::StartError`]) follow the same rule and are printed by
//! [`message`] too (the start error through its own `message`).

use std::error::Error as StdError;
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
    /// kubelet's directory above the path is there but cannot be opened.
    #[error("{field}: the directory above {path:?} cannot be opened")]
    ParentUnusable {
        field: &'static str,
        path: String,
        #[source]
        source: nix::Error,
    },
    /// The path is this driver's, but it belongs to another volume, or
    /// holds what this volume did not put there.
    #[error("{field}: {path} is not volume {volume_id}'s: {reason}")]
    NotThisVolume {
        field: &'static str,
        path: PathBuf,
        volume_id: String,
        reason: String,
    },
    /// kubelet's own files give the path to another volume or driver, or
    /// cannot be read (see [`crate::bindings::kubelet_tie`]).
    #[error("{field}: {path} is not volume {volume_id}'s")]
    KubeletSaysOther {
        field: &'static str,
        path: PathBuf,
        volume_id: String,
        #[source]
        source: NotOurs,
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
    /// An operation failed for a reason hostd states itself.
    #[error("{action} {target}: {reason}")]
    Failed {
        action: &'static str,
        target: String,
        reason: String,
    },
    /// An operation failed on a file, a process or a system call std made.
    #[error("{action} {target}")]
    Io {
        action: &'static str,
        target: String,
        #[source]
        source: std::io::Error,
    },
    /// An operation failed on a system call nix made.
    #[error("{action} {target}")]
    Sys {
        action: &'static str,
        target: String,
        #[source]
        source: nix::Error,
    },
    /// An operation failed in libcryptsetup.
    #[error("{action} {target}")]
    Crypt {
        action: &'static str,
        target: String,
        #[source]
        source: libcryptsetup_rs::LibcryptErr,
    },
    /// An operation failed in another library (libblkid, procfs, serde_json,
    /// tokio) or in another of hostd's operations, whose error is kept as it
    /// came.
    #[error("{action} {target}")]
    Lib {
        action: &'static str,
        target: String,
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

impl HostdError {
    /// An operation that failed for a reason in words; one that failed on
    /// an error value keeps it ([`HostdError::io`] and the others).
    pub fn failed(
        action: &'static str,
        target: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        Self::Failed {
            action,
            target: target.to_string(),
            reason: reason.into(),
        }
    }

    pub fn io(
        action: &'static str,
        target: impl std::fmt::Display,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            target: target.to_string(),
            source,
        }
    }

    pub fn sys(action: &'static str, target: impl std::fmt::Display, source: nix::Error) -> Self {
        Self::Sys {
            action,
            target: target.to_string(),
            source,
        }
    }

    pub fn crypt(
        action: &'static str,
        target: impl std::fmt::Display,
        source: libcryptsetup_rs::LibcryptErr,
    ) -> Self {
        Self::Crypt {
            action,
            target: target.to_string(),
            source,
        }
    }

    /// Only for an error value: a reason in words is [`HostdError::failed`].
    pub fn lib(
        action: &'static str,
        target: impl std::fmt::Display,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self::Lib {
            action,
            target: target.to_string(),
            source: Box::new(source),
        }
    }

    /// The action, the target and the reason of an operation that failed
    /// (an Internal error), the reason with its source printed.
    pub fn failure(&self) -> Option<(&'static str, &str, String)> {
        match self {
            Self::Failed {
                action,
                target,
                reason,
            } => Some((action, target, reason.clone())),
            Self::Io { action, target, .. }
            | Self::Sys { action, target, .. }
            | Self::Crypt { action, target, .. }
            | Self::Lib { action, target, .. } => Some((
                action,
                target,
                self.source().map(message).unwrap_or_default(),
            )),
            _ => None,
        }
    }

    /// What a caller and an operator read: the error, then its source, as
    /// one line: the one place a source is printed. A library's error
    /// prints what lies under it itself (an io error wrapping another
    /// prints it), so the chain is walked no further, except through
    /// hostd's own errors, whose `Display` is their context alone.
    pub fn message(&self) -> String {
        message(self)
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
            | Self::ParentMissing { .. }
            | Self::ParentUnusable { .. } => Code::InvalidArgument,
            Self::NotThisVolume { .. } | Self::KubeletSaysOther { .. } => Code::FailedPrecondition,
            // Retryable: the attach may still be on its way.
            Self::DeviceNotFound { .. } => Code::Unavailable,
            Self::DeviceRefused { .. } | Self::HoldsData { .. } => Code::FailedPrecondition,
            Self::StagedDifferently { .. } => Code::AlreadyExists,
            Self::NotStaged(_) | Self::PublishedElsewhere { .. } | Self::StillPublished { .. } => {
                Code::FailedPrecondition
            }
            Self::NothingAt(_) => Code::NotFound,
            Self::Unsupported(_) => Code::Unimplemented,
            Self::Failed { .. }
            | Self::Io { .. }
            | Self::Sys { .. }
            | Self::Crypt { .. }
            | Self::Lib { .. } => Code::Internal,
        }
    }
}

/// An error as [`HostdError::message`] prints it: one of hostd's own
/// (whose `Display` is its context alone) followed by its source, the
/// error of a library as its `Display`, which prints what lies under it.
pub fn message(e: &(dyn StdError + 'static)) -> String {
    let own = e.is::<HostdError>() || e.is::<NotOurs>() || e.is::<MonitorDied>();
    match e.source() {
        Some(source) if own => format!("{e}: {}", message(source)),
        _ => e.to_string(),
    }
}

impl From<HostdError> for Status {
    fn from(e: HostdError) -> Self {
        Status::new(e.code(), e.message())
    }
}

/// Why kubelet's own structure gives a path to another volume. As every
/// hostd error, its `Display` is its context alone; the error it failed on
/// is its source (printed by [`message`]).
#[derive(Debug, thiserror::Error)]
pub enum NotOurs {
    #[error(
        "kubelet names a volume's staging directory by the SHA-256 of its handle, which for {volume_id} is {sha256}"
    )]
    StagingName { volume_id: String, sha256: String },
    #[error("the path has no directory of kubelet's above it")]
    NoKubeletDir,
    #[error("kubelet's {file} cannot be read")]
    Unreadable {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// (Boxed strings keep [`HostdError`] small.)
    #[error("kubelet's {file} names volume {volume_id} of driver {driver}")]
    Named {
        file: PathBuf,
        volume_id: Box<str>,
        driver: Box<str>,
    },
    #[error("kubelet's {file} is not a volume record")]
    NotARecord {
        file: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Why the monitor thread stopped. As every hostd error, its `Display` is
/// its context alone; the errno it failed on is its source (printed by
/// [`message`]).
#[derive(Debug, thiserror::Error)]
pub enum MonitorDied {
    #[error("udev monitor poll failed")]
    Poll(#[source] nix::Error),
    #[error("udev monitor socket closed")]
    Closed,
    #[error("udev monitor socket error")]
    Socket(#[source] nix::Error),
    /// The thread ended without saying why.
    #[error("udev monitor thread vanished")]
    Vanished,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_printed_once_as_the_old_text_was() {
        let io = || std::io::Error::from_raw_os_error(nix::libc::ENOENT);
        let old = format!("reading the record /run/x.json: {}", io());
        let e = HostdError::io("reading the record", "/run/x.json", io());
        assert_eq!(e.to_string(), "reading the record /run/x.json");
        let status = Status::from(e);
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), old);
        let e = HostdError::sys("unmounting", "/mnt", nix::Error::EBUSY);
        assert_eq!(
            Status::from(e).message(),
            format!("unmounting /mnt: {}", nix::Error::EBUSY)
        );
        // Through hostd's own error as a source, each level once.
        let inner = HostdError::io("opening the", "Kernel netlink monitor", io());
        let e = HostdError::lib("starting", "the udev monitor", inner);
        assert_eq!(
            e.failure().map(|f| f.2),
            Some(format!("opening the Kernel netlink monitor: {}", io()))
        );
        assert_eq!(
            Status::from(e).message(),
            format!(
                "starting the udev monitor: opening the Kernel netlink monitor: {}",
                io()
            )
        );
        let e = HostdError::ParentUnusable {
            field: "staging_path",
            path: "/var/lib/kubelet/a\"b".into(),
            source: nix::Error::EACCES,
        };
        let status = Status::from(e);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            format!(
                "staging_path: the directory above {:?} cannot be opened: {}",
                "/var/lib/kubelet/a\"b",
                nix::Error::EACCES
            )
        );
        // A reason in words is printed as before.
        let e = HostdError::failed("running", "mkfs", "it exited 1");
        assert_eq!(Status::from(e).message(), "running mkfs: it exited 1");
    }

    #[test]
    fn the_source_is_the_error_itself_with_its_kind() {
        let e = HostdError::io(
            "opening",
            "/dev/sdb",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(source.map(|s| s.kind()), Some(std::io::ErrorKind::NotFound));
        let e = HostdError::sys("opening", "/dev/sdb", nix::Error::EBUSY);
        let source = e.source().and_then(|s| s.downcast_ref::<nix::Error>());
        assert_eq!(source, Some(&nix::Error::EBUSY));
        assert_eq!(
            e.failure().map(|f| f.2),
            Some(nix::Error::EBUSY.to_string())
        );
    }
}
