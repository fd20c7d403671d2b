//! How long each VM takes to plug and unplug a disk, learned from its own
//! config writes, so that a write's task is polled when it is due to end
//! (`pve::tasks::Polls`) instead of up to 250 ms after.
//!
//! Proxmox plugs the disks of one write one after another under the VM's
//! lock (qemu-server `vmconfig_hotplug_pending`), so a write's task lasts
//! about its disks times the VM's pace. Unplugs are learned apart: with
//! `scsihw: virtio-scsi-single` each waits for the guest's eject
//! (`qemu_devicedelverify`), seconds instead of a fraction of one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::pve::tasks::TaskSeen;

/// Per-disk times of each VM, by region and VMID.
#[derive(Debug, Default)]
pub struct Pace {
    vms: Mutex<HashMap<(String, u32), PerDisk>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct PerDisk {
    plug: Option<Duration>,
    unplug: Option<Duration>,
}

impl Pace {
    /// How long a write of `plugs` new disks and `unplugs` removed ones
    /// should take on VM `vmid`; `None` until the VM's pace is known for
    /// each kind the write holds.
    pub fn expect(
        &self,
        region: &str,
        vmid: u32,
        plugs: usize,
        unplugs: usize,
    ) -> Option<Duration> {
        let vms = self.vms.lock().ok()?;
        let p = vms.get(&(region.to_string(), vmid))?;
        let part = |n: usize, per: Option<Duration>| match n {
            0 => Some(Duration::ZERO),
            n => per.map(|d| d * n as u32),
        };
        Some(part(plugs, p.plug)? + part(unplugs, p.unplug)?)
    }

    /// Learns from a write of one kind only whose task was `seen` to end
    /// (a write mixing plugs and unplugs does not tell them apart).
    ///
    /// A task seen running and then ended ended in between: the middle
    /// counts half against the pace known (a VM that slows down is followed
    /// within a few writes). A task already over at the first look, made
    /// just before its expected end, may have ended long before: the pace
    /// only comes down then, to an eighth under what was seen; otherwise a
    /// pace learned too long would never come down, each first look
    /// confirming it, and a write of many disks would be seen ending late
    /// by as many times the error.
    pub fn learn(&self, region: &str, vmid: u32, plugs: usize, unplugs: usize, seen: TaskSeen) {
        let (n, plug) = match (plugs, unplugs) {
            (0, 0) => return,
            (n, 0) => (n, true),
            (0, n) => (n, false),
            _ => return,
        };
        let Ok(mut vms) = self.vms.lock() else { return };
        let p = vms.entry((region.to_string(), vmid)).or_default();
        let slot = if plug { &mut p.plug } else { &mut p.unplug };
        *slot = Some(match (seen.running_at, *slot) {
            (Some(running), old) => {
                let sample = (running + seen.ended_by) / 2 / n as u32;
                old.map_or(sample, |old| (old + sample) / 2)
            }
            (None, old) => {
                let sample = seen.ended_by * 7 / 8 / n as u32;
                old.map_or(sample, |old| old.min(sample))
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// A task seen running at `ms` and ended at the next look, 20 ms on.
    fn seen(ms: u64) -> TaskSeen {
        TaskSeen {
            running_at: Some(MS(ms - 10)),
            ended_by: MS(ms + 10),
        }
    }

    #[test]
    fn unknown_until_learned_then_per_disk() {
        let pace = Pace::default();
        assert_eq!(pace.expect("r1", 200, 4, 0), None);
        pace.learn("r1", 200, 4, 0, seen(1240));
        assert_eq!(pace.expect("r1", 200, 10, 0), Some(MS(3100)));
        // Unplugs are not known yet; another VM neither.
        assert_eq!(pace.expect("r1", 200, 1, 1), None);
        assert_eq!(pace.expect("r1", 201, 1, 0), None);
        assert_eq!(pace.expect("r2", 200, 1, 0), None);
        pace.learn("r1", 200, 0, 2, seen(2600));
        assert_eq!(pace.expect("r1", 200, 2, 1), Some(MS(620 + 1300)));
    }

    #[test]
    fn each_write_counts_half_and_mixed_writes_teach_nothing() {
        let pace = Pace::default();
        pace.learn("r1", 200, 1, 0, seen(300));
        pace.learn("r1", 200, 1, 0, seen(500));
        assert_eq!(pace.expect("r1", 200, 1, 0), Some(MS(400)));
        pace.learn("r1", 200, 3, 3, seen(9000));
        assert_eq!(pace.expect("r1", 200, 1, 0), Some(MS(400)));
        assert_eq!(pace.expect("r1", 200, 0, 0), Some(Duration::ZERO));
    }

    #[test]
    fn a_pace_learned_too_long_comes_down_at_once() {
        let pace = Pace::default();
        pace.learn("r1", 200, 1, 0, seen(420));
        // Ten disks that really take 300 ms each: the first look, at the
        // expected end, finds the task over.
        let e = pace.expect("r1", 200, 10, 0).unwrap_or_default();
        assert_eq!(e, MS(4200));
        let over = TaskSeen {
            running_at: None,
            ended_by: e - MS(100),
        };
        pace.learn("r1", 200, 10, 0, over);
        assert_eq!(
            pace.expect("r1", 200, 1, 0),
            Some(MS(358) + Duration::from_micros(750))
        );
        // Found over again, later than the pace says: it stays.
        pace.learn(
            "r1",
            200,
            1,
            0,
            TaskSeen {
                running_at: None,
                ended_by: MS(500),
            },
        );
        assert_eq!(
            pace.expect("r1", 200, 1, 0),
            Some(MS(358) + Duration::from_micros(750))
        );
    }
}
