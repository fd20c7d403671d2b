//! Liveness facts: served by the Health RPC and written atomically to a JSON
//! file (`/run/proxmox-csi-hostd/health.json`) for `talosctl read`.

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

#[derive(Debug)]
pub struct Health {
    started: Instant,
    inner: Mutex<Facts>,
}

#[derive(Debug, Clone, Default, Serialize)]
struct Facts {
    udev_monitor_alive: bool,
    devices_indexed: u32,
    volumes_staged: u32,
    last_error: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Snapshot {
    pub version: String,
    pub uptime_seconds: u64,
    pub udev_monitor_alive: bool,
    pub devices_indexed: u32,
    pub volumes_staged: u32,
    pub last_error: String,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            inner: Mutex::new(Facts::default()),
        }
    }
}

impl Health {
    fn with<R>(&self, f: impl FnOnce(&mut Facts) -> R) -> R {
        // A poisoned lock still holds usable facts.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    pub fn set_udev_monitor_alive(&self, alive: bool) {
        self.with(|f| f.udev_monitor_alive = alive);
    }

    pub fn set_devices_indexed(&self, n: u32) {
        self.with(|f| f.devices_indexed = n);
    }

    pub fn set_volumes_staged(&self, n: u32) {
        self.with(|f| f.volumes_staged = n);
    }

    pub fn record_error(&self, e: &str) {
        self.with(|f| f.last_error = e.to_string());
    }

    pub fn snapshot(&self) -> Snapshot {
        let f = self.with(|f| f.clone());
        Snapshot {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_seconds: self.started.elapsed().as_secs(),
            udev_monitor_alive: f.udev_monitor_alive,
            devices_indexed: f.devices_indexed,
            volumes_staged: f.volumes_staged,
            last_error: f.last_error,
        }
    }

    /// Writes the snapshot to `path` through a temporary file and a rename, so
    /// a reader never sees a half-written file.
    pub fn write_file(&self, path: &Path) -> std::io::Result<()> {
        let body = serde_json::to_vec_pretty(&self.snapshot()).map_err(std::io::Error::other)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_complete_json_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/health.json");
        let h = Health::default();
        h.set_devices_indexed(3);
        h.record_error("udev monitor: socket closed");
        h.write_file(&path).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["devices_indexed"], 3);
        assert_eq!(v["last_error"], "udev monitor: socket closed");
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        assert!(!dir.path().join("sub/health.json.tmp").exists());
    }
}
