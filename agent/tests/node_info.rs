//! NodeGetInfo against a Kubernetes API (a minimal stand-in serving Node
//! objects) and hostd's SMBIOS identity: node id `<node>/<vmid>` with the VM
//! id from the serial's `i=`, topology from labels, errors that say how to
//! fix a missing label.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use axum::Json;
use axum::extract::Path as UrlPath;
use axum::http::StatusCode;
use axum::routing::get;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use serde_json::{Value, json};
use testkit::process::Proc;

async fn node_object(UrlPath(name): UrlPath<String>) -> (StatusCode, Json<Value>) {
    let labels = match name.as_str() {
        // Only the CSI-owned fallback keys, and a volume limit.
        "worker-3" => json!({
            "topology.proxmox.sinextra.dev/region": "region-2",
            "topology.proxmox.sinextra.dev/node": "pve3",
            "csi.proxmox.sinextra.dev/max-volume-attachments": "12",
        }),
        // No zone: it reaches shared storage only (Go driver PR #641).
        "worker-4" => json!({ "topology.kubernetes.io/region": "region-2" }),
        "worker-5" => json!({ "topology.kubernetes.io/zone": "pve5" }),
        _ => {
            return (
                StatusCode::NOT_FOUND,
                Json(
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": format!("nodes \"{name}\" not found")}),
                ),
            );
        }
    };
    (
        StatusCode::OK,
        Json(
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": labels}}),
        ),
    )
}

async fn wait_for(path: &Path) {
    testkit::wait_for(path).await.unwrap();
}

#[tokio::test]
async fn node_info_reads_labels_and_smbios() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route("/api/v1/nodes/{name}", get(node_object));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: t\ncurrent-context: t\nusers:\n- name: t\n  user:\n    token: test-token\n"
        ),
    )
    .unwrap();
    let dmi = dir.path().join("dmi");
    std::fs::create_dir_all(&dmi).unwrap();
    std::fs::write(dmi.join("product_serial"), "h=worker-3;i=203\n").unwrap();
    std::fs::write(
        dmi.join("product_uuid"),
        "6e1b2f0a-0000-4000-8000-000000000203\n",
    )
    .unwrap();

    let hostd_sock = dir.path().join("hostd.sock");
    let mut hostd = Command::new(testkit::bin("proxmox-csi-hostd"));
    hostd
        .args(["--socket", hostd_sock.to_str().unwrap()])
        .args(["--kubelet-root", dir.path().to_str().unwrap()])
        .args(["--dmi-dir", dmi.to_str().unwrap()])
        .args(["--health-file", dir.path().join("h.json").to_str().unwrap()]);
    let _hostd = Proc::start("hostd", hostd, &dir.path().join("hostd.log")).unwrap();
    wait_for(&hostd_sock).await;

    for (node, expect) in [
        (
            "worker-3",
            Ok(("worker-3/203", "region-2", Some("pve3"), 12)),
        ),
        ("worker-4", Ok(("worker-4/203", "region-2", None, 24))),
        (
            "worker-5",
            Err("Node worker-5 has no label topology.kubernetes.io/region"),
        ),
    ] {
        let csi_sock = dir.path().join(format!("{node}.sock"));
        let mut agent = Command::new(env!("CARGO_BIN_EXE_proxmox-csi-node"));
        agent
            .args(["--csi-address", &format!("unix://{}", csi_sock.display())])
            .args(["--hostd-socket", hostd_sock.to_str().unwrap()])
            .args(["--node-id", node])
            .args(["--kubelet-root", dir.path().to_str().unwrap()])
            .env("KUBECONFIG", &kubeconfig);
        let _agent = Proc::start(node, agent, &dir.path().join(format!("{node}.log"))).unwrap();
        wait_for(&csi_sock).await;
        let ch = proxmox_csi_common::client::unix_channel(csi_sock)
            .await
            .unwrap();
        let got = NodeClient::new(ch)
            .node_get_info(callers::identity::node_get_info())
            .await;
        match expect {
            Ok((id, region, zone, max)) => {
                let info = got.unwrap().into_inner();
                assert_eq!(info.node_id, id);
                assert_eq!(info.max_volumes_per_node, max);
                let segs = info.accessible_topology.unwrap().segments;
                assert_eq!(segs["topology.kubernetes.io/region"], region);
                assert_eq!(
                    segs.get("topology.kubernetes.io/zone").map(String::as_str),
                    zone,
                    "{segs:?}"
                );
            }
            Err(want) => {
                let e = got.unwrap_err();
                assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
                assert!(e.message().contains(want), "{}", e.message());
                assert!(
                    e.message()
                        .contains("kubectl label node worker-5 topology.kubernetes.io/region="),
                    "{}",
                    e.message()
                );
            }
        }
    }
}
