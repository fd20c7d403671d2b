//! What hostd's API offers, as its Health answer says: the node plugin (a
//! DaemonSet, rolled with the chart) and hostd (part of the node's OS image,
//! upgraded with it) run different releases for a while, so the node plugin
//! asks for a capability before it relies on it and names what a too-old
//! hostd lacks (docs/versioning.md, "Version skew").

/// The API hostd serves. A new release adds capabilities within it; a
/// change an older peer would misread takes a new API version.
pub const API_VERSION: u32 = 1;

/// One thing hostd can do, named in Health's `capabilities`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// Stage a filesystem volume (ext2/3/4, xfs).
    Filesystem,
    /// Stage and publish a raw block volume.
    Block,
    /// Stage an encrypted volume (LUKS2).
    Luks,
    /// Grow a staged volume's LUKS mapping and filesystem.
    Expand,
    /// Report a volume's usage and condition.
    Stats,
}

impl Capability {
    pub const ALL: [Self; 5] = [
        Self::Filesystem,
        Self::Block,
        Self::Luks,
        Self::Expand,
        Self::Stats,
    ];

    /// The name Health carries.
    pub fn name(self) -> &'static str {
        match self {
            Self::Filesystem => "stage.filesystem",
            Self::Block => "stage.block",
            Self::Luks => "stage.luks2",
            Self::Expand => "expand",
            Self::Stats => "stats",
        }
    }

    /// What a volume cannot have without it, for the error.
    pub fn purpose(self) -> &'static str {
        match self {
            Self::Filesystem => "stage filesystem volumes",
            Self::Block => "stage raw block volumes",
            Self::Luks => "stage encrypted volumes",
            Self::Expand => "grow volumes on the node",
            Self::Stats => "report volume usage",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// What a hostd answered about itself. A hostd from before negotiation
/// (API version 0 in its answer) had every capability of API 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub version: String,
    pub api_version: u32,
    pub capabilities: Vec<String>,
}

impl Offer {
    pub fn has(&self, c: Capability) -> bool {
        self.api_version == 0 || self.capabilities.iter().any(|n| n == c.name())
    }

    /// Whether this node plugin speaks that hostd's API.
    pub fn compatible(&self) -> bool {
        self.api_version == 0 || self.api_version == API_VERSION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_old_hostds_offer_everything() {
        for c in Capability::ALL {
            assert_eq!(Capability::parse(c.name()), Some(c));
        }
        let old = Offer {
            version: "0.1.0".into(),
            api_version: 0,
            capabilities: vec![],
        };
        assert!(Capability::ALL.iter().all(|c| old.has(*c)));
        let narrow = Offer {
            version: "0.2.0".into(),
            api_version: 1,
            capabilities: vec!["stage.filesystem".into(), "future.thing".into()],
        };
        assert!(narrow.has(Capability::Filesystem) && !narrow.has(Capability::Expand));
    }
}
