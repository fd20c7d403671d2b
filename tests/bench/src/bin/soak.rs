//! `soak [--seconds N] [--seed S]`: the fault campaign (see bench::soak).
//! Short in CI (tests/soak.rs), as long as wanted by hand.

use std::time::Duration;

use anyhow::Result;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "soak",
    about = "Random CSI operations against pvesim with faults and controller crashes; checks what is left"
)]
struct Args {
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Seed of the random choices (printed, so that a run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// Chance of a fault before each operation.
    #[arg(long, default_value_t = 0.25)]
    fault_rate: f64,
}

#[tokio::main]
async fn main() -> Result<std::process::ExitCode> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    println!(
        "soak: {} s, seed {seed}, fault rate {}",
        args.seconds, args.fault_rate
    );
    let out = bench::soak::run(seed, Duration::from_secs(args.seconds), args.fault_rate).await?;
    print!("{}", out.render());
    Ok(if out.violations.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}
