//! A live index of block devices, fed by udev events, that requests wait on.
//!
//! At start the index is filled from an enumeration of `block` devices; a
//! monitor thread then applies every add/change/remove event. A request for
//! a device that is not there yet subscribes to index changes and sleeps
//! until its device appears or its deadline passes: no polling loop. If the
//! device is still missing after a grace period, a SCSI host rescan is asked
//! for once, as a fallback for a missed hot-plug notification.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::error::HostdError;
pub use crate::error::MonitorDied;

/// Which netlink source the monitor listens to. `Udev` (after udevd has
/// applied its rules) in production; `Kernel` on hosts without udevd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSource {
    Udev,
    Kernel,
}

/// How a device is looked up: `naa.<wwn>` from sysfs `device/wwid`, or, for
/// the test-only loop resolver, `file:<backing file>`.
pub type Key = String;

/// Identity keys of the whole disk at `syspath`.
pub fn keys_of(syspath: &Path) -> Vec<Key> {
    let read = |p: &str| {
        std::fs::read_to_string(syspath.join(p))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let mut keys = Vec::new();
    if let Some(w) = read("device/wwid") {
        keys.push(w.to_ascii_lowercase());
    }
    if let Some(f) = read("loop/backing_file") {
        keys.push(format!("file:{f}"));
    }
    keys
}

#[derive(Debug)]
pub struct DeviceIndex {
    map: Mutex<HashMap<Key, PathBuf>>,
    generation: watch::Sender<u64>,
}

impl Default for DeviceIndex {
    fn default() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            generation: watch::channel(0).0,
        }
    }
}

