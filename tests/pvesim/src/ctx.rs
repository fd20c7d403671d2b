//! The handle every request handler, task and the QMP backend share: the
//! live cluster, login tickets, the schema, the locks and pvedaemon's
//! workers. The server builds it; the handlers only use it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::auth::Tickets;
use crate::locks::Locks;
use crate::schema::Schema;
use crate::state::Cluster;

/// Shared by every request and task.
#[derive(Debug)]
pub struct Ctx {
    pub cluster: Mutex<Cluster>,
    pub tickets: Mutex<Tickets>,
    pub schema: Schema,
    pub locks: Arc<Locks>,
    /// Where the QMP backend keeps one sparse file per attached volume.
    pub volume_dir: Option<std::path::PathBuf>,
    /// A VM whose disks reach this host as loop devices (see `qmp::plug`).
    pub loop_host: Option<(u32, std::path::PathBuf)>,
    /// pvedaemon's workers, sized by the `daemon_workers` knob.
    pub daemon: std::sync::Mutex<Option<(u32, Arc<tokio::sync::Semaphore>)>>,
}

impl Ctx {
    /// How long a caller waits for a config or storage lock.
    pub fn lock_timeout(&self) -> Duration {
        Duration::from_millis(self.cluster().knobs.lock_timeout_ms)
    }

    /// pvedaemon's workers as the knob sizes them now (`None`: no limit).
    pub fn daemon(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        let n = self.cluster().knobs.daemon_workers;
        let mut d = self.daemon.lock().unwrap_or_else(|p| p.into_inner());
        if n == 0 {
            *d = None;
            return None;
        }
        match &*d {
            Some((size, sem)) if *size == n => Some(sem.clone()),
            _ => {
                let sem = Arc::new(tokio::sync::Semaphore::new(n as usize));
                *d = Some((n, sem.clone()));
                Some(sem)
            }
        }
    }

    /// The cluster, for a short critical section (never held across an await).
    pub fn cluster(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }
}
