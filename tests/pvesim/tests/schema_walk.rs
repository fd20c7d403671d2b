//! Every endpoint pvesim serves exists in Proxmox's schema, and every answer
//! it gives has the documented shape.

mod common;

use common::{ADMIN, Client, start};

/// One call of the walk: method, path template, concrete path, parameters.
type Call<'a> = (&'a str, &'a str, String, Vec<(&'a str, &'a str)>);

#[tokio::test]
async fn every_served_endpoint_answers_in_the_documented_shape() {
    let sim = start().await;
    let schema = &sim.ctx.schema;
    for (method, template, _) in pvesim::api::routes() {
        // VM snapshots and the datacenter options are served beyond the
        // schema subset (see the README).
        if template.contains("/snapshot") || template == "/cluster/options" {
            continue;
        }
        assert!(
            schema.info(template, method.as_str()).is_some(),
            "{method} {template} is served but not in the Proxmox schema"
        );
    }

    let c = Client::new(&sim, ADMIN);
    let upid = c
        .call(
            "POST",
            "/nodes/pve2/storage/local-lvm/content",
            &[
                ("filename", "vm-9999-pvc-w"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        )
        .await
        .ok();
    assert_eq!(upid, "local-lvm:vm-9999-pvc-w");
    let attach = c
        .call(
            "POST",
            "/nodes/pve2/qemu/112/config",
            &[("scsi1", "local-lvm:vm-9999-pvc-w,wwn=0x5000c500a1b2c3d4")],
        )
        .await
        .ok();
    let attach = attach.as_str().unwrap().to_string();
    c.wait_task(&attach).await;
    let resize = c
        .call(
            "PUT",
            "/nodes/pve2/qemu/112/resize",
            &[("disk", "scsi1"), ("size", "+1G")],
        )
        .await
        .ok();
    c.wait_task(resize.as_str().unwrap()).await;

    let calls: Vec<Call> = vec![
        ("GET", "/version", "/version".into(), vec![]),
        ("GET", "/cluster/status", "/cluster/status".into(), vec![]),
        (
            "GET",
            "/cluster/resources",
            "/cluster/resources".into(),
            vec![],
        ),
        (
            "GET",
            "/cluster/resources",
            "/cluster/resources".into(),
            vec![("type", "storage")],
        ),
        ("GET", "/cluster/nextid", "/cluster/nextid".into(), vec![]),
        ("GET", "/nodes", "/nodes".into(), vec![]),
        (
            "GET",
            "/nodes/{node}/status",
            "/nodes/pve2/status".into(),
            vec![],
        ),
        (
            "GET",
            "/access/permissions",
            "/access/permissions".into(),
            vec![],
        ),
        (
            "GET",
            "/cluster/ha/resources",
            "/cluster/ha/resources".into(),
            vec![],
        ),
        (
            "POST",
            "/nodes/{node}/storage/{storage}/content",
            "/nodes/pve2/storage/local-zfs/content".into(),
            vec![
                ("filename", "vm-112-disk-7"),
                ("vmid", "112"),
                ("size", "1G"),
            ],
        ),
        (
            "PUT",
            "/nodes/{node}/qemu/{vmid}/config",
            "/nodes/pve2/qemu/112/config".into(),
            vec![
                ("scsi5", "local-zfs:vm-112-disk-7,replicate=1"),
                ("scsi0", "local-lvm:vm-112-disk-0,iothread=1,replicate=0"),
            ],
        ),
        (
            "POST",
            "/cluster/replication",
            "/cluster/replication".into(),
            vec![
                ("id", "112-0"),
                ("type", "local"),
                ("target", "pve1"),
                ("comment", "walk"),
            ],
        ),
        (
            "GET",
            "/cluster/replication",
            "/cluster/replication".into(),
            vec![],
        ),
        (
            "GET",
            "/cluster/replication/{id}",
            "/cluster/replication/112-0".into(),
            vec![],
        ),
        (
            "PUT",
            "/cluster/replication/{id}",
            "/cluster/replication/112-0".into(),
            vec![("rate", "5")],
        ),
        (
            "GET",
            "/nodes/{node}/replication",
            "/nodes/pve2/replication".into(),
            vec![("guest", "112")],
        ),
        (
            "DELETE",
            "/cluster/replication/{id}",
            "/cluster/replication/112-0".into(),
            vec![("force", "1")],
        ),
        (
            "POST",
            "/nodes/{node}/qemu",
            "/nodes/pve1/qemu".into(),
            vec![("vmid", "9999"), ("name", "holder")],
        ),
        (
            "GET",
            "/nodes/{node}/qemu/{vmid}",
            "/nodes/pve2/qemu/112".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/qemu/{vmid}/migrate",
            "/nodes/pve1/qemu/111/migrate".into(),
            vec![("target", "pve3")],
        ),
        (
            "POST",
            "/nodes/{node}/qemu/{vmid}/migrate",
            "/nodes/pve1/qemu/111/migrate".into(),
            vec![("target", "pve3")],
        ),
        (
            "POST",
            "/nodes/{node}/qemu/{vmid}/move_disk",
            "/nodes/pve2/qemu/112/move_disk".into(),
            vec![("disk", "scsi5"), ("storage", "nfs")],
        ),
        ("GET", "/storage", "/storage".into(), vec![]),
        (
            "GET",
            "/storage/{storage}",
            "/storage/local-lvm".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/storage",
            "/nodes/pve2/storage".into(),
            vec![("content", "images")],
        ),
        (
            "GET",
            "/nodes/{node}/storage/{storage}/status",
            "/nodes/pve2/storage/local-lvm/status".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/storage/{storage}/content",
            "/nodes/pve2/storage/local-lvm/content".into(),
            vec![("vmid", "9999")],
        ),
        (
            "GET",
            "/nodes/{node}/storage/{storage}/content/{volume}",
            "/nodes/pve2/storage/local-lvm/content/local-lvm:vm-9999-pvc-w".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/qemu",
            "/nodes/pve2/qemu".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/qemu/{vmid}/config",
            "/nodes/pve2/qemu/112/config".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/qemu/{vmid}/pending",
            "/nodes/pve2/qemu/112/pending".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/qemu/{vmid}/status/current",
            "/nodes/pve2/qemu/112/status/current".into(),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/tasks/{upid}/status",
            format!("/nodes/pve2/tasks/{attach}/status"),
            vec![],
        ),
        (
            "GET",
            "/nodes/{node}/tasks/{upid}/log",
            format!("/nodes/pve2/tasks/{attach}/log"),
            vec![],
        ),
        (
            "PUT",
            "/nodes/{node}/qemu/{vmid}/config",
            "/nodes/pve2/qemu/112/config".into(),
            vec![("description", "walked")],
        ),
        (
            "POST",
            "/nodes/{node}/qemu/{vmid}/config",
            "/nodes/pve2/qemu/112/config".into(),
            vec![("description", "walked again")],
        ),
        (
            "PUT",
            "/nodes/{node}/qemu/{vmid}/resize",
            "/nodes/pve2/qemu/112/resize".into(),
            vec![("disk", "scsi1"), ("size", "+1G")],
        ),
        (
            "PUT",
            "/nodes/{node}/qemu/{vmid}/unlink",
            "/nodes/pve2/qemu/112/unlink".into(),
            vec![("idlist", "scsi1")],
        ),
        (
            "DELETE",
            "/nodes/{node}/storage/{storage}/content/{volume}",
            "/nodes/pve2/storage/local-lvm/content/vm-9999-pvc-w".into(),
            vec![],
        ),
        (
            "DELETE",
            "/nodes/{node}/qemu/{vmid}",
            "/nodes/pve1/qemu/9999".into(),
            vec![],
        ),
        (
            "POST",
            "/nodes/{node}/storage/{storage}/content",
            "/nodes/pve2/storage/local-lvm/content".into(),
            vec![
                ("filename", "vm-9999-pvc-x"),
                ("vmid", "9999"),
                ("size", "1G"),
            ],
        ),
    ];
    let mut walked = std::collections::BTreeSet::new();
    for (method, template, path, params) in calls {
        let answer = c.call(method, &path, &params).await;
        assert_eq!(answer.status, 200, "{method} {path}: {answer:?}");
        if template == "/cluster/nextid" {
            // The schema says integer, but Proxmox answers a string ("101"),
            // and clients depend on that.
            assert!(
                answer
                    .data()
                    .as_str()
                    .is_some_and(|s| s.parse::<u32>().is_ok()),
                "{answer:?}"
            );
            walked.insert(format!("{method} {template}"));
            continue;
        }
        if let Err(e) = schema.check_return(template, method, answer.data()) {
            panic!("{method} {template}: {e}\n{}", answer.data());
        }
        walked.insert(format!("{method} {template}"));
    }
    // Every served endpoint was walked, except the root-only copy (tested
    // with a ticket elsewhere) and the notes update, which always fails for
    // disk images as in Proxmox.
    for (method, template, _) in pvesim::api::routes() {
        let key = format!("{method} {template}");
        let exempt = (template == "/nodes/{node}/storage/{storage}/content/{volume}"
            && (method == "POST" || method == "PUT"))
            || template.contains("/snapshot")
            || template == "/cluster/options";
        assert!(exempt || walked.contains(&key), "{key} was not walked");
    }
}
