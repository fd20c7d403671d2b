//! One test per Proxmox semantic pvesim promises (see proxmox-api.md §12):
//! the envelope, the reason phrase, schema validation, authentication and
//! privileges (pve-http-server, pve-access-control).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::{Client, NARROW, TOKEN, start};
use serde_json::json;

#[tokio::test]
async fn envelope_reason_phrase_auth_and_unknown_routes() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let v = c.get("/version", &[]).await.ok();
    assert_eq!(v["version"], "9.0.3");
    assert_eq!(v["release"], "9.0");

    let anon = Client::anonymous(&sim).get("/version", &[]).await;
    assert_eq!((anon.status, anon.reason.as_str()), (401, "No ticket"));
    let mut bad = Client::new(&sim, "kubernetes-csi@pve!nope");
    let r = bad.get("/version", &[]).await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (401, "Authentication failed!")
    );
    bad = Client::new(&sim, "kubernetes-csi@pve!csi");
    assert_eq!(bad.get("/version", &[]).await.status, 200);

    let r = c.get("/nodes/pve1/frobnicate", &[]).await;
    assert_eq!(r.status, 501);
    assert_eq!(
        r.reason,
        "Method 'GET /nodes/pve1/frobnicate' not implemented"
    );
    // Errors carry the message in the reason phrase and in the body.
    let r = c.get("/nodes/pve2/qemu/999/config", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.reason,
        "Configuration file 'nodes/pve2/qemu-server/999.conf' does not exist"
    );
    assert_eq!(
        r.body["message"],
        "Configuration file 'nodes/pve2/qemu-server/999.conf' does not exist\n"
    );
    assert_eq!(r.body["data"], serde_json::Value::Null);
    // nextid is a string; booleans are 0/1.
    assert_eq!(c.get("/cluster/nextid", &[]).await.ok(), json!("100"));
    let nodes = c.get("/nodes/pve2/storage", &[]).await.ok();
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["shared"] == 0 || s["shared"] == 1)
    );
    let r = c.get("/cluster/nextid", &[("vmid", "112")]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["errors"]["vmid"], "VM 112 already exists");
}

#[tokio::test]
async fn parameters_are_checked_against_the_schema() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-a"),
                ("vmid", "9999"),
                ("size", "1G"),
                ("bogus", "1"),
            ],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (400, "Parameter verification failed.")
    );
    assert_eq!(
        r.body["errors"]["bogus"],
        "property is not defined in schema and the schema does not allow additional properties"
    );
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[("vmid", "abc"), ("size", "1G")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["filename"],
        "property is missing and it is not optional"
    );
    assert_eq!(
        r.body["errors"]["vmid"],
        "type check ('integer') failed - got 'abc'"
    );
    let r = c
        .get("/nodes/pve2/qemu/112/config", &[("current", "true")])
        .await;
    assert_eq!(
        r.body["errors"]["current"],
        "type check ('boolean') failed - got 'true'"
    );
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi31", "local-lvm:1")],
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi1", "local-lvm:vm-112-disk-1,wwn=0x123")],
        )
        .await;
    assert!(
        r.body["errors"]["scsi1"]
            .as_str()
            .unwrap()
            .contains("scsi1.wwn: value does not match the regex pattern"),
        "{r:?}"
    );
    let r = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi1", "local-lvm:vm-112-disk-1,colour=red")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["scsi1"],
        "invalid format - invalid key in comma-separated list property: colour\n"
    );
    // A path parameter repeated in the body with another value.
    let r = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/config",
            &[("node", "pve1"), ("name", "x")],
        )
        .await;
    assert_eq!(
        r.body["errors"]["node"],
        "duplicate parameter (already defined in URI) with conflicting values!"
    );
    // A GET with a body.
    let raw = reqwest::Client::new()
        .get(format!("http://{}/api2/json/version", sim.addr))
        .header(
            "Authorization",
            format!("PVEAPIToken={TOKEN}={}", common::SECRET),
        )
        .body("x=1")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 501);
}

#[tokio::test]
async fn privileges_come_from_acls() {
    let sim = start().await;
    let narrow = Client::new(&sim, NARROW);
    let r = narrow
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-a"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (
            403,
            "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"
        )
    );
    let r = narrow
        .call("POST", "/nodes/pve2/qemu/112/config", &[("name", "x")])
        .await;
    assert_eq!(r.status, 403);
    assert!(
        r.reason
            .starts_with("Permission check failed (/vms/112, VM.Config.Disk|VM.Config.CDROM"),
        "{}",
        r.reason
    );
    // Reading is allowed with the Reader role.
    assert_eq!(
        narrow.get("/nodes/pve2/qemu/112/config", &[]).await.status,
        200
    );
    // The copy endpoint is root@pam only, whatever the token may do.
    let c = Client::new(&sim, TOKEN);
    let r = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content/vm-112-disk-1",
            &[("target", "vm-9999-copy")],
        )
        .await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (403, "Permission check failed (user != root@pam)")
    );
}

