//! pvecsictl: `doctor` and `clean` for the Proxmox CSI driver.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::pve::{Client, Deadline};
use proxmox_csi_controller::volume::ClusterId;
use pvecsictl::output::{self, Format};
use pvecsictl::state::State;

#[derive(Debug, Parser)]
#[command(
    name = "pvecsictl",
    version,
    about = "Diagnose and clean up the Proxmox CSI driver's volumes"
)]
struct Args {
    /// The driver's cloud config (clusters and the API token); doctor and clean need it.
    #[arg(long, env = "PROXMOX_CSI_CLOUD_CONFIG")]
    config: Option<PathBuf>,
    /// Namespace of the claims (default: the kubeconfig context's).
    #[arg(short, long)]
    namespace: Option<String>,
    /// kubeconfig; the usual lookup (KUBECONFIG, ~/.kube/config, in-cluster) when absent.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    #[arg(long, default_value = proxmox_csi_common::contract::DRIVER_NAME)]
    driver_name: String,
    /// Output: a table, or JSON for scripts.
    #[arg(short, long, value_enum, default_value = "table")]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check what commonly breaks; exits 1 when something is wrong.
    Doctor,
    /// List the driver's disks no PersistentVolume refers to; delete them with --yes.
    Clean {
        /// Delete the disks judged this cluster's and unused.
        #[arg(long)]
        yes: bool,
        /// This Kubernetes cluster's id, as the controller writes it into disk
        /// names; needed with --yes when disks without one are seen.
        #[arg(long, value_parser = ClusterId::parse)]
        cluster_id: Option<ClusterId>,
        /// Also delete unused disks named without a cluster id (the Go
        /// driver's): only where no other Kubernetes cluster uses this Proxmox.
        #[arg(long)]
        include_unattributed: bool,
        /// Keep disks younger than this (a CreateVolume may still be running).
        #[arg(long, default_value_t = 24)]
        min_age_hours: u32,
    },
    /// Give a claim's volume to a claim of another name.
    #[command(alias = "re")]
    Rename {
        pvc: String,
        new: String,
        #[command(flatten)]
        opts: RebindFlags,
    },
    /// Move a claim's volume on local storage to another Proxmox node (token only).
    #[command(alias = "m")]
    Migrate {
        pvc: String,
        node: String,
        #[command(flatten)]
        opts: RebindFlags,
        /// Seconds the Proxmox copy may take.
        #[arg(long, default_value_t = 10_800)]
        timeout: u64,
    },
    /// Two claims trade their volumes.
    #[command(alias = "sw")]
    Swap {
        a: String,
        b: String,
        #[command(flatten)]
        opts: RebindFlags,
    },
}

/// The flags of rename, swap and migrate.
#[derive(Debug, clap::Args)]
struct RebindFlags {
    /// Delete the pods that use the claims (their nodes are cordoned meanwhile).
    #[arg(short, long)]
    force: bool,
    /// Print the plan; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Finish an interrupted run recorded on the volumes.
    #[arg(long, conflicts_with = "rollback")]
    resume: bool,
    /// Undo an interrupted run recorded on the volumes (migrate: bring it back).
    #[arg(long)]
    rollback: bool,
}

impl RebindFlags {
    fn options(&self) -> pvecsictl::rebind::Options {
        pvecsictl::rebind::Options {
            force: self.force,
            dry_run: self.dry_run,
            resume: self.resume,
            rollback: self.rollback,
            bind_wait: None,
        }
    }
}

