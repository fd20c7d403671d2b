//! A conformance suite written from the CSI v1.12 spec (`spec.md` beside
//! the proto): each clause is a named check of one MUST or SHALL, run
//! against the driver and reported as passed or failed.
//!
//! - `controller`: the controller service on pvesim;
//! - `node`: the node plugin with hostd on loop devices (needs root).

pub mod controller;
pub mod node;
pub mod sanity;

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
    pub fn summary(&self) -> String {
        let failed = self.failed().len();
        format!("{} passed, {failed} failed", self.results.len() - failed)
    }
}

/// Whether this runs as root, which the node side needs (loop devices,
/// mounts). Without root it says so and the caller skips; under CI that is
/// a failure.
pub fn as_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "this test needs root (loop devices, mounts), and CI is set"
    );
    eprintln!("SKIPPED: this test needs root (loop devices, mounts)");
    false
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