/// A storage's listing shows only the images the caller may access
/// (Storage.pm check_volume_access); an ACL on a narrower path replaces
/// the inherited one (AccessControl.pm roles), NoAccess takes all.
#[tokio::test]
async fn listings_and_narrower_acls_follow_proxmox() {
    let sim = start().await;
    let list = |who: &'static str| {
        let sim = &sim;
        async move {
            Client::new(sim, who)
                .get("/nodes/pve2/storage/local-lvm/content", &[])
                .await
                .ok()
                .as_array()
                .unwrap()
                .len()
        }
    };
    // Reader: Datastore.Audit without VM.Config.Disk on the owners.
    assert_eq!(list(NARROW).await, 0);
    assert_eq!(list(TOKEN).await, 2);

    let narrowed = common::CLUSTER.replace(
        "  - { path: /, roles: [Administrator], users: [admin@pve] }",
        "  - { path: /, roles: [Administrator], users: [admin@pve] }\n  - { path: /storage/local-lvm, roles: [Reader], users: [kubernetes-csi@pve], tokens: [\"kubernetes-csi@pve!csi\"] }\n  - { path: /vms/112, roles: [NoAccess], users: [kubernetes-csi@pve], tokens: [\"kubernetes-csi@pve!csi\"] }",
    );
    let sim = common::start_with(&narrowed).await;
    let c = Client::new(&sim, TOKEN);
    let alloc = |storage: &'static str| {
        let c = &c;
        async move {
            c.call(
                "POST",
                &format!("/nodes/pve2/storage/{storage}/content"),
                &[
                    ("filename", "vm-9999-pvc-n"),
                    ("vmid", "9999"),
                    ("size", "1G"),
                ],
            )
            .await
        }
    };
    // The role on / no longer reaches local-lvm, still reaches local-zfs.
    let r = alloc("local-lvm").await;
    assert_eq!(
        (r.status, r.reason.as_str()),
        (
            403,
            "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"
        )
    );
    assert_eq!(alloc("local-zfs").await.status, 200);
    assert_eq!(c.get("/nodes/pve2/qemu/112/config", &[]).await.status, 403);
    assert_eq!(c.get("/nodes/pve1/qemu/111/config", &[]).await.status, 200);
}

#[tokio::test]
async fn ticket_login_with_csrf() {
    let sim = start().await;
    let http = reqwest::Client::new();
    let base = format!("http://{}/api2/json", sim.addr);
    let t: serde_json::Value = http
        .post(format!("{base}/access/ticket"))
        .form(&[("username", "root@pam"), ("password", "rootpw")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ticket = t["data"]["ticket"].as_str().unwrap();
    let csrf = t["data"]["CSRFPreventionToken"].as_str().unwrap();
    let cookie = format!("PVEAuthCookie={ticket}");
    let r = http
        .get(format!("{base}/version"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = http
        .put(format!("{base}/nodes/pve2/qemu/112/config"))
        .header("Cookie", &cookie)
        .form(&[("name", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "writes need the CSRF token");
    let r = http
        .put(format!("{base}/nodes/pve2/qemu/112/config"))
        .header("Cookie", &cookie)
        .header("CSRFPreventionToken", csrf)
        .form(&[("name", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // root@pam may copy a volume.
    let r = http
        .post(format!(
            "{base}/nodes/pve2/storage/local-lvm/content/vm-112-disk-1"
        ))
        .header("Cookie", &cookie)
        .header("CSRFPreventionToken", csrf)
        .form(&[("target", "vm-9999-copy")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let bad = http
        .post(format!("{base}/access/ticket"))
        .form(&[("username", "root@pam"), ("password", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 401);
}

#[tokio::test]
async fn a_token_can_read_its_own_privileges() {
    let sim = start().await;
    let c = Client::new(&sim, TOKEN);
    let p = c.get("/access/permissions", &[]).await.ok();
    let root = p["/"].as_object().unwrap();
    for privilege in [
        "VM.Audit",
        "VM.Config.Disk",
        "Datastore.Allocate",
        "Datastore.AllocateSpace",
        "Datastore.Audit",
    ] {
        assert_eq!(root[privilege], 1, "{privilege}: {p}");
    }
    assert!(root.get("VM.Allocate").is_none());
    let narrow = Client::new(&sim, NARROW)
        .get("/access/permissions", &[])
        .await
        .ok();
    assert!(narrow["/"].get("VM.Config.Disk").is_none());
}
