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
    }
    Ok(())
}
