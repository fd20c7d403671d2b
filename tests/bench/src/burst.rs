//! Bursts: N volumes published at once to one VM and then unpublished at
//! once, and 30 VMs taking 4 volumes each at once; this controller
//! (coalescing per VM) and the Go driver's one-at-a-time strategy, on fresh
//! simulators with the same costs, side by side.
//!
//! The cost model (pvesim knobs, `COSTS`), each from Proxmox's source:
//! - 20 ms per API call (pveproxy to pvedaemon, a config read or write);
//! - 300 ms per plugged or unplugged disk: qemu-server plugs the keys of a
//!   config update one after another under the VM's lock
//!   (QemuServer.pm vmconfig_hotplug_pending; vm_deviceplug runs about 30
//!   QMP round trips and two `lvs` probes per disk);
//! - with `scsihw: virtio-scsi-single`, each disk's own controller is
//!   unplugged after the guest ejected it, checked once a second
//!   (QemuServer.pm qemu_devicedelverify): 1 s per detached disk here.
//!
//! The floor is what Proxmox itself imposes on a burst: the per-disk costs
//! of every disk of the VM (they are serial under its lock) plus one task's
//! round trips (the POST and one status read).

use std::time::Instant;

use anyhow::{Context, Result};
use callers::{PersistentVolume, attacher, provisioner};
use futures::future::join_all;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::Request;

use crate::golike::GoLike;
use crate::sim::Sim;

pub const API_MS: u64 = 20;
pub const PER_DISK_MS: u64 = 300;
pub const EJECT_MS: u64 = 1000;
const COSTS: &str = r#"{"api_latency_ms": 20, "hotplug_ms_per_disk": 300, "guest_eject_ms": 1000, "lock_timeout_ms": 10000}"#;

/// The SCSI controller type of the worker VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hw {
    /// `virtio-scsi-pci`: one controller for every disk.
    Pci,
    /// `virtio-scsi-single`: a controller per disk, unplugged after the guest's eject.
    Single,
}

impl Hw {
    pub fn scsihw(self) -> &'static str {
        match self {
            Hw::Pci => "virtio-scsi-pci",
            Hw::Single => "virtio-scsi-single",
        }
    }

    /// What Proxmox spends on one disk of a burst, attaching or detaching.
    fn per_disk_ms(self, detach: bool) -> u64 {
        match (self, detach) {
            (Hw::Single, true) => PER_DISK_MS + EJECT_MS,
            _ => PER_DISK_MS,
        }
    }
}

/// One phase of a burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    pub seconds: f64,
    /// Proxmox's own cost of the phase, in seconds.
    pub floor: f64,
    pub writes: u64,
    pub calls: u64,
}

impl Phase {
    pub fn ratio(&self) -> f64 {
        self.seconds / self.floor
    }
}

/// A burst to one VM: the attaches, then the detaches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    pub attach: Phase,
    pub detach: Phase,
    /// Disks on the VM after the attaches, and after the detaches.
    pub attached: usize,
    pub left: usize,
}

/// The floor of `disks` disks on one VM. The bench's workers have no other
/// SCSI disk, so the detach of the last one leaves `virtio-scsi-pci`'s
/// controller empty, and Proxmox unplugs it too after the guest's eject
/// (qemu-server `qemu_deletescsihw`; pvesim `controller_left_empty`).
fn floor(hw: Hw, disks: usize, detach: bool) -> f64 {
    let last_controller = if detach && hw == Hw::Pci && disks > 0 {
        EJECT_MS
    } else {
        0
    };
    (disks as u64 * hw.per_disk_ms(detach) + last_controller + 2 * API_MS) as f64 / 1000.0
}

/// pvesim with `vms` running workers on pve1 (VM ids from 200) of `hw`,
/// local-lvm, and the CSI token with the documented minimal role.
fn cluster(vms: usize, hw: Hw) -> String {
    let workers: String = (0..vms)
        .map(|i| {
            format!(
                "  - {{ vmid: {}, node: pve1, name: worker-{}, config: {{ scsihw: {} }} }}\n",
                200 + i,
                200 + i,
                hw.scsihw()
            )
        })
        .collect();
    format!(
        "cluster: bench\nnodes: [{{ name: pve1 }}]\nstorages:\n  - {{ id: local-lvm, type: lvmthin, total: 109951162777600 }}\nvms:\n{workers}\
         users:\n  - userid: kubernetes-csi@pve\n    tokens: [{{ name: csi, secret: {} }}]\n\
         roles:\n  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]\n\
         acl:\n  - {{ path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: [\"{}\"] }}\n",
        crate::sim::SECRET,
        crate::sim::TOKEN
    )
}

/// `n` volumes on pve1 made as the provisioner makes them (no costs yet),
/// then the costs set; the PersistentVolumes it wrote.
pub(crate) async fn prepared(vms: usize, n: usize, hw: Hw) -> Result<(Sim, Vec<PersistentVolume>)> {
    let sim = Sim::start(&cluster(vms, hw)).await?;
    let ctl = sim.controller()?;
    let sc = provisioner::StorageClass::new(&[
        ("storage", "local-lvm"),
        ("csi.storage.k8s.io/fstype", "ext4"),
    ]);
    let mut pvs = Vec::new();
    for i in 0..n {
        let claim =
            provisioner::Claim::new(&format!("burst-{i:03}"), &format!("burst-{i:03}"), 1 << 30);
        pvs.push(crate::sim::provision(&ctl, &sc, &claim, "pve1").await?);
    }
    sim.knobs(COSTS).await?;
    sim.reset_counters().await?;
    Ok((sim, pvs))
}

