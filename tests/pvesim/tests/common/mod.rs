//! A cluster for the tests, and a small client that shows what a Proxmox
//! client sees: status, reason phrase, body.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::time::{Duration, Instant};

use pvesim::{Running, Sim, State};
use serde_json::Value;

pub use testkit::sim::{SECRET, TOKEN_ID as TOKEN};
pub const NARROW: &str = "narrow@pve!csi";
pub const ADMIN: &str = "admin@pve!ops";

/// Three nodes; a worker VM on pve2 (running) and one on pve1 (stopped);
/// local-lvm everywhere, a ZFS pool on pve1/pve2, an NFS share; the
/// documented minimal CSI role for the token, and a narrower token.
pub const CLUSTER: &str = r#"
cluster: lab
version: 9.0.3
nodes:
  - name: pve1
  - name: pve2
  - name: pve3
storages:
  - { id: local-lvm, type: lvmthin, total: 107374182400 }
  - { id: local-zfs, type: zfspool, nodes: [pve1, pve2], total: 53687091200 }
  - { id: nfs, type: nfs, total: 1099511627776 }
  - { id: local, type: dir, content: [iso, vztmpl, backup, images], total: 10737418240 }
vms:
  - vmid: 112
    node: pve2
    name: worker-2
    config: { scsihw: virtio-scsi-pci, scsi0: "local-lvm:vm-112-disk-0,iothread=1,size=32G", smbios1: "uuid=6e1b2f0a-0000-4000-8000-000000000112,serial=aD13b3JrZXItMjtpPTExMg==,base64=1" }
  - vmid: 111
    node: pve1
    name: worker-1
    running: false
    config: { scsihw: virtio-scsi-pci, scsi0: "local-lvm:vm-111-disk-0,size=32G" }
volumes:
  - { volid: "local-lvm:vm-112-disk-0", node: pve2, size: 34359738368 }
  - { volid: "local-lvm:vm-111-disk-0", node: pve1, size: 34359738368 }
  - { volid: "local-lvm:vm-112-disk-1", node: pve2, size: 1073741824 }
users:
  - userid: root@pam
    password: rootpw
  - userid: kubernetes-csi@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
  - userid: narrow@pve
    tokens: [{ name: csi, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab }]
  - userid: admin@pve
    tokens: [{ name: ops, secret: 5f0c6e8a-1234-4b5c-9d7e-0123456789ab, privsep: false }]
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
  Reader: [VM.Audit, Datastore.Audit]
acl:
  - { path: /, roles: [CSI], users: [kubernetes-csi@pve], tokens: ["kubernetes-csi@pve!csi"] }
  - { path: /, roles: [Reader], users: [narrow@pve], tokens: ["narrow@pve!csi"] }
  - { path: /, roles: [Administrator], users: [admin@pve] }
"#;

pub async fn start() -> Running {
    start_with(CLUSTER).await
}

pub async fn start_with(yaml: &str) -> Running {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = Sim::new(State::from_yaml(yaml).expect("state parses")).plain_http();
    sim.start("127.0.0.1:0").await.expect("pvesim starts")
}

#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub reason: String,
    pub body: Value,
}

impl Answer {
    pub fn data(&self) -> &Value {
        &self.body["data"]
    }

    pub fn ok(self) -> Value {
        assert_eq!(self.status, 200, "{self:?}");
        self.body["data"].clone()
    }
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    auth: String,
}

impl Client {
    pub fn new(sim: &Running, token: &str) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            http: reqwest::Client::new(),
            base: format!("http://{}", sim.addr),
            auth: format!("PVEAPIToken={token}={SECRET}"),
        }
    }

    pub fn anonymous(sim: &Running) -> Self {
        let mut c = Self::new(sim, TOKEN);
        c.auth.clear();
        c
    }

    pub async fn call(&self, method: &str, path: &str, params: &[(&str, &str)]) -> Answer {
        let url = if path.starts_with("/pvesim/") {
            format!("{}{path}", self.base)
        } else {
            format!("{}/api2/json{path}", self.base)
        };
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(m.clone(), url);
        req = if matches!(m, reqwest::Method::POST | reqwest::Method::PUT) {
            req.form(params)
        } else {
            req.query(params)
        };
        if !self.auth.is_empty() {
            req = req.header("Authorization", &self.auth);
        }
        let resp = req.send().await.expect("request reaches pvesim");
        let status = resp.status().as_u16();
        let reason = resp
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
            .unwrap_or_else(|| {
                resp.status()
                    .canonical_reason()
                    .unwrap_or_default()
                    .to_string()
            });
        let text = resp.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            status,
            reason,
            body,
        }
    }

    pub async fn get(&self, path: &str, params: &[(&str, &str)]) -> Answer {
        self.call("GET", path, params).await
    }

    /// Waits for a task to stop; returns its status object.
    pub async fn wait_task(&self, upid: &str) -> Value {
        let node = upid.split(':').nth(1).unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = self
                .get(&format!("/nodes/{node}/tasks/{upid}/status"), &[])
                .await
                .ok();
            if st["status"] == "stopped" {
                return st;
            }
            assert!(Instant::now() < deadline, "task {upid} still running");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn knobs(&self, json: &str) {
        let r = self
            .http
            .post(format!("{}/pvesim/knobs", self.base))
            .body(json.to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.text().await);
    }

    pub async fn config(&self, node: &str, vmid: u32, current: bool) -> Value {
        let c = if current { "1" } else { "0" };
        self.get(
            &format!("/nodes/{node}/qemu/{vmid}/config"),
            &[("current", c)],
        )
        .await
        .ok()
    }
}

/// Writes `key=value` into VM 112's config on pve2 and waits for the task;
/// its final status.
pub async fn attach(c: &Client, key: &str, value: &str) -> serde_json::Value {
    let upid = c
        .call("POST", "/nodes/pve2/qemu/112/config", &[(key, value)])
        .await
        .ok();
    c.wait_task(upid.as_str().unwrap()).await
}
