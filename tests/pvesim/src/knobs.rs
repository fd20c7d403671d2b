//! Fault and latency knobs: set in the state file and changed at run time
//! through the admin API (`/pvesim/knobs`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Knobs {
    /// Added to every API call.
    pub api_latency_ms: u64,
    /// How long a task runs before it does its work.
    pub task_latency_ms: u64,
    /// Extra time of a config write that hot-plugs or unplugs a disk.
    pub hotplug_latency_ms: u64,
    /// Time of each disk plugged or unplugged, one after the other under
    /// the VM's lock: qemu-server plugs key by key (vm_deviceplug: about 30
    /// QMP round trips and two `lvs` probes a disk).
    pub hotplug_ms_per_disk: u64,
    /// How long the guest takes to eject a SCSI controller. With `scsihw:
    /// virtio-scsi-single` every disk has its own controller `virtioscsiN`,
    /// whose unplug qemu-server checks once a second until it is gone, at
    /// most 15 s (5 s on PVE 8), then fails `error on hot-unplugging device
    /// 'virtioscsiN' - still busy in guest?` (QemuServer.pm
    /// qemu_devicedelverify, vm_deviceunplug, qemu_deletescsihw).
    pub guest_eject_ms: u64,
    /// qemu-server's interval between those checks (1 s), scaled down by
    /// tests that exercise the 15 s limit without waiting it out.
    pub eject_poll_ms: u64,
    /// How long an `import-from` copy takes per GiB (qemu-img), holding
    /// the VM's config lock as Proxmox does.
    pub copy_ms_per_gib: u64,
    /// How long a caller waits for a VM's config lock (Proxmox: 10 s).
    pub lock_timeout_ms: u64,
    /// How long a login ticket is accepted (Proxmox: 2 hours).
    pub ticket_lifetime_ms: u64,
    /// The next N disk hot-plugs fail with `hotplug problem - …`.
    pub fail_hotplugs: u32,
    /// The next N tasks fail after their UPID was returned, having done nothing.
    pub fail_tasks: u32,
    /// The next N tasks do their work and then end in error anyway (a worker
    /// that died after writing): the caller sees a failure for work that
    /// took effect, and its retry must find that work.
    pub fail_tasks_after_work: u32,
    /// The next N successful writes (POST, PUT, DELETE) take effect and
    /// their connection is dropped before the answer (a proxy or network
    /// failure after the write): an async write's task runs, its UPID is
    /// lost. The caller's retry must find its own work.
    pub lose_answers: u32,
    /// Successful writes let through before `lose_answers` applies, so a
    /// test can lose the answer of each write of an operation in turn.
    pub lose_answers_skip: u32,
    /// How `lose_answers` loses an answer: 0 drops the connection; 596 (or
    /// 502/503/504) answers that status with an empty body, as pveproxy
    /// does when its wait for pvedaemon's answer ran out after it passed
    /// the request on (pve-http-server src/PVE/APIServer/AnyEvent.pm
    /// proxy_request, AnyEvent::HTTP's `Status => 596, Reason => "$!"`),
    /// or a gateway in front of it.
    pub lost_answer_status: u16,
    /// The next N requests have their connection dropped without an answer.
    pub drop_connections: u32,
    /// Share of requests (0.0–1.0) answered 595 before any work.
    pub error_5xx_rate: f64,
    /// The next N requests are answered 595 before any work (a count, so a
    /// test can account for every one).
    pub fail_5xx: u32,
    /// How long a new VM has no RRD data: `/cluster/resources` shows it
    /// without `name`, `template` and usage, `status: unknown`, until
    /// pvestatd's next round (Proxmox: every 10 s).
    pub rrd_lag_ms: u64,
    /// pvedaemon's workers (Proxmox: 3, pve-manager PVE/Service/pvedaemon.pm
    /// `max_workers`); every write passes through one. 0: no limit.
    pub daemon_workers: u32,
    /// How long pveproxy waits for pvedaemon's answer before it answers 596
    /// itself, the write still queued or running (pve-http-server
    /// src/PVE/APIServer/AnyEvent.pm proxy_request: `timeout => 30`).
    pub proxy_timeout_ms: u64,
    /// How long Proxmox's HA manager takes to carry out a migration it was
    /// asked for (its CRM and LRM loops, then the migration itself).
    pub ha_migrate_ms: u64,
    /// When set, a missing volume's `GET …/content/{volume}` answers this
    /// text instead of its storage type's (a Proxmox or tool version whose
    /// wording the driver has never seen).
    pub missing_volume_text: String,
    /// Volumes (`storage:name`) whose step of a config update fails, as a
    /// volume Proxmox cannot activate does; the keys written before it stay
    /// pending (qemu-server API2/Qemu.pm $updatefn writes key by key).
    pub refuse_volumes: Vec<String>,
    /// The cluster lost quorum: /etc/pve is read-only. Creating and
    /// migrating VMs answer `cluster not ready - no quorum?` (pve-cluster
    /// PVE/Cluster.pm check_cfs_quorum, called by qemu-server create_vm and
    /// migrate_vm); a cluster-wide lock (shared storage) fails with
    /// `cfs-lock '<id>' error: no quorum!` (Cluster.pm cfs_lock); writing a
    /// VM config fails as the file system refuses it.
    pub no_quorum: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            api_latency_ms: 0,
            task_latency_ms: 0,
            hotplug_latency_ms: 0,
            hotplug_ms_per_disk: 0,
            guest_eject_ms: 0,
            eject_poll_ms: 1000,
            copy_ms_per_gib: 0,
            lock_timeout_ms: 10_000,
            ticket_lifetime_ms: 7_200_000,
            fail_hotplugs: 0,
            fail_tasks: 0,
            fail_tasks_after_work: 0,
            lose_answers: 0,
            lose_answers_skip: 0,
            lost_answer_status: 0,
            drop_connections: 0,
            error_5xx_rate: 0.0,
            fail_5xx: 0,
            rrd_lag_ms: 0,
            daemon_workers: 0,
            proxy_timeout_ms: 30_000,
            ha_migrate_ms: 1000,
            missing_volume_text: String::new(),
            refuse_volumes: Vec::new(),
            no_quorum: false,
        }
    }
}

impl Knobs {
    /// Merges a JSON object of knob values; an unknown knob or a value of
    /// the wrong type is refused and nothing changes (a typo'd knob must
    /// not run a "fault" test without its fault).
    pub fn merge(&mut self, patch: &serde_json::Value) -> Result<(), String> {
        let p = patch
            .as_object()
            .ok_or_else(|| format!("expected a JSON object, got {patch}"))?;
        let mut current = serde_json::to_value(&*self).map_err(|e| e.to_string())?;
        if let Some(cur) = current.as_object_mut() {
            for (k, v) in p {
                if !cur.contains_key(k) {
                    return Err(format!("unknown knob {k:?}"));
                }
                cur.insert(k.clone(), v.clone());
            }
        }
        *self = serde_json::from_value(current).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// How often each fault was taken (`GET /pvesim/faults`), so a fault test
/// can prove its fault fired rather than trust that it did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    pub dropped_connections: u64,
    pub errors_5xx: u64,
    pub failed_hotplugs: u64,
    pub failed_tasks: u64,
    pub failed_tasks_after_work: u64,
    pub lost_answers: u64,
    /// Writes answered 596 by the proxy while pvedaemon's workers were
    /// busy; each is still carried out when a worker takes it.
    pub proxy_timeouts: u64,
    /// Config-lock holds asked through the admin API.
    pub held_locks: u64,
}

/// Takes one from a "next N" counter; true if it was positive.
pub fn take(counter: &mut u32) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}