async fn kube_client(path: Option<&PathBuf>) -> Result<kube::Client> {
    let config = match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration found (use --kubeconfig)")?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn run(args: Args) -> Result<bool> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kube = kube_client(args.kubeconfig.as_ref()).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| kube.default_namespace().to_string());
    let rebind = |op: &str, pairs: Vec<(String, String)>, flags: &RebindFlags| {
        let k = pvecsictl::rebind::Kube {
            client: kube.clone(),
            namespace: namespace.clone(),
        };
        let (op, opts, dry) = (op.to_string(), flags.options(), flags.dry_run);
        async move {
            let steps = pvecsictl::rebind::run(&k, &op, &pairs, opts).await?;
            if dry {
                println!("{op} would, in order:");
            }
            for s in steps {
                println!("  {s}");
            }
            Ok::<bool, anyhow::Error>(true)
        }
    };
    match &args.command {
        Command::Rename { pvc, new, opts } => {
            return rebind("rename", vec![(pvc.clone(), new.clone())], opts).await;
        }
        Command::Swap { a, b, opts } => {
            return rebind(
                "swap",
                vec![(a.clone(), b.clone()), (b.clone(), a.clone())],
                opts,
            )
            .await;
        }
        _ => {}
    }
    let config = args
        .config
        .as_ref()
        .context("--config (the cloud config) is required for doctor, clean and migrate")?;
    let cfg = CloudConfig::load(config)?;
    let vmids = cfg.vmids();
    let clients: Vec<Arc<Client>> = cfg
        .clusters
        .into_iter()
        .map(|c| Client::new(c, Duration::from_secs(30), Default::default()).map(Arc::new))
        .collect::<Result<_, _>>()?;
    if let Command::Migrate {
        pvc,
        node,
        opts,
        timeout,
    } = &args.command
    {
        let k = pvecsictl::rebind::Kube {
            client: kube.clone(),
            namespace,
        };
        let steps = pvecsictl::migrate::run(
            &k,
            &clients,
            vmids,
            pvc,
            node,
            opts.options(),
            Duration::from_secs(*timeout),
        )
        .await?;
        if opts.dry_run {
            println!("migrate would, in order:");
        }
        for s in steps {
            println!("  {s}");
        }
        return Ok(true);
    }
    let state = State::read(&clients, &kube, vmids.controller, &args.driver_name).await?;
    match args.command {
        Command::Doctor => {
            let findings = pvecsictl::doctor::run(&state);
            println!("{}", output::findings(&findings, args.output));
            Ok(!pvecsictl::doctor::failed(&findings))
        }
        Command::Clean {
            yes,
            cluster_id,
            include_unattributed,
            min_age_hours,
        } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            let opts = pvecsictl::clean::Options {
                cluster_id,
                include_unattributed,
                min_age_secs: i64::from(min_age_hours) * 3600,
            };
            let orphans = pvecsictl::clean::orphans(&state, &opts, now);
            println!("{}", output::orphans(&orphans, args.output));
            let doomed: Vec<_> = orphans
                .iter()
                .filter(|o| o.verdict == pvecsictl::clean::Verdict::Delete)
                .collect();
            if !yes {
                if !doomed.is_empty() {
                    eprintln!(
                        "nothing deleted; run again with --yes to delete the {} disk(s) marked delete",
                        doomed.len()
                    );
                }
                return Ok(true);
            }
            if let Err(refusal) = pvecsictl::clean::check_yes(&state, &opts, &orphans) {
                eprintln!("pvecsictl clean: {refusal}");
                return Ok(false);
            }
            let mut ok = true;
            for o in doomed {
                let client = clients
                    .iter()
                    .find(|c| c.region() == o.region)
                    .context("region")?;
                let (storage, name) = o.volid.split_once(':').unwrap_or_default();
                match client
                    .delete_volume(
                        &o.node,
                        storage,
                        name,
                        Deadline::after(Duration::from_secs(120)),
                    )
                    .await
                {
                    Ok(()) => eprintln!("deleted {}", o.volid),
                    Err(e) => {
                        ok = false;
                        eprintln!("deleting {}: {e}", o.volid);
                    }
                }
            }
            Ok(ok)
        }
        Command::Rename { .. } | Command::Swap { .. } | Command::Migrate { .. } => Ok(true),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("pvecsictl: {e:#}");
            ExitCode::from(2)
        }
    }
}
