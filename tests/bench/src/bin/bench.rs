//! `bench <what>`: the benchmarks, each comparing side by side in one run.
//! The figures are recorded in docs/BENCHMARKS.md with the command.

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bench", about = "Benchmarks of the Proxmox CSI driver, side by side")]
struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// N volumes published at once to one VM: this controller against the Go driver's one-at-a-time attach.
    AttachBurst {
        #[arg(long, default_value_t = 24)]
        volumes: usize,
    },
    /// Volumes created and published over 3 nodes and 30 VMs with 50 ms per API call.
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
            println!("attach burst: {volumes} volumes published at once to one VM (20 ms per API call, 300 ms per hot-plug write)");
            let ours = bench::burst::ours(volumes).await?;
            println!("  this controller: {:.2} s, {} config writes, {} API calls, {} disks attached", ours.seconds, ours.writes, ours.calls, ours.attached);
            let go = bench::burst::go_like(volumes).await?;
            println!("  Go driver's way: {:.2} s, {} config writes, {} API calls, {} disks attached", go.seconds, go.writes, go.calls, go.attached);
            println!("  speed-up {:.1}x, config writes {:.1}x fewer", go.seconds / ours.seconds, go.writes as f64 / ours.writes.max(1) as f64);
        }
        What::Scale { sizes, concurrency, latency_ms } => {
            println!("scale: {} nodes, {} VMs, {latency_ms} ms per API call, {concurrency} creates in flight; controller binary", bench::scale::NODES, bench::scale::NODES * bench::scale::VMS_PER_NODE);
            let run = bench::scale::run(&sizes, concurrency, latency_ms).await?;
            println!("  controller resident memory idle: {} KiB", run.idle_rss_kib);
            println!("  | volumes | CreateVolume p50 / p99 ms | calls/create | ControllerPublish p50 / p99 ms | calls/publish | calls/unpublish | controller RSS KiB |");
            for c in &run.checkpoints {
                println!(
                    "  | {} | {:.0} / {:.0} | {:.2} | {:.0} / {:.0} | {:.2} | {:.2} | {} |",
                    c.volumes, c.create_p50_ms, c.create_p99_ms, c.calls_per_create, c.publish_p50_ms, c.publish_p99_ms, c.calls_per_publish, c.calls_per_unpublish, c.rss_kib
                );
            }
            println!("  controller peak resident memory: {} KiB", run.peak_rss_kib);
        }
        What::Stage { rounds } => {
            println!("stage: median of {rounds} rounds on fresh 1 GiB loop devices");
            let (rows, idle) = bench::stage::compare(rounds).await?;
            println!("  resident memory idle: hostd {} KiB, node plugin {} KiB", idle.0, idle.1);
            println!("  | filesystem | hostd Stage ms | bare mkfs + mount ms | overhead ms | hostd RSS after KiB |");
            for r in rows {
                println!("  | {} | {:.0} | {:.0} | {:+.0} | {} |", r.fs, r.hostd_ms, r.bare_ms, r.hostd_ms - r.bare_ms, r.hostd_rss_kib);
            }
        }
        What::GuestStage { rounds } => {
            println!("guest stage: median of {rounds} rounds, LUKS2 (PBKDF2 1000) + xfs on hot-plugged 1 GiB disks, QEMU TCG");
            let (ours, bare) = bench::guest_stage::compare(rounds).await?;
            println!("  NodeStage (through the node plugin and hostd): {ours:.0} ms");
            println!("  bare cryptsetup luksFormat + open + mkfs.xfs + mount: {bare:.0} ms");
            println!("  overhead: {:+.0} ms", ours - bare);
        }
    }
    Ok(())
}
