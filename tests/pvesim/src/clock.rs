//! Wall-clock time as Proxmox reports it: seconds since the Unix epoch
//! (task start times, volume and snapshot creation times).

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
