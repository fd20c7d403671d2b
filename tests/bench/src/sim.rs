//! pvesim for the benchmarks: started in-process over plain HTTP, with its
//! admin view (knobs, call counters, VMs, volumes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use proxmox_csi_controller::config::CloudConfig;
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_controller::ctl::Controller;
use serde_json::Value;

pub use testkit::sim::{SECRET, TOKEN_ID as TOKEN};

/// A cluster of `nodes` Proxmox nodes with `vms_per_node` running workers
/// each (VM ids from 200), local-lvm everywhere, a shared NFS storage, and
/// the CSI token.
pub fn cluster(nodes: usize, vms_per_node: usize, extra_privileges: &str) -> String {
    let mut s = String::from("cluster: bench\nnodes:\n");
    for n in 1..=nodes {
        s.push_str(&format!("  - {{ name: pve{n} }}\n"));
    }
    s.push_str("storages:\n  - { id: local-lvm, type: lvmthin, total: 109951162777600 }\n  - { id: nfs, type: nfs, total: 109951162777600 }\nvms:\n");
    for n in 1..=nodes {
        for i in 0..vms_per_node {
            let vmid = 200 + (n - 1) * vms_per_node + i;
            s.push_str(&format!("  - {{ vmid: {vmid}, node: pve{n}, name: worker-{vmid}, config: {{ scsihw: virtio-scsi-pci }} }}\n"));
        }
    }
    s.push_str(&format!(
        "users:\n  - userid: kubernetes-csi@pve\n    tokens: [{{ name: csi, secret: {SECRET} }}]\n\
         roles:\n  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit{extra_privileges}]\n\
         acl:\n  - {{ path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: [\"{TOKEN}\"] }}\n"
    ));
    s
}

#[derive(Debug)]
pub struct Sim {
    pub running: pvesim::Running,
    pub http: reqwest::Client,
}

impl Sim {
    pub async fn start(cluster: &str) -> Result<Self> {
        let running = testkit::sim::plain(cluster)
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            running,
            http: reqwest::Client::new(),
        })
    }

    pub fn api_url(&self) -> String {
        self.running.api_url()
    }

    pub fn cloud_config(&self) -> String {
        testkit::sim::config_of(&self.running)
    }

    /// An in-process controller on this simulator.
    pub fn controller(&self) -> Result<ControllerService> {
        let cfg = CloudConfig::parse(&self.cloud_config())?;
        let ctl = Controller::from_config(
            &cfg,
            Duration::from_secs(30),
            Default::default(),
            Duration::from_secs(120),
        )?;
        Ok(ControllerService(Arc::new(ctl)))
    }

    pub async fn admin(&self, method: reqwest::Method, path: &str, body: &str) -> Result<Value> {
        let url = format!("http://{}/pvesim/{path}", self.running.addr);
        let r = self
            .http
            .request(method, url)
            .body(body.to_string())
            .send()
            .await?;
        let status = r.status();
        let body = r.json::<Value>().await?;
        anyhow::ensure!(status.is_success(), "pvesim admin {path}: {status} {body}");
        Ok(body["data"].clone())
    }

    /// A Proxmox API call with the CSI token, as the UI or a script makes
    /// it; fails with Proxmox's message on an error status.
    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        form: &[(&str, &str)],
    ) -> Result<Value> {
        let url = format!("{}{path}", self.api_url());
        let mut req = self
            .http
            .request(method.clone(), url)
            .header("Authorization", format!("PVEAPIToken={TOKEN}={SECRET}"));
        req = if method == reqwest::Method::GET || method == reqwest::Method::DELETE {
            req.query(form)
        } else {
            req.form(form)
        };
        let r = req.send().await?;
        let status = r.status();
        let body = r.json::<Value>().await.unwrap_or(Value::Null);
        anyhow::ensure!(
            status.is_success(),
            "{method} {path}: {status} {}",
            body["message"].as_str().unwrap_or_default().trim()
        );
        Ok(body["data"].clone())
    }

    pub async fn knobs(&self, json: &str) -> Result<()> {
        self.admin(reqwest::Method::POST, "knobs", json)
            .await
            .map(|_| ())
    }

    /// Calls per endpoint template since the last reset.
    pub async fn counters(&self) -> Result<BTreeMap<String, u64>> {
        let v = self.admin(reqwest::Method::GET, "counters", "").await?;
        Ok(v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default())
    }

    pub async fn reset_counters(&self) -> Result<()> {
        self.admin(reqwest::Method::DELETE, "counters", "")
            .await
            .map(|_| ())
    }

    /// Total calls and config writes (`POST` or `PUT …/qemu/{vmid}/config`,
    /// `PUT …/unlink`) since the last reset.
    pub async fn calls_and_writes(&self) -> Result<(u64, u64)> {
        let c = self.counters().await?;
        let writes = [
            "POST /nodes/{node}/qemu/{vmid}/config",
            "PUT /nodes/{node}/qemu/{vmid}/config",
            "PUT /nodes/{node}/qemu/{vmid}/unlink",
        ]
        .iter()
        .map(|k| c.get(*k).copied().unwrap_or(0))
        .sum();
        Ok((c.values().sum(), writes))
    }
}

/// CreateVolume as the external-provisioner sends it for `claim` of class
/// `sc`, its pod's node in `zone` of region-1; the PersistentVolume the
/// provisioner then writes.
pub async fn provision(
    ctl: &ControllerService,
    sc: &callers::provisioner::StorageClass,
    claim: &callers::provisioner::Claim,
    zone: &str,
) -> Result<callers::PersistentVolume> {
    use anyhow::Context;
    use callers::provisioner;
    use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
    let term = [
        ("topology.kubernetes.io/region", "region-1"),
        ("topology.kubernetes.io/zone", zone),
    ];
    let v = ctl
        .create_volume(tonic::Request::new(provisioner::create_volume(
            sc,
            claim,
            Some(provisioner::requirement(&[&term], 0)),
        )))
        .await?
        .into_inner()
        .volume
        .context("CreateVolume answered no volume")?;
    Ok(provisioner::persistent_volume(sc, claim, &v))
}

/// The Proxmox API called directly with the bench's token, no retries: the
/// Go driver's strategy and the floors call it so.
#[derive(Debug)]
pub struct DirectApi {
    api: String,
    http: reqwest::Client,
}

impl DirectApi {
    pub fn new(api: &str) -> Self {
        Self {
            api: api.to_string(),
            http: reqwest::Client::new(),
        }
    }

    /// One call; its `data`. A GET sends `form` as the query.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        form: &[(&str, String)],
    ) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.api))
            .header("Authorization", format!("PVEAPIToken={TOKEN}={SECRET}"));
        req = if method == reqwest::Method::GET {
            req.query(form)
        } else {
            req.form(form)
        };
        let r = req.send().await?;
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            anyhow::bail!("{method} {path}: {status} {body}");
        }
        Ok(body["data"].clone())
    }
}
