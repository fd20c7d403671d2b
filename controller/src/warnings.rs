//! What a class says that the driver takes with the Go driver's meaning
//! rather than refusing: StorageClasses, VolumeAttributesClasses and
//! VolumeSnapshotClasses are immutable, so a class the Go driver accepted
//! must keep working. Each such key is a warning: a log line and a count in
//! `proxmox_csi_class_parameter_warnings_total`, and `pvecsictl doctor`
//! lists the classes that carry them.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The kind of class a parameter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClassKind {
    StorageClass,
    VolumeAttributesClass,
    VolumeSnapshotClass,
}

impl ClassKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StorageClass => "StorageClass",
            Self::VolumeAttributesClass => "VolumeAttributesClass",
            Self::VolumeSnapshotClass => "VolumeSnapshotClass",
        }
    }
}

/// Why a key is a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A key the driver does not read (the Go driver ignores such keys too).
    UnknownKey,
    /// Not one of Go's `strconv.ParseBool` spellings: false, as the Go
    /// driver takes it (pkg/csi/parameters.go unmarshalTag ignores the
    /// ParseBool error).
    NotABoolean { value: String },
    /// A VolumeAttributesClass limit of 0 or less: the old limit stays, as in the
    /// Go driver (ModifyVolumeParameters.MergeMap keeps the original key
    /// when the class sets none).
    ZeroKeepsLimit,
    /// A key the Go driver reads and does not act on.
    NotActedOn,
    /// A value outside what the key allows, for a key the Go driver never
    /// read: left unset, as Go leaves it (`discard`, which old PVs' volume
    /// contexts carry as their class had it).
    ValueIgnored {
        value: String,
        allowed: &'static [&'static str],
    },
}

impl Reason {
    fn label(&self) -> &'static str {
        match self {
            Self::UnknownKey => "unknown_key",
            Self::NotABoolean { .. } => "not_a_boolean",
            Self::ZeroKeepsLimit => "zero_keeps_limit",
            Self::NotActedOn => "not_acted_on",
            Self::ValueIgnored { .. } => "value_ignored",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamWarning {
    pub key: String,
    pub reason: Reason,
}

impl ParamWarning {
    pub fn new(key: &str, reason: Reason) -> Self {
        Self {
            key: key.to_string(),
            reason,
        }
    }
}

impl std::fmt::Display for ParamWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = &self.key;
        match &self.reason {
            Reason::UnknownKey => write!(f, "{key}: not a parameter of this driver, ignored"),
            Reason::NotABoolean { value } => write!(
                f,
                "{key}: {value:?} is not a boolean (true, false, 1, 0, t, f), taken as false as the Go driver does"
            ),
            Reason::ZeroKeepsLimit => {
                write!(
                    f,
                    "{key}: 0 or less sets no limit; the disk keeps the limit it has"
                )
            }
            Reason::NotActedOn => write!(f, "{key}: accepted and not acted on"),
            Reason::ValueIgnored { value, allowed } => write!(
                f,
                "{key}: {value:?} is not one of {}; left unset, as the Go driver leaves it",
                allowed.join(", ")
            ),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    class: &'static str,
    key: String,
    reason: &'static str,
}

static WARNINGS: LazyLock<Family<Labels, Counter>> = LazyLock::new(Family::default);

pub fn register(registry: &mut Registry) {
    registry.register(
        "class_parameter_warnings",
        "Class parameters taken with the Go driver's meaning instead of being refused",
        WARNINGS.clone(),
    );
}

/// Logs and counts the warnings of one class's parameters.
pub fn report(class: ClassKind, warnings: &[ParamWarning]) {
    for w in warnings {
        tracing::warn!(class = class.as_str(), key = %w.key, "class parameter: {w}");
        WARNINGS
            .get_or_create(&Labels {
                class: class.as_str(),
                key: w.key.clone(),
                reason: w.reason.label(),
            })
            .inc();
    }
}