/// SCSI disks on VM `vmid`.
pub(crate) async fn disks(sim: &Sim, vmid: u32) -> Result<usize> {
    let vm = sim
        .admin(reqwest::Method::GET, &format!("vms/{vmid}"), "")
        .await?;
    Ok(vm["config"]
        .as_object()
        .map(|m| {
            m.keys()
                .filter(|k| {
                    k.strip_prefix("scsi")
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                })
                .count()
        })
        .unwrap_or(0))
}

/// A controller on `sim` as one that has been running is: the attacher's
/// reconcile (ListVolumes, every minute) has built its attachment index.
pub(crate) async fn running_controller(
    sim: &Sim,
) -> Result<proxmox_csi_controller::csi::controller::ControllerService> {
    let ctl = sim.controller()?;
    ctl.list_volumes(Request::new(attacher::list_volumes("")))
        .await
        .context("list volumes")?;
    Ok(ctl)
}

/// Measures `run`, with the calls and config writes it made.
async fn phase<F: std::future::Future<Output = Result<()>>>(
    sim: &Sim,
    floor: f64,
    run: F,
) -> Result<Phase> {
    sim.reset_counters().await?;
    let started = Instant::now();
    run.await?;
    let seconds = started.elapsed().as_secs_f64();
    let (calls, writes) = sim.calls_and_writes().await?;
    Ok(Phase {
        seconds,
        floor,
        writes,
        calls,
    })
}

pub(crate) fn node_id(vmid: u32) -> String {
    format!("worker-{vmid}/{vmid}")
}

/// This controller: every publish at once as the attacher sends them, then
/// every unpublish at once.
pub async fn ours(n: usize, hw: Hw) -> Result<Burst> {
    let (sim, pvs) = prepared(1, n, hw).await?;
    let ctl = running_controller(&sim).await?;
    let attach = phase(&sim, floor(hw, n, false), async {
        for r in join_all(pvs.iter().map(|pv| {
            ctl.controller_publish_volume(Request::new(attacher::controller_publish(
                pv,
                &node_id(200),
            )))
        }))
        .await
        {
            r.context("publish")?;
        }
        Ok(())
    })
    .await?;
    let attached = disks(&sim, 200).await?;
    let detach = phase(&sim, floor(hw, n, true), async {
        for r in join_all(pvs.iter().map(|pv| {
            ctl.controller_unpublish_volume(Request::new(attacher::controller_unpublish(
                pv,
                &node_id(200),
            )))
        }))
        .await
        {
            r.context("unpublish")?;
        }
        Ok(())
    })
    .await?;
    Ok(Burst {
        attach,
        detach,
        attached,
        left: disks(&sim, 200).await?,
    })
}

/// The volid of a PV's handle (`region/zone/storage/disk`).
fn volid(pv: &PersistentVolume) -> String {
    let mut parts = pv.handle.splitn(4, '/').skip(2);
    format!(
        "{}:{}",
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default()
    )
}

/// The Go driver's strategy on the same burst.
pub async fn go_like(n: usize, hw: Hw) -> Result<Burst> {
    let (sim, pvs) = prepared(1, n, hw).await?;
    let go = GoLike::new(&sim.api_url());
    let attach = phase(&sim, floor(hw, n, false), async {
        let calls = pvs.iter().enumerate().map(|(i, pv)| {
            let go = &go;
            async move {
                go.attach(
                    "pve1",
                    200,
                    "local-lvm",
                    &volid(pv),
                    &format!("0x5056432d4944{i:04x}"),
                )
                .await
            }
        });
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    })
    .await?;
    let attached = disks(&sim, 200).await?;
    let detach = phase(&sim, floor(hw, n, true), async {
        let calls = pvs.iter().map(|pv| {
            let go = &go;
            async move { go.detach("pve1", 200, &volid(pv)).await }
        });
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    })
    .await?;
    Ok(Burst {
        attach,
        detach,
        attached,
        left: disks(&sim, 200).await?,
    })
}

/// `vms` VMs taking `per_vm` volumes each, all at once (virtio-scsi-pci):
/// this controller and the Go strategy. The floor is one VM's: VMs plug in
/// parallel, each its own disks in turn.
pub async fn many_vms(vms: usize, per_vm: usize) -> Result<(Phase, Phase)> {
    let target = |i: usize| 200 + (i / per_vm) as u32;
    let (sim, pvs) = prepared(vms, vms * per_vm, Hw::Pci).await?;
    let ctl = running_controller(&sim).await?;
    let ours = phase(&sim, floor(Hw::Pci, per_vm, false), async {
        let calls = pvs.iter().enumerate().map(|(i, pv)| {
            ctl.controller_publish_volume(Request::new(attacher::controller_publish(
                pv,
                &node_id(target(i)),
            )))
        });
        for r in join_all(calls).await {
            r.context("publish")?;
        }
        Ok(())
    })
    .await?;
    let (sim, pvs) = prepared(vms, vms * per_vm, Hw::Pci).await?;
    let go = GoLike::new(&sim.api_url());
    let go_phase = phase(&sim, floor(Hw::Pci, per_vm, false), async {
        let calls = pvs.iter().enumerate().map(|(i, pv)| {
            let go = &go;
            async move {
                go.attach(
                    "pve1",
                    target(i),
                    "local-lvm",
                    &volid(pv),
                    &format!("0x5056432d4944{i:04x}"),
                )
                .await
            }
        });
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    })
    .await?;
    Ok((ours, go_phase))
}
