//! Benchmarks that compare side by side in one run, and the fault campaign.
//! `bench` prints the figures `docs/BENCHMARKS.md` records; `soak` runs the
//! campaign and prints its operations, faults and violations.

pub mod burst;
pub mod footprint;
pub mod golike;
pub mod guest_node;
pub mod guest_pod;
pub mod guest_stage;
pub mod kube_calls;
pub mod operator;
pub mod scale;
pub mod sidecar;
pub mod sidecar_burst;
pub mod sim;
pub mod soak;
pub mod stage;

/// p-th percentile (0–100) of `v` (sorted in place), in milliseconds.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Resident and peak resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(super::percentile(&mut v, 50.0), 3.0);
        assert_eq!(super::percentile(&mut v, 100.0), 5.0);
        assert_eq!(super::percentile(&mut [], 50.0), 0.0);
    }
}
