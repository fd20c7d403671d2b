//! One test per Proxmox semantic pvesim promises (see proxmox-api.md §12):
//! tasks and the fault knobs: failed tasks, lost answers, counters.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::{Duration, Instant};

use common::{Client, TOKEN, attach, start};
use serde_json::json;

#[tokio::test]
async fn tasks_can_fail_after_their_upid() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.knobs(r#"{"fail_tasks": 1}"#).await;
    let st = attach(&c, "name", "renamed").await;
    assert_eq!(st["status"], "stopped");
    assert_eq!(st["exitstatus"], "task failed (injected by pvesim)");
    assert_eq!(sim.faults().failed_tasks, 1);
    assert_eq!(attach(&c, "name", "renamed").await["exitstatus"], "OK");
    let r = c.get("/nodes/pve2/tasks/UPID:bad/status", &[]).await;
    assert_eq!(r.body["errors"]["upid"], "unable to parse worker upid");
}

#[tokio::test]
async fn knobs_counters_and_faults() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.call("DELETE", "/pvesim/counters", &[]).await;
    c.get("/version", &[]).await.ok();
    c.get("/version", &[]).await.ok();
    c.get("/nodes/pve2/qemu/112/config", &[]).await.ok();
    let n = c.get("/pvesim/counters", &[]).await.ok();
    assert_eq!(n["GET /version"], 2);
    assert_eq!(n["GET /nodes/{node}/qemu/{vmid}/config"], 1);
    c.call("DELETE", "/pvesim/counters", &[]).await;
    assert_eq!(c.get("/pvesim/counters", &[]).await.ok(), json!({}));

    c.knobs(r#"{"error_5xx_rate": 1.0}"#).await;
    let r = c.get("/version", &[]).await;
    assert_eq!((r.status, r.reason.as_str()), (595, "Connection refused"));
    c.knobs(r#"{"error_5xx_rate": 0.0, "drop_connections": 1}"#)
        .await;
    let raw = reqwest::Client::new()
        .get(format!("http://{}/api2/json/version", sim.addr))
        .header(
            "Authorization",
            format!("PVEAPIToken={TOKEN}={}", common::SECRET),
        )
        .send()
        .await;
    assert!(raw.is_err(), "the connection should have been dropped");
    assert_eq!(c.get("/version", &[]).await.status, 200);
    let faults = c.get("/pvesim/faults", &[]).await.ok();
    assert_eq!(faults["errors_5xx"], 1, "{faults}");
    assert_eq!(faults["dropped_connections"], 1, "{faults}");
    c.call("DELETE", "/pvesim/faults", &[]).await;
    assert_eq!(sim.faults(), pvesim::knobs::Faults::default());

    c.knobs(r#"{"api_latency_ms": 100}"#).await;
    let started = Instant::now();
    c.get("/version", &[]).await.ok();
    assert!(started.elapsed() >= Duration::from_millis(100));
    let r = reqwest::Client::new()
        .post(format!("http://{}/pvesim/knobs", sim.addr))
        .body(r#"{"no_such_knob": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        sim.set_knobs(r#"{"fail_task": 1}"#).is_err(),
        "a typo'd knob"
    );
}

/// A write whose answer is lost took effect: the allocation is there, and
/// a second one is refused as Proxmox refuses it.
#[tokio::test]
async fn a_lost_answer_comes_after_the_work() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.knobs(r#"{"lose_answers": 1, "lose_answers_skip": 1}"#)
        .await;
    let alloc = |name: &'static str| {
        let url = format!(
            "http://{}/api2/json/nodes/pve2/storage/local-lvm/content",
            sim.addr
        );
        async move {
            reqwest::Client::new()
                .post(url)
                .header(
                    "Authorization",
                    format!("PVEAPIToken={TOKEN}={}", common::SECRET),
                )
                .form(&[("filename", name), ("vmid", "9999"), ("size", "1G")])
                .send()
                .await
        }
    };
    // Reads are never lost; the first write is let through, the second lost.
    assert_eq!(c.get("/version", &[]).await.status, 200);
    assert!(alloc("vm-9999-pvc-x1").await.unwrap().status().is_success());
    assert!(alloc("vm-9999-pvc-x2").await.is_err(), "the answer is lost");
    assert_eq!(sim.faults().lost_answers, 1);
    let content = c
        .get("/nodes/pve2/storage/local-lvm/content", &[])
        .await
        .ok();
    let names: Vec<&str> = content
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["volid"].as_str())
        .collect();
    assert!(names.contains(&"local-lvm:vm-9999-pvc-x2"), "{names:?}");
    let again = alloc("vm-9999-pvc-x2").await.unwrap();
    assert_eq!(again.status().as_u16(), 500);
}

/// A task that did its work and ended in error anyway.
#[tokio::test]
async fn a_task_can_fail_after_its_work() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    c.knobs(r#"{"fail_tasks_after_work": 1}"#).await;
    let st = attach(&c, "name", "renamed").await;
    assert_eq!(
        st["exitstatus"],
        "task failed after its work (injected by pvesim)"
    );
    let cfg = c.get("/nodes/pve2/qemu/112/config", &[]).await.ok();
    assert_eq!(cfg["name"], "renamed", "the work was done: {cfg}");
    assert_eq!(sim.faults().failed_tasks_after_work, 1);
}
