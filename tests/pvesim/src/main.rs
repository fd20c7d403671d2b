use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use pvesim::{Sim, State};

/// A Proxmox VE API simulator.
#[derive(Debug, Parser)]
#[command(name = "pvesim", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8006")]
    listen: String,
    /// Cluster state file (YAML).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    http: bool,
    /// Proxmox API schema to validate requests against (default: the copy
    /// beside the repository, `../shared/pve-api/schema-subset.json`; pvesim
    /// does not start without one).
    #[arg(long)]
    schema: Option<PathBuf>,
    /// Directory for the sparse files backing disks of QMP-bound VMs.
    #[arg(long)]
    volume_dir: Option<PathBuf>,
    /// Where to write the CA certificate that signs the HTTPS certificate.
    #[arg(long, default_value = "pvesim-ca.pem")]
    ca_out: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let state = match &args.state {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            State::from_yaml(&text).with_context(|| format!("parsing {}", p.display()))?
        }
        None => State::default(),
    };
    let mut sim = Sim::new(state);
    if let Some(path) = &args.schema {
        sim = sim.with_schema(pvesim::Schema::load(path)?);
    }
    if let Some(dir) = &args.volume_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        sim = sim.volume_dir(dir.clone());
    }
    if args.http {
        sim = sim.plain_http();
    }
    let running = sim.start(&args.listen).await?;
    if let Some(ca) = &running.ca_pem {
        std::fs::write(&args.ca_out, ca)
            .with_context(|| format!("writing {}", args.ca_out.display()))?;
        tracing::info!(ca = %args.ca_out.display(), "CA certificate written");
    }
    tracing::info!(url = %running.api_url(), "pvesim listening");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
