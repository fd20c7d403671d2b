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
    /// ControllerPublish bursts through the external-attacher's workers (10, a 15 s deadline, 1 s..5 min backoff) for the arrival patterns a cluster makes, against Proxmox's floor for the same arrivals.
    SidecarBurst {
        #[arg(long, default_value_t = 24)]
        volumes: usize,
    },
    /// Volumes created over many VMs (10,000 on 100 by default) with 50 ms per API call, per-disk hot-plug costs and RRD lag; at each checkpoint a publish to every VM and the attacher's ListVolumes; then restarts.
    Scale {
        /// Checkpoints: total volumes at each.
        #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
        sizes: Vec<usize>,
        /// Worker VMs, spread evenly over the nodes.
        #[arg(long, default_value_t = 100)]
        vms: usize,
        /// Proxmox nodes.
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        /// CreateVolume calls in flight (external-provisioner's `--worker-threads`, 100 by default).
        #[arg(long, default_value_t = 100)]
        concurrency: usize,
        #[arg(long, default_value_t = 50)]
        latency_ms: u64,
    },
    /// hostd's Stage against bare mkfs + mount on loop devices (root; hostd with the loop-resolver feature).
    Stage {
        /// A stage is tens of milliseconds, which the machine's disk moves
        /// by a few: enough rounds for steady medians.
        #[arg(long, default_value_t = 15)]
        rounds: usize,
    },
    /// Resident memory of hostd and the node plugin idle, with N ext4 volumes staged and published on loop devices, and after unstaging them (root; hostd with the loop-resolver feature).
    Footprint {
        #[arg(long, default_value_t = 30)]
        volumes: usize,
        /// Size of each volume's image, MiB.
        #[arg(long, default_value_t = 64)]
        image_mib: u64,
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
    /// In two guest VMs: a new volume's way to a pod, and its moves to
    /// another pod and another node, phase by phase against the floor (QEMU).
    GuestPod {
        /// Rounds are cheap (about 5 s each) and the guests' timings vary
        /// under TCG: enough of them for steady medians.
        #[arg(long, default_value_t = 9)]
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
        What::SidecarBurst { volumes } => {
            println!(
                "bursts through the external-attacher (10 workers, 15 s deadline, 1 s..5 min backoff): {} ms per API call, {} ms per plugged disk",
                bench::burst::API_MS,
                bench::burst::PER_DISK_MS
            );
            println!(
                "  | pattern | volumes | seconds | floor s (10 workers) | ratio | Proxmox alone s | config writes | API calls | retries | most calls in flight |"
            );
            for r in bench::sidecar_burst::run(volumes).await? {
                println!(
                    "  | {} | {} | {:.2} | {:.2} | {:.3} | {:.2} | {} | {} | {} | {} |",
                    r.pattern,
                    r.volumes,
                    r.seconds,
                    r.floor,
                    r.ratio(),
                    r.proxmox_floor,
                    r.writes,
                    r.calls,
                    r.retries,
                    r.in_flight
                );
            }
        }
        What::Scale {
            sizes,
            vms,
            nodes,
            concurrency,
            latency_ms,
        } => {
            println!(
                "scale: {nodes} nodes, {vms} VMs, {latency_ms} ms per API call, {} ms per plugged disk, {} ms RRD lag, {concurrency} creates in flight; controller binary",
                bench::scale::PER_DISK_MS,
                bench::scale::RRD_LAG_MS
            );
            let shape = bench::scale::Shape { nodes, vms };
            let run = bench::scale::run(shape, &sizes, concurrency, latency_ms).await?;
            println!(
                "  controller resident memory idle: {} KiB",
                run.idle_rss_kib
            );
            println!(
                "  | volumes | CreateVolume p50 / p99 ms | calls/create | ControllerPublish p50 / p99 ms ({vms} at once) | calls/publish | calls/unpublish | controller RSS / peak KiB |"
            );
            for c in &run.checkpoints {
                println!(
                    "  | {} | {:.0} / {:.0} | {:.2} | {:.0} / {:.0} | {:.2} | {:.2} | {} / {} |",
                    c.volumes,
                    c.create_p50_ms,
                    c.create_p99_ms,
                    c.calls_per_create,
                    c.publish_p50_ms,
                    c.publish_p99_ms,
                    c.calls_per_publish,
                    c.calls_per_unpublish,
                    c.rss_kib,
                    c.peak_rss_kib
                );
            }
            println!(
                "  ListVolumes as the external-attacher sends it (every page), {vms} volumes published:"
            );
            println!(
                "  | volumes | when | ms | pages | entries / published | API calls | VM config reads / VMs | calls by endpoint |"
            );
            let rows = run
                .checkpoints
                .iter()
                .map(|c| (c.volumes, "running", &c.list))
                .chain(std::iter::once((
                    run.checkpoints.last().map_or(0, |c| c.volumes),
                    "first after a restart",
                    &run.restart_list,
                )));
            for (volumes, when, l) in rows {
                println!(
                    "  | {volumes} | {when} | {:.0} | {} | {} / {} | {} | {} / {vms} | {} |",
                    l.ms,
                    l.pages,
                    l.entries,
                    l.published,
                    l.total_calls(),
                    l.config_reads(),
                    l.by_endpoint()
                );
            }
            println!(
                "  restarted controller after its first ListVolumes: RSS {} KiB, peak {} KiB",
                run.restart_list_rss_kib.0, run.restart_list_rss_kib.1
            );
            println!(
                "  first ControllerPublish after a restart: {:.0} ms, {} Proxmox calls, {} of them VM config reads",
                run.restart_publish_ms, run.restart_publish_calls, run.restart_publish_config_reads
            );
            println!("  whole run: {:.0} s", run.seconds);
        }
        What::Stage { rounds } => {
            let (rows, idle, pieces) = bench::stage::compare(rounds).await?;
            bench::stage::print(rounds, &rows, idle, &pieces);
        }
        What::Footprint { volumes, image_mib } => {
            println!(
                "footprint: hostd and the node plugin (uid 65534), {volumes} ext4 volumes of {image_mib} MiB on loop devices, each staged and published"
            );
            let f = bench::footprint::run(volumes, image_mib << 20).await?;
            println!(
                "  | process | idle RSS / peak KiB | {} staged + published RSS / peak KiB | all unstaged RSS / peak KiB |",
                f.volumes
            );
            for (name, a, b, c) in [
                ("hostd", f.idle.hostd, f.staged.hostd, f.unstaged.hostd),
                ("node plugin", f.idle.node, f.staged.node, f.unstaged.node),
            ] {
                println!(
                    "  | {name} | {} / {} | {} / {} | {} / {} |",
                    a.0, a.1, b.0, b.1, c.0, c.1
                );
            }
            println!(
                "  {} stages + publishes one after the other: {:.1} s; left behind: {} loop devices, {} mounts",
                f.volumes, f.stage_publish_s, f.loops_left, f.mounts_left
            );
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
            bench::guest_stage::print(&bench::guest_stage::run(rounds).await?);
        }
        What::GuestPod { rounds } => {
            bench::guest_pod::print(&bench::guest_pod::run(rounds).await?);
        }
    }
    Ok(())
}