impl DeviceIndex {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<Key, PathBuf>) -> R) -> R {
        let mut g = self.map.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, key: &str) -> Option<PathBuf> {
        self.with(|m| m.get(key).cloned())
    }

    /// Records the device at `syspath` (a whole disk) under its keys.
    pub fn add(&self, syspath: &Path, devnode: &Path) {
        let keys = keys_of(syspath);
        if keys.is_empty() {
            return;
        }
        self.with(|m| {
            // A re-used device name must not keep stale keys.
            m.retain(|_, v| v != devnode);
            for k in keys {
                m.insert(k, devnode.to_path_buf());
            }
        });
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn remove(&self, devnode: &Path) {
        self.with(|m| m.retain(|_, v| v != devnode));
        self.generation.send_modify(|g| *g += 1);
    }

    /// Fills the index from sysfs: every whole disk under `/sys/block`.
    pub fn scan_sysfs(&self, sys_block: &Path) {
        let Ok(entries) = std::fs::read_dir(sys_block) else {
            return;
        };
        for e in entries.flatten() {
            let dev = Path::new("/dev").join(e.file_name());
            self.add(&e.path(), &dev);
        }
    }

    /// Waits until `key` is indexed or `timeout` passes. `rescan` runs once
    /// after `grace` if the device has not appeared by then.
    pub async fn wait_for(
        &self,
        key: &str,
        timeout: Duration,
        grace: Duration,
        rescan: impl FnOnce(),
    ) -> Option<PathBuf> {
        let mut changes = self.generation.subscribe();
        let wait = async {
            let mut rescan = Some(rescan);
            let grace_timer = tokio::time::sleep(grace);
            tokio::pin!(grace_timer);
            loop {
                if let Some(p) = self.get(key) {
                    return p;
                }
                tokio::select! {
                    r = changes.changed() => if r.is_err() { std::future::pending::<()>().await },
                    _ = &mut grace_timer, if rescan.is_some() => {
                        if let Some(f) = rescan.take() { f() }
                    }
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok()
    }
}

/// Asks every SCSI host to rescan its bus, and re-reads sysfs into `index`.
pub fn rescan_scsi(index: &DeviceIndex) {
    if let Ok(hosts) = std::fs::read_dir("/sys/class/scsi_host") {
        for h in hosts.flatten() {
            if let Err(e) = std::fs::write(h.path().join("scan"), "- - -") {
                tracing::debug!(host = %h.path().display(), error = %e, "SCSI rescan failed");
            }
        }
    }
    index.scan_sysfs(Path::new("/sys/block"));
}

/// Starts the monitor thread. The returned receiver resolves with the reason
/// if the monitor dies; hostd then exits non-zero.
pub fn start_monitor(
    index: Arc<DeviceIndex>,
    source: EventSource,
) -> Result<oneshot::Receiver<MonitorDied>, HostdError> {
    let (died_tx, died_rx) = oneshot::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), HostdError>>();
    std::thread::Builder::new()
        .name("udev-monitor".into())
        .spawn(move || match open(source) {
            Ok(socket) => {
                enumerate(&index);
                let _ = ready_tx.send(Ok(()));
                let _ = died_tx.send(run(&socket, &index));
            }
            // Said through `ready_tx`: the receiver of `died_tx` is dropped
            // unread, as the start fails.
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| HostdError::io("starting", "the udev monitor thread", e))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(died_rx),
        Ok(Err(e)) => Err(HostdError::lib("starting", "the udev monitor", e)),
        Err(_) => Err(HostdError::failed(
            "starting",
            "the udev monitor",
            "thread exited",
        )),
    }
}

fn open(source: EventSource) -> Result<udev::MonitorSocket, HostdError> {
    let builder = match source {
        EventSource::Udev => udev::MonitorBuilder::new(),
        EventSource::Kernel => udev::MonitorBuilder::new_kernel(),
    };
    builder
        .and_then(|b| b.match_subsystem("block"))
        .and_then(|b| b.listen())
        .map_err(|e| HostdError::io("opening the", format!("{source:?} netlink monitor"), e))
}

fn enumerate(index: &DeviceIndex) {
    let mut n = 0;
    if let Ok(mut en) = udev::Enumerator::new() {
        let _ = en.match_subsystem("block");
        if let Ok(devices) = en.scan_devices() {
            for d in devices {
                if d.devtype().is_some_and(|t| t == "disk")
                    && let Some(node) = d.devnode()
                {
                    index.add(d.syspath(), node);
                    n += 1;
                }
            }
        }
    }
    tracing::info!(disks = n, indexed = index.len(), "block devices enumerated");
}

fn run(socket: &udev::MonitorSocket, index: &DeviceIndex) -> MonitorDied {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return MonitorDied::Poll(e),
        }
        let revents = fds[0].revents().unwrap_or(PollFlags::empty());
        if revents.intersects(PollFlags::POLLHUP | PollFlags::POLLNVAL) {
            return MonitorDied::Closed;
        }
        if revents.contains(PollFlags::POLLERR) {
            // A burst of events overflowed the socket (ENOBUFS): events were
            // lost, so re-read the whole device list instead of dying.
            match nix::sys::socket::getsockopt(
                &socket.as_fd(),
                nix::sys::socket::sockopt::SocketError,
            ) {
                Ok(e) if e == nix::errno::Errno::ENOBUFS as i32 || e == 0 => {
                    tracing::warn!("udev monitor overflowed; re-reading block devices");
                    enumerate(index);
                    continue;
                }
                Ok(e) => return MonitorDied::Socket(nix::errno::Errno::from_raw(e)),
                Err(e) => return MonitorDied::Socket(e),
            }
        }
        for event in socket.iter() {
            let d = event.device();
            if d.devtype().is_none_or(|t| t != "disk") {
                continue;
            }
            // Kernel events carry no devnode; the kernel's name is the node's name.
            let node = d
                .devnode()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| Path::new("/dev").join(d.sysname()));
            match event.event_type() {
                udev::EventType::Add | udev::EventType::Change | udev::EventType::Bind => {
                    tracing::debug!(device = %node.display(), event = ?event.event_type(), "block device event");
                    index.add(d.syspath(), &node);
                }
                udev::EventType::Remove => {
                    tracing::debug!(device = %node.display(), "block device removed");
                    index.remove(&node);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The monitor's reason keeps its errno, and reads as the string it was.
    #[test]
    fn a_dead_monitor_keeps_its_errno() {
        use std::error::Error as _;
        let e = MonitorDied::Poll(nix::Error::EBADF);
        assert_eq!(
            e.source().and_then(|s| s.downcast_ref::<nix::Error>()),
            Some(&nix::Error::EBADF)
        );
        assert_eq!(
            crate::error::message(&e),
            format!("udev monitor poll failed: {}", nix::Error::EBADF)
        );
        let e = MonitorDied::Socket(nix::errno::Errno::from_raw(nix::libc::EPROTO));
        assert_eq!(
            e.source().and_then(|s| s.downcast_ref::<nix::Error>()),
            Some(&nix::Error::EPROTO)
        );
        assert_eq!(
            crate::error::message(&e),
            format!("udev monitor socket error: {}", nix::Error::EPROTO)
        );
        assert_eq!(
            crate::error::message(&MonitorDied::Closed),
            "udev monitor socket closed"
        );
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_its_device_is_added() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sdb");
        std::fs::create_dir_all(sys.join("device")).unwrap();
        std::fs::write(sys.join("device/wwid"), "naa.5000C500A1B2C3D4\n").unwrap();
        let index = Arc::new(DeviceIndex::default());
        let adder = {
            let index = index.clone();
            let sys = sys.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                index.add(&sys, Path::new("/dev/sdb"));
            })
        };
        let got = index
            .wait_for(
                "naa.5000c500a1b2c3d4",
                Duration::from_secs(5),
                Duration::from_secs(60),
                || {},
            )
            .await;
        adder.await.unwrap();
        assert_eq!(got.as_deref(), Some(Path::new("/dev/sdb")));
        index.remove(Path::new("/dev/sdb"));
        assert!(index.is_empty());
    }

    #[tokio::test]
    async fn a_missing_device_times_out_after_one_rescan() {
        let index = DeviceIndex::default();
        let mut rescans = 0;
        let got = index
            .wait_for(
                "naa.0000000000000001",
                Duration::from_millis(200),
                Duration::from_millis(20),
                || rescans += 1,
            )
            .await;
        assert_eq!(got, None);
        assert_eq!(rescans, 1);
    }
}
