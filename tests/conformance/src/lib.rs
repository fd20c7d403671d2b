//! A conformance suite written from the CSI v1.12 spec (`spec.md` beside
//! the proto): each clause is a named check of one MUST or SHALL, run
//! against the driver and reported as passed or failed.
//!
//! - `controller`: the controller service on pvesim, on every storage type
//!   pvesim models;
//! - `node`: the node plugin with hostd on loop devices (needs root), or in
//!   the QEMU guest (`tests/e2e`);
//! - `lab`: the controller binary, the node plugin and hostd on this host,
//!   for the tests that drive a volume through the real callers' requests.
//!
//! The clauses, how to run them, and which of them cover each spec of
//! kubernetes-csi/csi-test's pkg/sanity: `README.md` beside this crate.

pub mod controller;
pub mod node;

use proxmox_csi_proto::csi::v1 as csi;
use tonic::{Code, Status};

/// The outcome of every clause run.
#[derive(Debug, Default)]
pub struct Report {
    pub results: Vec<(String, Result<(), String>)>,
}

impl Report {
    /// Records clause `name` (`RPC: what the spec requires`).
    pub fn clause(&mut self, name: &str, outcome: Result<(), String>) {
        self.results.push((name.to_string(), outcome));
    }

    /// Every clause, one line each, then the summary.
    pub fn render(&self, title: &str) -> String {
        let mut out = format!("== {title}\n");
        for (name, outcome) in &self.results {
            match outcome {
                Ok(()) => out.push_str(&format!("PASS  {name}\n")),
                Err(why) => out.push_str(&format!("FAIL  {name}: {why}\n")),
            }
        }
        out.push_str(&format!("{}\n", self.summary()));
        out
    }

    pub fn failed(&self) -> Vec<&str> {
        self.results
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The closing line: `N passed, N failed`.
    /// Prints the report under `title`, then fails the test unless at
    /// least `min` clauses ran and none failed.
    pub fn require_all_passed(&self, title: &str, min: usize) {
        print!("{}", self.render(title));
        assert!(
            self.results.len() >= min,
            "{title}: only {} clauses ran",
            self.results.len()
        );
        assert!(
            self.failed().is_empty(),
            "{title}: failed clauses: {:#?}",
            self.failed()
        );
    }

    pub fn summary(&self) -> String {
        let failed = self.failed().len();
        format!("{} passed, {failed} failed", self.results.len() - failed)
    }
}

/// GetPluginInfo's `name` as the spec has it: domain name notation, at
/// most 63 characters, beginning and ending with an alphanumeric
/// character, with dashes, dots and alphanumerics between.
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    let inner = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-';
    ensure(
        !name.is_empty()
            && name.len() <= 63
            && name.contains('.')
            && name.chars().all(inner)
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric()),
        || format!("name {name:?}"),
    )
}

/// Every plugin capability is a service or a volume expansion of a type
/// the spec defines (neither UNKNOWN nor a number it does not name).
pub fn check_plugin_capabilities(caps: &[csi::PluginCapability]) -> Result<(), String> {
    use csi::plugin_capability::{Type, service, volume_expansion};
    let known = |c: &csi::PluginCapability| match &c.r#type {
        Some(Type::Service(s)) => {
            service::Type::try_from(s.r#type).is_ok_and(|t| t != service::Type::Unknown)
        }
        Some(Type::VolumeExpansion(v)) => volume_expansion::Type::try_from(v.r#type)
            .is_ok_and(|t| t != volume_expansion::Type::Unknown),
        None => false,
    };
    let unknown: Vec<&csi::PluginCapability> = caps.iter().filter(|c| !known(c)).collect();
    ensure(unknown.is_empty(), || {
        format!("unknown capabilities {unknown:?}")
    })
}

/// The spec's error scheme: the code, a human-readable message, and empty
/// details.
pub fn expect_code<T: std::fmt::Debug>(r: Result<T, Status>, want: Code) -> Result<(), String> {
    match r {
        Ok(v) => Err(format!("answered OK ({v:?}), want {want:?}")),
        Err(s) if s.code() != want => Err(format!(
            "answered {:?} ({}), want {want:?}",
            s.code(),
            s.message()
        )),
        Err(s) if s.message().trim().is_empty() => Err(format!("{want:?} without a message")),
        Err(s) if !s.details().is_empty() => Err(format!("{want:?} with non-empty details")),
        Err(_) => Ok(()),
    }
}

/// An OK answer, its value.
pub fn ok<T>(r: Result<T, Status>) -> Result<T, String> {
    r.map_err(|s| format!("answered {:?}: {}", s.code(), s.message()))
}

/// `Ok` when `cond`, else the reason.
pub fn ensure(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(why()) }
}
