//! The Kubernetes client of the controller and the node plugin.

/// A client from `kubeconfig` (Go's `--kubeconfig`), else from the
/// in-cluster configuration or `KUBECONFIG`.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| format!("reading {}: {e}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    tracing::info!(
        server = %config.cluster_url,
        from = %kubeconfig.map_or("the in-cluster configuration or KUBECONFIG".into(), |p| p.display().to_string()),
        "Kubernetes API"
    );
    kube::Client::try_from(config).map_err(|e| e.to_string())
}
