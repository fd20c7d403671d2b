//! `bench <what>`: the benchmarks, each comparing side by side in one run.
//! The figures are recorded in docs/BENCHMARKS.md with the command.

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "Benchmarks of the Proxmox CSI driver, side by side"
)]
struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Bursts with Proxmox's per-disk costs: N volumes attached to and detached from one VM at once (virtio-scsi-pci and -single), and 30 VMs x 4 volumes; this controller against the Go driver's one-at-a-time strategy.
    AttachBurst {
        #[arg(long, default_value_t = 24)]
        volumes: usize,
    },
    /// Volumes created and published over 3 nodes and 30 VMs with 50 ms per API call, per-disk hot-plug costs and RRD lag; then a restart.
    Scale {
        /// Checkpoints: total volumes at each.
        #[arg(long, value_delimiter = ',', default_value = "100,300,1000")]
        sizes: Vec<usize>,
        /// CreateVolume calls in flight (the provisioner's workers).
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        #[arg(long, default_value_t = 50)]
        latency_ms: u64,
    },
    /// hostd's Stage against bare mkfs + mount on loop devices (root; hostd with the loop-resolver feature).
    Stage {
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// Kubernetes API requests, and the objects they return, per publish, unpublish, ListVolumes and delete as the cluster grows: the controller's watch caches against reading every lookup from the API.
    KubeCalls {
        /// Cluster sizes: PersistentVolumes of the driver.
        #[arg(long, value_delimiter = ',', default_value = "100,10000")]
        sizes: Vec<usize>,
    },
    /// In the guest VM: NodeStage with LUKS against bare cryptsetup + mkfs.xfs + mount (QEMU).
    GuestStage {
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    match Args::parse().what {
        What::AttachBurst { volumes } => {
            use bench::burst::{self, Hw};
            println!(
                "bursts: {} ms per API call, {} ms per plugged disk, {} ms guest eject per unplugged virtio-scsi-single disk",
                burst::API_MS,
                burst::PER_DISK_MS,
                burst::EJECT_MS
            );
            println!(
                "  | VMs x volumes | scsihw | phase | driver | seconds | floor s | ratio | config writes | API calls |"
            );
            for hw in [Hw::Pci, Hw::Single] {
                let ours = burst::ours(volumes, hw).await?;
                let go = burst::go_like(volumes, hw).await?;
                anyhow::ensure!(
                    ours.attached == volumes
                        && ours.left == 0
                        && go.attached == volumes
                        && go.left == 0,
                    "a burst left the VM wrong: {ours:?} {go:?}"
                );
                for (name, p, g) in [
                    ("attach", ours.attach, go.attach),
                    ("detach", ours.detach, go.detach),
                ] {
                    for (driver, x) in [("this controller", p), ("Go driver's way", g)] {
                        println!(
                            "  | 1 x {volumes} | {} | {name} | {driver} | {:.2} | {:.2} | {:.2} | {} | {} |",
                            hw.scsihw(),
                            x.seconds,
                            x.floor,
                            x.ratio(),
                            x.writes,
                            x.calls
                        );
                    }
                    println!(
                        "  speed-up ({} {name}): {:.1}x",
                        hw.scsihw(),
                        g.seconds / p.seconds
                    );
                }
            }
            let (ours, go) = burst::many_vms(30, 4).await?;
            for (driver, x) in [("this controller", ours), ("Go driver's way", go)] {
                println!(
                    "  | 30 x 4 | virtio-scsi-pci | attach | {driver} | {:.2} | {:.2} | {:.2} | {} | {} |",
                    x.seconds,
                    x.floor,
                    x.ratio(),
                    x.writes,
                    x.calls
                );
            }
            println!("  speed-up (30 x 4): {:.1}x", go.seconds / ours.seconds);
        }
        What::Scale {
            sizes,
            concurrency,
            latency_ms,
        } => {
            println!(
                "scale: {} nodes, {} VMs, {latency_ms} ms per API call, {} ms per plugged disk, {} ms RRD lag, {concurrency} creates in flight; controller binary",
                bench::scale::NODES,
                bench::scale::NODES * bench::scale::VMS_PER_NODE,
                bench::scale::PER_DISK_MS,
                bench::scale::RRD_LAG_MS
            );
            let run = bench::scale::run(&sizes, concurrency, latency_ms).await?;
            println!(
                "  controller resident memory idle: {} KiB",
                run.idle_rss_kib
            );
            println!(
                "  | volumes | CreateVolume p50 / p99 ms | calls/create | ControllerPublish p50 / p99 ms | calls/publish | calls/unpublish | controller RSS KiB |"
            );
            for c in &run.checkpoints {
                println!(
                    "  | {} | {:.0} / {:.0} | {:.2} | {:.0} / {:.0} | {:.2} | {:.2} | {} |",
                    c.volumes,
                    c.create_p50_ms,
                    c.create_p99_ms,
                    c.calls_per_create,
                    c.publish_p50_ms,
                    c.publish_p99_ms,
                    c.calls_per_publish,
                    c.calls_per_unpublish,
                    c.rss_kib
                );
            }
            println!(
                "  controller peak resident memory: {} KiB",
                run.peak_rss_kib
            );
            println!(
                "  first ControllerPublish after a restart: {:.0} ms, {} Proxmox calls",
                run.restart_publish_ms, run.restart_publish_calls
            );
        }
        What::Stage { rounds } => {
            println!("stage: median of {rounds} rounds on fresh 1 GiB loop devices");
            let (rows, idle) = bench::stage::compare(rounds).await?;
            println!(
                "  resident memory idle: hostd {} KiB, node plugin {} KiB",
                idle.0, idle.1
            );
            println!(
                "  | filesystem | hostd Stage ms | bare mkfs + mount ms | overhead ms | hostd RSS after KiB |"
            );
            for r in rows {
                println!(
                    "  | {} | {:.0} | {:.0} | {:+.0} | {} |",
                    r.fs,
                    r.hostd_ms,
                    r.bare_ms,
                    r.hostd_ms - r.bare_ms,
                    r.hostd_rss_kib
                );
            }
        }
        What::KubeCalls { sizes } => {
            println!(
                "Kubernetes calls per operation: the controller on pvesim and kubesim; requests / objects returned"
            );
            println!(
                "  | PVs | controller | caches' first list (requests / objects, ms) | publish | unpublish | ListVolumes | delete |"
            );
            for n in sizes {
                for watched in [false, true] {
                    let r = bench::kube_calls::measure(n.saturating_sub(1), watched).await?;
                    let c = |c: bench::kube_calls::Cost| format!("{} / {}", c.requests, c.objects);
                    println!(
                        "  | {} | {} | {} | {} | {} | {} | {} |",
                        r.pvs,
                        if r.watched {
                            "watch caches"
                        } else {
                            "reads every lookup"
                        },
                        if r.watched {
                            format!("{}, {} ms", c(r.sync), r.sync_ms)
                        } else {
                            "none".into()
                        },
                        c(r.publish),
                        c(r.unpublish),
                        c(r.list_volumes),
                        c(r.delete)
                    );
                }
            }
        }
        What::GuestStage { rounds } => {
            println!(
                "guest stage: median of {rounds} rounds, LUKS2 + xfs on hot-plugged 1 GiB disks, QEMU TCG, 1 GiB guest"
            );
            let r = bench::guest_stage::run(rounds).await?;
            println!(
                "  | key derivation | NodeStage (node plugin + hostd) ms | bare cryptsetup luksFormat + open + mkfs.xfs + mount ms | overhead ms |"
            );
            for (kdf, ours, bare) in &r.medians {
                println!(
                    "  | {kdf:?} | {ours:.0} | {bare:.0} | {:+.0} |",
                    ours - bare
                );
            }
            println!(
                "  six argon2id NodeStage calls at once: {:.0} ms until the last; Probe (hostd Health via the node plugin) {} times meanwhile: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms, {} over 100 ms",
                r.six_wall,
                r.probes,
                r.probe_p50,
                r.probe_p90,
                r.probe_p99,
                r.probe_max,
                r.probes_over_100ms
            );
        }
    }
    Ok(())
}
