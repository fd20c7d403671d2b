//! What the kubesim tests share: a raw HTTP call (to see status codes),
//! a kube client, and polling until the controllers have acted.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub fn client(sim: &kubesim::Running) -> kube::Client {
    kube::Client::try_from(kube::Config::new(sim.url.parse().unwrap())).unwrap()
}

/// One HTTP/1.1 request to kubesim: (status code, JSON body).
pub async fn call(
    sim: &kubesim::Running,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let addr = sim.url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let code: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, serde_json::from_str(rest).unwrap_or(Value::Null))
}

/// Polls `f` every 10 ms until it holds; false after `within`.
pub async fn until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if f() {
            return true;
        }
        if started.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Long enough for a few ticks on a busy machine.
pub const SOON: Duration = Duration::from_secs(5);
pub const PVC_PATH: &str = "/api/v1/namespaces/ns/persistentvolumeclaims";
pub const PV_PATH: &str = "/api/v1/persistentvolumes";
