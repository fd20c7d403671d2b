//! The production path in a real guest: pvesim hot-plugs the disk over QMP
//! as Proxmox does, udev in the guest names it by WWN, hostd opens LUKS with
//! dm-crypt, makes xfs, mounts; data survives unplug and re-attach; online
//! growth goes through block_resize, cryptsetup resize and xfs_growfs.
//! Every request is built by its real sender's builder (tests/callers): the
//! provisioner, the attacher, the resizer, the snapshotter and kubelet, on
//! kubelet's own directory layout in the guest.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::HashMap;
use std::time::{Duration, Instant};

use callers::kubelet::{Kubelet, Pod};
use callers::provisioner::{Claim, StorageClass};
use callers::{attacher, provisioner, resizer, snapshotter};
use e2e::guest::{Guest, SECRET, Share, qemu_present};
use e2e::lab::{
    Lab, MINIMAL_ROLE, attach, detach, mkdirs, node_client, provision, setup_on,
    snapshot_when_ready,
};
use proxmox_csi_controller::csi::controller::ControllerService;
use proxmox_csi_proto::csi::v1::controller_server::Controller as _;
use proxmox_csi_proto::csi::v1::node_client::NodeClient;
use tonic::Request;
use tonic::transport::Channel;

const PASSPHRASE: &str = "correct horse battery staple";

/// The node id CSINode lists for the guest bound to VM 112.
const WORKER_2: &str = "worker-2/112";

/// kubelet in the guest (`--root-dir` /var/lib/kubelet).
fn kubelet() -> Kubelet {
    Kubelet::new("/var/lib/kubelet")
}

/// A StorageClass on `storage`; `fs` empty for one that serves only block claims.
fn class(storage: &str, fs: &str) -> StorageClass {
    if fs.is_empty() {
        StorageClass::new(&[("storage", storage)])
    } else {
        StorageClass::new(&[("storage", storage), ("csi.storage.k8s.io/fstype", fs)])
    }
}

/// A 1 GiB claim with uid `uid`: its volume is `pvc-<uid>`.
fn claim(uid: &str) -> Claim {
    Claim::new(uid, uid, 1 << 30)
}

/// The Secret a LUKS StorageClass names for node-stage and node-expand.
fn luks() -> HashMap<String, String> {
    HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())])
}

/// The publish context names the disk as Proxmox and the guest know it:
/// the `wwn=` and `serial=` of the drive line in VM 112's config (what
/// qemu-server passes to QEMU's scsi-hd), and the WWN and serial udev reads
/// from the disk in the guest. Never the driver's own computation.
async fn identity_is_true(g: &mut Guest, sim: &pvesim::Running, pc: &HashMap<String, String>) {
    let (wwn, serial) = (&pc["wwn"], &pc["serial"]);
    let line = sim
        .ctx
        .cluster()
        .vms
        .get(&112)
        .and_then(|vm| {
            vm.config
                .values()
                .find(|v| v.split(',').any(|o| o == format!("wwn={wwn}")))
                .cloned()
        })
        .unwrap_or_else(|| panic!("no drive of VM 112 has wwn={wwn}"));
    assert!(
        line.split(',').any(|o| o == format!("serial={serial}")),
        "{line}"
    );
    let props = g
        .sh(&format!(
            "udevadm settle; udevadm info --query=property --name=/dev/disk/by-id/wwn-{wwn} | cat"
        ))
        .await
        .unwrap();
    assert!(
        props.lines().any(|l| l == format!("ID_WWN={wwn}")),
        "{props}"
    );
    assert!(
        props
            .lines()
            .any(|l| l == format!("ID_SCSI_SERIAL={serial}")),
        "{props}"
    );
}

#[tokio::test]
async fn a_luks_xfs_volume_stages_grows_and_comes_back_with_its_bytes() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    eprintln!("MEASURE boot to shell: {:?}", g.boot_time);

    let k = kubelet();
    let pv = provision(&ctl, &class("local-lvm", "xfs"), &claim("e2e")).await;
    let pod = Pod::new("5c1d7e2a-3b4f-4a6c-9d8e-1f2a3b4c5d6e");
    let target = k.target_path(&pod, &pv);
    let staging = k.staging_path(&pv);

    let t = Instant::now();
    let pc = attach(&ctl, &pv, WORKER_2).await;
    eprintln!(
        "MEASURE ControllerPublish (QMP hot-plug): {:?}",
        t.elapsed()
    );
    let wwn = pc["wwn"].clone();
    // udev in the guest names the disk by WWN, with the serial we set.
    let link = g
        .sh(&format!(
            "udevadm settle; readlink -f /dev/disk/by-id/wwn-{wwn}"
        ))
        .await
        .unwrap();
    assert!(link.starts_with("/dev/sd"), "{link}");
    let dev = link.trim().to_string();
    let serial = g
        .sh(&format!(
            "udevadm info --query=property --name={dev} | grep ID_SCSI_SERIAL"
        ))
        .await
        .unwrap();
    assert!(serial.contains(&pc["serial"]), "{serial}");

    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    let t = Instant::now();
    let staged = tokio::time::timeout(
        Duration::from_secs(60),
        node.node_stage_volume(k.node_stage(&pv, &pc, luks())),
    )
    .await;
    if !matches!(staged, Ok(Ok(_))) {
        let why = g.sh("tail -5 /run/hostd.log; ps | grep -v ']$'; ls -l /dev/mapper; dmsetup info -c; dmsetup udevcookies; ls /lib/udev/rules.d; for p in $(pidof proxmox-csi-hostd); do cat /proc/$p/task/*/wchan; echo; done").await.unwrap_or_default();
        panic!("NodeStage failed: {staged:?}\nguest:\n{why}");
    }
    eprintln!(
        "MEASURE NodeStage (LUKS format+open, mkfs.xfs, mount): {:?}",
        t.elapsed()
    );
    let staged = g
        .sh("grep 'volume staged' /run/node.log | tail -1")
        .await
        .unwrap();
    assert!(
        staged.contains("\"wait\"")
            && staged.contains("\"luks_format\"")
            && staged.contains("\"mkfs\""),
        "{staged}"
    );
    // The size hostd reports is the mapping's: the disk less the LUKS2 header.
    let size: u64 = staged
        .split("size_bytes=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(size > (1 << 30) - (32 << 20) && size < 1 << 30, "{staged}");
    eprintln!(
        "MEASURE NodeStage phases: {}",
        staged.split("timings_ms=").nth(1).unwrap_or("?")
    );
    let mounts = g.sh("grep globalmount /proc/mounts").await.unwrap();
    assert!(
        mounts.contains(&staging)
            && mounts.contains("/dev/mapper/pvecsi-")
            && mounts.contains(" xfs "),
        "{mounts}"
    );
    let luks_dump = g
        .sh(&format!(
            "cryptsetup luksDump {dev} | grep -E 'Version|cipher:|Cipher key'"
        ))
        .await
        .unwrap();
    assert!(
        luks_dump.contains("aes-xts-plain64") && luks_dump.contains("512 bits"),
        "{luks_dump}"
    );

    mkdirs(&mut g, k.publish_dirs(&pod, &pv)).await;
    node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
        .await
        .unwrap();
    let sum = g.sh(&format!("dd if=/dev/urandom of={target}/data bs=1M count=8 2>/dev/null && sync && sha256sum {target}/data | cut -d' ' -f1")).await.unwrap();
    assert_eq!(sum.len(), 64, "{sum}");

    // Online growth: Proxmox resizes (block_resize), the node grows LUKS and xfs.
    let grown = ctl
        .controller_expand_volume(Request::new(resizer::controller_expand(&pv, 2 << 30)))
        .await
        .unwrap()
        .into_inner();
    assert!(grown.node_expansion_required);
    let ne = match node
        .node_expand_volume(k.node_expand(&pv, &pod, 2 << 30, luks()))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => {
            let why = g.sh("tail -5 /run/hostd.log; tail -5 /run/node.log; ps | grep proxmox; dmesg | tail -5").await.unwrap_or_default();
            panic!("NodeExpand failed: {e:?}\nguest:\n{why}");
        }
    };
    assert!(ne.capacity_bytes > (1 << 30) + (900 << 20), "{ne:?}");
    let df = g
        .sh(&format!("df -kP {target} | tail -1 | awk '{{print $2}}'"))
        .await
        .unwrap();
    let kib: u64 = df.trim().parse().unwrap();
    assert!(
        kib > 1_900_000,
        "filesystem is {kib} KiB after growing to 2 GiB"
    );

    // Down in kubelet's order: unpublish, unstage (LUKS closed), then the
    // attacher's detach (the guest sees it go).
    node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
    let mapper = g.sh("ls /dev/mapper").await.unwrap();
    assert!(!mapper.contains("pvecsi-"), "{mapper}");
    detach(&ctl, &pv, WORKER_2).await;
    let (code, _) = g
        .sh_status(&format!(
            "udevadm settle; test -e /dev/disk/by-id/wwn-{wwn}"
        ))
        .await
        .unwrap();
    assert_ne!(code, 0, "the wwn link must disappear after the unplug");

    // Back again: the LUKS volume is opened, not formatted, and the data is there.
    let pc = attach(&ctl, &pv, WORKER_2).await;
    assert_eq!(pc["wwn"], wwn, "the same WWN read back from the config");
    node.node_stage_volume(k.node_stage(&pv, &pc, luks()))
        .await
        .unwrap();
    node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
        .await
        .unwrap();
    let again = g
        .sh(&format!("sha256sum {target}/data | cut -d' ' -f1"))
        .await
        .unwrap();
    assert_eq!(again, sum, "data survived unplug and re-attach");
    let hostd_log = g.sh("cat /run/hostd.log").await.unwrap();
    assert!(
        !hostd_log.contains(PASSPHRASE),
        "the passphrase reached hostd's log"
    );
    // Surprise unplug under the open mapping: unstage still closes it (forced).
    detach(&ctl, &pv, WORKER_2).await;
    g.sh("udevadm settle").await.unwrap();
    node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
    let mapper = g
        .sh("ls /dev/mapper; dmsetup ls 2>/dev/null")
        .await
        .unwrap();
    assert!(
        !mapper.contains("pvecsi-"),
        "the mapping outlived its unplugged disk: {mapper}"
    );
    let pc = attach(&ctl, &pv, WORKER_2).await;
    // A wrong passphrase (the Secret changed) is refused without touching the header.
    let wrong = HashMap::from([("encryption-passphrase".to_string(), "not it".to_string())]);
    let err = node
        .node_stage_volume(k.node_stage(&pv, &pc, wrong))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("passphrase does not open"),
        "{}",
        err.message()
    );
}

/// A node plugin that asks for a staged volume's open LUKS mapping on
/// another volume's disk is refused: by the serial the request names, then
/// by the serial the disk carries. The other disk stays blank, the mapping
/// on its own disk.
#[tokio::test]
async fn a_staged_luks_mapping_is_never_used_on_another_volumes_disk() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let k = kubelet();
    let pv = provision(&ctl, &class("local-lvm", "xfs"), &claim("e2e")).await;
    let pc = attach(&ctl, &pv, WORKER_2).await;
    let dev = g
        .sh(&format!(
            "udevadm settle; readlink -f /dev/disk/by-id/wwn-{}",
            pc["wwn"]
        ))
        .await
        .unwrap()
        .trim()
        .to_string();
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    node.node_stage_volume(k.node_stage(&pv, &pc, luks()))
        .await
        .unwrap();
    let other = provision(&ctl, &class("local-lvm", "xfs"), &claim("e2e-other")).await;
    let mut other_pc = attach(&ctl, &other, WORKER_2).await;
    let other_dev = g
        .sh(&format!(
            "udevadm settle; readlink -f /dev/disk/by-id/wwn-{}",
            other_pc["wwn"]
        ))
        .await
        .unwrap()
        .trim()
        .to_string();
    for (named, code) in [
        (true, tonic::Code::InvalidArgument),
        (false, tonic::Code::FailedPrecondition),
    ] {
        if !named {
            other_pc.remove("serial");
        }
        let e = node
            .node_stage_volume(k.node_stage(&pv, &other_pc, luks()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "serial in the request: {named}: {e:?}");
        assert!(e.message().contains("serial"), "{}", e.message());
    }
    let blank = g
        .sh(&format!("blkid -p {other_dev}; echo rc=$?"))
        .await
        .unwrap();
    assert!(
        blank.contains("rc=2"),
        "the other disk was written to: {blank}"
    );
    let under = g
        .sh("cat /sys/block/dm-*/slaves/*/dev 2>/dev/null; ls /sys/block/dm-*/slaves")
        .await
        .unwrap();
    assert!(
        under.contains(dev.trim_start_matches("/dev/")),
        "the mapping left its disk: {under}"
    );
    detach(&ctl, &other, WORKER_2).await;
}

#[tokio::test]
async fn ext4_growth_surprise_unplug_and_24_disks() {
    let Some((mut g, ctl, mut node, held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let sim = held.sim;
    let k = kubelet();

    // ext4, plain: online growth with resize2fs (root in the guest has CAP_SYS_RESOURCE).
    let pv = provision(&ctl, &class("local-lvm", "ext4"), &claim("ext4")).await;
    let pod = Pod::new("8e2f4a6b-1c3d-4e5f-a7b9-0c1d2e3f4a5b");
    let target = k.target_path(&pod, &pv);
    // The WWN is known before the attach: stage first, so that hostd is
    // already waiting when QEMU's device_add happens. (kubelet waits for
    // the attachment; this measures hostd's wait, with the context the
    // controller is about to answer.)
    let wwn = proxmox_csi_controller::drive::wwn_for(&pv.handle, 0);
    let early = HashMap::from([
        ("wwn".to_string(), wwn.clone()),
        (
            "serial".to_string(),
            proxmox_csi_controller::drive::serial_for(&pv.handle),
        ),
    ]);
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    let t = Instant::now();
    let mut waiting = node.clone();
    let stage_req = k.node_stage(&pv, &early, HashMap::new());
    let staged = tokio::spawn(async move { waiting.node_stage_volume(stage_req).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published = Instant::now();
    let pc = attach(&ctl, &pv, WORKER_2).await;
    let publish_took = published.elapsed();
    identity_is_true(&mut g, &sim, &pc).await;
    assert_eq!(pc["wwn"], wwn, "the WWN hostd waited for");
    staged.await.unwrap().unwrap();
    eprintln!(
        "MEASURE NodeStage (wait, mkfs.ext4, mount): {:?}",
        t.elapsed()
    );
    let line = g
        .sh("grep 'volume staged' /run/node.log | tail -1")
        .await
        .unwrap();
    eprintln!(
        "MEASURE ControllerPublish took {publish_took:?}; hostd, waiting since 300 ms before it, found the disk: {}",
        line.split("timings_ms=").nth(1).unwrap_or("?")
    );
    mkdirs(&mut g, k.publish_dirs(&pod, &pv)).await;
    node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
        .await
        .unwrap();
    g.sh(&format!("echo kept > {target}/f && sync"))
        .await
        .unwrap();
    ctl.controller_expand_volume(Request::new(resizer::controller_expand(&pv, 2 << 30)))
        .await
        .unwrap();
    node.node_expand_volume(k.node_expand(&pv, &pod, 2 << 30, HashMap::new()))
        .await
        .unwrap();
    let kib: u64 = g
        .sh(&format!("df -kP {target} | tail -1 | awk '{{print $2}}'"))
        .await
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(kib > 1_900_000, "ext4 is {kib} KiB after growing to 2 GiB");

    // Surprise unplug while mounted: the condition turns abnormal, unstage still cleans up.
    detach(&ctl, &pv, WORKER_2).await;
    g.sh("udevadm settle").await.unwrap();
    let stats = node
        .node_get_volume_stats(k.node_stats(&pv, &pod))
        .await
        .unwrap()
        .into_inner();
    let cond = stats.volume_condition.unwrap();
    assert!(cond.abnormal, "{cond:?}");
    eprintln!("condition after surprise unplug: {}", cond.message);
    node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
    let mounts = g
        .sh("grep -c kubelet/plugins /proc/mounts || true")
        .await
        .unwrap();
    assert_eq!(mounts.trim(), "0", "nothing left mounted");

    // 24 block claims attached concurrently to one VM: all appear in the guest by WWN.
    let block = class("local-lvm", "");
    let mut pvs = Vec::new();
    for i in 0..24 {
        pvs.push(provision(&ctl, &block, &claim(&format!("many-{i}")).block()).await);
    }
    let t = Instant::now();
    let calls = pvs.iter().map(|pv| {
        let ctl = ctl.clone();
        let req = attacher::controller_publish(pv, WORKER_2);
        async move { ctl.controller_publish_volume(Request::new(req)).await }
    });
    let results: Vec<_> = futures::future::join_all(calls).await;
    eprintln!(
        "MEASURE 24 concurrent ControllerPublish into the guest: {:?}, {} config writes",
        t.elapsed(),
        ctl.0
            .attacher
            .writes
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let contexts: Vec<HashMap<String, String>> = results
        .into_iter()
        .map(|r| r.unwrap().into_inner().publish_context)
        .collect();
    let wwns: Vec<String> = contexts.iter().map(|c| c["wwn"].clone()).collect();
    // Stage them all (kubelet's block staging): a burst of hot-plugs can
    // overrun virtio-scsi's event queue, and hostd's SCSI rescan fallback
    // must find whatever the guest kernel missed.
    mkdirs(&mut g, pvs.iter().flat_map(|pv| k.stage_dirs(pv)).collect()).await;
    let t = Instant::now();
    let stages = pvs.iter().zip(&contexts).map(|(pv, pc)| {
        let mut n = node.clone();
        let req = k.node_stage(pv, pc, HashMap::new());
        async move { n.node_stage_volume(req).await }
    });
    for r in futures::future::join_all(stages).await {
        r.expect("every hot-plugged disk is found and staged");
    }
    eprintln!(
        "MEASURE 24 NodeStage (block) at once in the guest: {:?}",
        t.elapsed()
    );
    let links = g
        .sh("udevadm settle; ls /dev/disk/by-id/ | grep -c '^wwn-'")
        .await
        .unwrap();
    assert_eq!(links.trim(), "24", "by-id links in the guest");
    for w in &wwns {
        g.sh(&format!("test -e /dev/disk/by-id/wwn-{w}"))
            .await
            .unwrap();
    }
}

/// hostd is killed in the middle of a LUKS+xfs stage and started again;
/// the kubelet's retry converges on a mounted, consistent volume.
#[tokio::test]
async fn hostd_killed_mid_stage_in_the_guest() {
    // Alone on the machine, so that each phase lasts long enough to be hit.
    let Some((mut g, ctl, mut node, _held)) =
        Lab::start(Share::Alone, MINIMAL_ROLE).await.map(Lab::parts)
    else {
        return;
    };
    let k = kubelet();
    // Each kill is made in the guest the moment its phase shows, and what
    // the guest looked like at that moment is reported with it: before the
    // LUKS mapping exists (luksFormat or luksOpen, inside hostd), once it
    // exists, and while mkfs.xfs runs.
    let phases = [
        ("before the mapping", "sleep 0.3; true"),
        ("mapping open", "ls /dev/mapper | grep -q pvecsi-"),
        (
            "mkfs.xfs running",
            "cat /proc/[0-9]*/comm 2>/dev/null | grep -q '^mkfs'",
        ),
    ];
    for (i, (phase, shows)) in phases.into_iter().enumerate() {
        let pv = provision(
            &ctl,
            &class("local-lvm", "xfs"),
            &claim(&format!("kill-{i}")),
        )
        .await;
        let staging = k.staging_path(&pv);
        mkdirs(&mut g, k.stage_dirs(&pv)).await;
        let pc = attach(&ctl, &pv, WORKER_2).await;
        let mut first = node.clone();
        let req = k.node_stage(&pv, &pc, luks());
        let call = tokio::spawn(async move { first.node_stage_volume(req).await });
        let at_kill = g
            .sh(&format!(
                "h=$(pidof proxmox-csi-hostd); n=0; until {shows}; do sleep 0.01; n=$((n+1)); [ $n -gt 3000 ] && break; done; \
                 m=$(ls /dev/mapper | grep -c pvecsi-); f=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^mkfs'); \
                 s=$(grep -c '{staging}' /proc/mounts); kill -9 $h; echo \"mappings=$m mkfs=$f mounted=$s\"; \
                 sleep 0.3; start-hostd & sleep 1"
            ))
            .await
            .unwrap();
        let killed = call.await.unwrap();
        eprintln!(
            "killed with {phase}: {at_kill}; the interrupted NodeStage answered {:?}",
            killed.as_ref().map(|_| ()).map_err(|e| e.code())
        );
        // The kill landed in the phase it names, before the volume was staged.
        let seen = |key: &str| {
            at_kill
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.parse::<u32>().ok())
                .unwrap_or(0)
        };
        assert_eq!(
            seen("mounted="),
            0,
            "{phase}: the stage had finished before the kill: {at_kill}"
        );
        match i {
            0 => assert_eq!(
                (seen("mappings="), seen("mkfs=")),
                (0, 0),
                "{phase}: {at_kill}"
            ),
            1 => assert!(seen("mappings=") >= 1, "{phase}: {at_kill}"),
            _ => assert!(seen("mkfs=") >= 1, "{phase}: {at_kill}"),
        }
        assert!(
            killed.is_err(),
            "{phase}: the interrupted NodeStage reported success"
        );
        // The kubelet retries until it works.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match node.node_stage_volume(k.node_stage(&pv, &pc, luks())).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("retry: {:?} {}", e.code(), e.message());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("NodeStage never converged (killed with {phase}): {e:?}"),
            }
        }
        let mounts = g.sh("grep globalmount /proc/mounts").await.unwrap();
        assert!(
            mounts.contains(&staging) && mounts.contains("/dev/mapper/pvecsi-"),
            "{mounts}"
        );

        g.sh(&format!("echo ok > {staging}/f && sync"))
            .await
            .unwrap();
        node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
        // Stages again from scratch: LUKS opens, xfs mounts (a torn one would
        // not), and the file written after the retry is there.
        // As kubelet does, a call that finds hostd still settling is retried.
        until_ok("stage after the recovery", || {
            let (mut n, req) = (node.clone(), k.node_stage(&pv, &pc, luks()));
            async move { n.node_stage_volume(req).await }
        })
        .await;
        let f = g.sh(&format!("cat {staging}/f")).await.unwrap();
        assert_eq!(f.trim(), "ok");
        until_ok("unstage", || {
            let (mut n, req) = (node.clone(), k.node_unstage(&pv));
            async move { n.node_unstage_volume(req).await }
        })
        .await;
    }
    let log = g
        .sh("grep -cE 'interrupted|half-made' /run/hostd.log || true")
        .await
        .unwrap();
    eprintln!("recoveries logged by hostd: {}", log.trim());
}

/// The pod moves: the volume leaves one worker VM and reaches a second one
/// on the same Proxmox node with its data. Local storage cannot follow to
/// another Proxmox node (the error names `pvecsictl migrate`); shared
/// storage can.
#[tokio::test]
async fn volume_moves_between_worker_vms() {
    if !qemu_present() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (g1, g2) = tokio::join!(Guest::boot(), Guest::boot());
    let (mut g1, mut g2) = (g1.expect("guest 1 boots"), g2.expect("guest 2 boots"));
    let images = tempfile::tempdir().unwrap();
    // 112 and 113 are guests on pve2; 114 on pve1 is simulated (no QEMU).
    let state = format!(
        r#"
nodes: [{{ name: pve1 }}, {{ name: pve2 }}]
storages:
  - {{ id: local-lvm, type: lvmthin, total: 107374182400 }}
  - {{ id: nfs, type: nfs, total: 107374182400 }}
vms:
  - {{ vmid: 112, node: pve2, name: worker-2, qmp: "{}", config: {{ scsihw: virtio-scsi-pci }} }}
  - {{ vmid: 113, node: pve2, name: worker-3, qmp: "{}", config: {{ scsihw: virtio-scsi-pci }} }}
  - {{ vmid: 114, node: pve1, name: worker-4, config: {{ scsihw: virtio-scsi-pci }} }}
users:
  - {{ userid: kubernetes-csi@pve, tokens: [{{ name: csi, secret: {SECRET} }}] }}
roles:
  CSI: [VM.Audit, VM.Config.Disk, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit]
acl:
  - {{ path: /, roles: [CSI], tokens: ["kubernetes-csi@pve!csi"], users: [kubernetes-csi@pve] }}
"#,
        g1.qmp.display(),
        g2.qmp.display()
    );
    let (_sim, ctl) = setup_on(&state, images.path()).await;
    let (mut n1, mut n2) = (node_client(&mut g1).await, node_client(&mut g2).await);
    let k = kubelet();

    // Local storage, same Proxmox node: written on worker-2, read on worker-3.
    let local = provision(&ctl, &class("local-lvm", "ext4"), &claim("local")).await;
    assert!(local.handle.contains("/pve2/"), "{}", local.handle);
    let staging = k.staging_path(&local);
    for g in [&mut g1, &mut g2] {
        mkdirs(g, k.stage_dirs(&local)).await;
    }
    let pc = attach(&ctl, &local, WORKER_2).await;
    n1.node_stage_volume(k.node_stage(&local, &pc, HashMap::new()))
        .await
        .unwrap();
    let sum = g1.sh(&format!("dd if=/dev/urandom of={staging}/d bs=1M count=4 2>/dev/null && sync && sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
    // While attached to worker-2, worker-3 cannot have it.
    let err = ctl
        .controller_publish_volume(Request::new(attacher::controller_publish(
            &local,
            "worker-3/113",
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    n1.node_unstage_volume(k.node_unstage(&local))
        .await
        .unwrap();
    detach(&ctl, &local, WORKER_2).await;
    let pc = attach(&ctl, &local, "worker-3/113").await;
    n2.node_stage_volume(k.node_stage(&local, &pc, HashMap::new()))
        .await
        .unwrap();
    let moved = g2
        .sh(&format!("sha256sum {staging}/d | cut -d' ' -f1"))
        .await
        .unwrap();
    assert_eq!(moved, sum, "data intact after the move to another VM");
    n2.node_unstage_volume(k.node_unstage(&local))
        .await
        .unwrap();
    detach(&ctl, &local, "worker-3/113").await;

    // To a VM on another Proxmox node: local storage refused with the reason and the remedy…
    let err = ctl
        .controller_publish_volume(Request::new(attacher::controller_publish(
            &local,
            "worker-4/114",
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains("pvecsictl migrate"),
        "{}",
        err.message()
    );
    // …shared storage goes.
    let shared = provision(&ctl, &class("nfs", "ext4"), &claim("shared")).await;
    attach(&ctl, &shared, WORKER_2).await;
    detach(&ctl, &shared, WORKER_2).await;
    attach(&ctl, &shared, "worker-4/114").await;
}

/// The two growth cases the other guest tests do not cover: ext4 inside
/// LUKS (cryptsetup resize, then resize2fs) and plain xfs (xfs_growfs).
#[tokio::test]
async fn online_growth_of_ext4_with_luks_and_of_plain_xfs() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let luks = HashMap::from([("encryption-passphrase".to_string(), PASSPHRASE.to_string())]);
    for (name, fs, secrets) in [
        ("pvc-ext4-luks", "ext4", luks),
        ("pvc-xfs-plain", "xfs", HashMap::new()),
    ] {
        grow_online(&ctl, &mut node, &mut g, name, fs, secrets).await;
    }
}

/// Create, attach, stage, write, grow from 1 to 2 GiB while mounted, check
/// the size and the bytes, then take everything down and delete.
async fn grow_online(
    ctl: &ControllerService,
    node: &mut NodeClient<Channel>,
    g: &mut Guest,
    name: &str,
    fs: &str,
    secrets: HashMap<String, String>,
) {
    let k = kubelet();
    let pv = provision(ctl, &class("local-lvm", fs), &claim(name)).await;
    let pod = Pod::new(&format!("pod-{name}"));
    let (staging, target) = (k.staging_path(&pv), k.target_path(&pod, &pv));
    mkdirs(g, k.stage_dirs(&pv)).await;
    let pc = attach(ctl, &pv, WORKER_2).await;
    node.node_stage_volume(k.node_stage(&pv, &pc, secrets.clone()))
        .await
        .unwrap();
    let mounts = g
        .sh(&format!("grep '{staging}' /proc/mounts"))
        .await
        .unwrap();
    assert!(mounts.contains(&format!(" {fs} ")), "{mounts}");
    assert_eq!(
        mounts.contains("/dev/mapper/pvecsi-"),
        !secrets.is_empty(),
        "{mounts}"
    );
    mkdirs(g, k.publish_dirs(&pod, &pv)).await;
    node.node_publish_volume(k.node_publish(&pv, &pod, &pc))
        .await
        .unwrap();
    let sum = g.sh(&format!("dd if=/dev/urandom of={target}/data bs=1M count=4 2>/dev/null && sync && sha256sum {target}/data | cut -d' ' -f1")).await.unwrap();
    assert_eq!(sum.len(), 64, "{sum}");

    let grown = ctl
        .controller_expand_volume(Request::new(resizer::controller_expand(&pv, 2 << 30)))
        .await
        .unwrap()
        .into_inner();
    assert!(grown.node_expansion_required);
    node.node_expand_volume(k.node_expand(&pv, &pod, 2 << 30, secrets.clone()))
        .await
        .unwrap();
    let kib: u64 = g
        .sh(&format!("df -kP {target} | tail -1 | awk '{{print $2}}'"))
        .await
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        kib > 1_900_000,
        "{name}: {fs} is {kib} KiB after growing to 2 GiB"
    );
    let again = g
        .sh(&format!("sha256sum {target}/data | cut -d' ' -f1"))
        .await
        .unwrap();
    assert_eq!(again, sum, "{name}: the data survived the growth");

    node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
        .await
        .unwrap();
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
    detach(ctl, &pv, WORKER_2).await;
    ctl.delete_volume(Request::new(provisioner::delete_volume(&pv)))
        .await
        .unwrap();
    let (code, _) = g
        .sh_status(&format!(
            "udevadm settle; test -e /dev/disk/by-id/wwn-{}",
            pc["wwn"]
        ))
        .await
        .unwrap();
    assert_ne!(code, 0, "{name}: the disk is gone from the guest");
}

/// A snapshot of a LUKS volume, restored into a new volume: the copy is
/// opened with the same passphrase (never formatted) and has the bytes.
#[tokio::test]
async fn snapshot_restore_keeps_the_bytes() {
    let role = "VM.Audit, VM.Config.Disk, VM.Allocate, VM.Config.CPU, VM.Config.Memory, VM.Config.HWType, VM.Config.Options, VM.Clone, Datastore.Allocate, Datastore.AllocateSpace, Datastore.Audit";
    let Some((mut g, ctl, mut node, held)) = Lab::start(Share::Shared, role).await.map(Lab::parts)
    else {
        return;
    };
    let images = held.images;
    let k = kubelet();
    let sc = class("local-lvm", "ext4");

    let src = provision(&ctl, &sc, &claim("src")).await;
    let staging = k.staging_path(&src);
    mkdirs(&mut g, k.stage_dirs(&src)).await;
    let pc = attach(&ctl, &src, WORKER_2).await;
    node.node_stage_volume(k.node_stage(&src, &pc, luks()))
        .await
        .unwrap();
    let sum = g.sh(&format!("dd if=/dev/urandom of={staging}/d bs=1M count=4 2>/dev/null && sync && sha256sum {staging}/d | cut -d' ' -f1")).await.unwrap();
    // Quiesced: the filesystem is unmounted while the snapshot is copied.
    node.node_unstage_volume(k.node_unstage(&src))
        .await
        .unwrap();

    // The snapshotter calls CreateSnapshot, unchanged, until ready_to_use.
    let take = snapshotter::create_snapshot(
        "2d4f6a8c-0e1b-4c3d-8e5f-7a9b1c3d5e7f",
        "src-snap",
        &src,
        &[],
    );
    let (snap, took) = snapshot_when_ready(&ctl, &take).await;
    eprintln!("MEASURE snapshot of 1 GiB ready after {took:?}");
    detach(&ctl, &src, WORKER_2).await;

    let restored = provision(
        &ctl,
        &sc,
        &claim("restored").from_snapshot(&snap.snapshot_id),
    )
    .await;
    assert_ne!(restored.handle, src.handle);
    let staging = k.staging_path(&restored);
    mkdirs(&mut g, k.stage_dirs(&restored)).await;
    let pc = attach(&ctl, &restored, WORKER_2).await;
    node.node_stage_volume(k.node_stage(&restored, &pc, luks()))
        .await
        .unwrap();
    let got = g
        .sh(&format!("sha256sum {staging}/d | cut -d' ' -f1"))
        .await
        .unwrap();
    assert_eq!(got, sum, "the restored volume has the snapshot's bytes");
    let staged = g
        .sh("grep 'volume staged' /run/node.log | tail -1")
        .await
        .unwrap();
    assert!(
        !staged.contains("luks_format") && !staged.contains("\"mkfs\""),
        "the restored volume was opened, not formatted: {staged}"
    );
    node.node_unstage_volume(k.node_unstage(&restored))
        .await
        .unwrap();
    detach(&ctl, &restored, WORKER_2).await;
    for pv in [&restored, &src] {
        ctl.delete_volume(Request::new(provisioner::delete_volume(pv)))
            .await
            .unwrap();
    }
    ctl.delete_snapshot(Request::new(snapshotter::delete_snapshot(
        &snap.snapshot_id,
    )))
    .await
    .unwrap();
    let left: Vec<_> = std::fs::read_dir(images.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "backing files left behind: {left:?}");
}

/// The node plugin in the guest, as the conformance suite sees it: disks
/// arrive by ControllerPublish (a QMP hot-plug), files and mounts are read
/// through the guest's shell.
struct GuestNode<'a> {
    g: &'a mut Guest,
    ctl: ControllerService,
}

impl conformance::node::NodeHost for GuestNode<'_> {
    async fn disk(&mut self, n: u32) -> Result<conformance::node::Disk, String> {
        let pv = provision(
            &self.ctl,
            &class("local-lvm", "ext4"),
            &claim(&format!("conf-{n}")),
        )
        .await;
        let pc = self
            .ctl
            .controller_publish_volume(Request::new(attacher::controller_publish(&pv, WORKER_2)))
            .await
            .map_err(|e| e.to_string())?;
        Ok(conformance::node::Disk {
            volume_id: pv.handle.clone(),
            publish_context: pc.into_inner().publish_context,
        })
    }

    fn kubelet_root(&self) -> String {
        "/var/lib/kubelet".into()
    }

    async fn mkdir(&mut self, path: &str) -> Result<(), String> {
        self.g
            .sh(&format!("mkdir -p '{path}'"))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn is_dir(&mut self, path: &str) -> bool {
        self.g
            .sh_status(&format!("test -d '{path}'"))
            .await
            .is_ok_and(|(c, _)| c == 0)
    }

    async fn exists(&mut self, path: &str) -> bool {
        self.g
            .sh_status(&format!("test -e '{path}' || test -L '{path}'"))
            .await
            .is_ok_and(|(c, _)| c == 0)
    }

    async fn mounted(&mut self, path: &str) -> bool {
        self.g
            .sh_status(&format!(
                "awk '$2==\"{path}\" {{f=1}} END {{exit !f}}' /proc/mounts"
            ))
            .await
            .is_ok_and(|(c, _)| c == 0)
    }

    async fn write(&mut self, path: &str, data: &str) -> Result<(), String> {
        match self
            .g
            .sh_status(&format!("printf %s '{data}' > '{path}' 2>&1"))
            .await
        {
            Ok((0, _)) => Ok(()),
            Ok((_, out)) => Err(out),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn read(&mut self, path: &str) -> Option<String> {
        match self.g.sh_status(&format!("cat '{path}'")).await {
            Ok((0, out)) => Some(out.trim().to_string()),
            _ => None,
        }
    }
}

/// The conformance suite's Node clauses against the node plugin and hostd
/// in the guest, with real hot-plugged disks and udev.
#[tokio::test]
async fn node_follows_the_spec_in_the_guest() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let mut report = conformance::Report::default();
    let mut host = GuestNode { g: &mut g, ctl };
    conformance::node::run_with(&mut host, &mut node, &mut report).await;
    report.require_all_passed(
        "CSI spec clauses: Node (node plugin and hostd in the guest VM)",
        30,
    );
}

/// Calls `f` until it succeeds, as a sidecar would, while faults are
/// injected; a final error fails the test. Returns the value and the retries.
async fn until_ok<T, F, Fut>(what: &str, mut f: F) -> (T, u32)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    for attempt in 0..40 {
        match f().await {
            Ok(r) => return (r.into_inner(), attempt),
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::Internal
                        | tonic::Code::Aborted
                        | tonic::Code::DeadlineExceeded
                ) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!("{what}: final error {:?}: {}", s.code(), s.message()),
        }
    }
    panic!("{what}: not done after 40 attempts")
}

/// The fault campaign in the guest: volumes attached, staged, written,
/// grown, unstaged and detached over and over while Proxmox faults are
/// injected (failed hot-plugs, tasks failing after their UPID, 5xx); every
/// stage checks the bytes written before.
#[tokio::test]
async fn soak_in_the_guest_keeps_every_byte() {
    use rand::{Rng, SeedableRng};
    let Some((mut g, ctl, mut node, held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    let sim = held.sim;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let k = kubelet();
    let pod = Pod::new("6a8c0e2f-4b6d-4f8a-9c1e-3d5f7a9b1c3e");
    let mut vols = Vec::new();
    for (i, (fs, secrets)) in [
        ("ext4", HashMap::new()),
        ("xfs", HashMap::new()),
        ("ext4", luks()),
    ]
    .into_iter()
    .enumerate()
    {
        let pv = provision(&ctl, &class("local-lvm", fs), &claim(&format!("soak-{i}"))).await;
        mkdirs(&mut g, k.stage_dirs(&pv)).await;
        mkdirs(&mut g, k.publish_dirs(&pod, &pv)).await;
        vols.push((pv, secrets, None::<String>, 1u64 << 30));
    }
    let (mut faults, mut retries) = (0u32, 0u32);
    // What every injected fault must add to pvesim's tally: each one fires.
    let mut expected = pvesim::knobs::Faults::default();
    for round in 0..14 {
        let i = rng.random_range(0..vols.len());
        let (pv, secrets, sum, bytes) = vols[i].clone();
        let target = k.target_path(&pod, &pv);
        let fault = [
            "",
            r#"{"fail_hotplugs": 1}"#,
            r#"{"fail_tasks": 1}"#,
            r#"{"drop_connections": 2}"#,
        ][rng.random_range(0..4)];
        match fault {
            "" => {}
            r#"{"fail_hotplugs": 1}"# => expected.failed_hotplugs += 1,
            r#"{"fail_tasks": 1}"# => expected.failed_tasks += 1,
            _ => expected.dropped_connections += 2,
        }
        if !fault.is_empty() {
            sim.set_knobs(fault).unwrap();
            faults += 1;
        }
        let (pc, n) = until_ok("publish", || {
            ctl.controller_publish_volume(Request::new(attacher::controller_publish(&pv, WORKER_2)))
        })
        .await;
        retries += n;
        assert_eq!(
            sim.faults(),
            expected,
            "round {round}: the fault {fault} did not fire"
        );
        let (_, n) = until_ok("stage", || {
            let (mut n, req) = (
                node.clone(),
                k.node_stage(&pv, &pc.publish_context, secrets.clone()),
            );
            async move { n.node_stage_volume(req).await }
        })
        .await;
        retries += n;
        node.node_publish_volume(k.node_publish(&pv, &pod, &pc.publish_context))
            .await
            .unwrap();
        if let Some(want) = &sum {
            let got = g
                .sh(&format!("sha256sum {target}/d | cut -d' ' -f1"))
                .await
                .unwrap();
            assert_eq!(&got, want, "round {round}: volume {i} lost its bytes");
        }
        let mut bytes = bytes;
        if rng.random_bool(0.3) && bytes < 2 << 30 {
            bytes += 512 << 20;
            let (_, n) = until_ok("expand", || {
                ctl.controller_expand_volume(Request::new(resizer::controller_expand(
                    &pv,
                    bytes as i64,
                )))
            })
            .await;
            retries += n;
            node.node_expand_volume(k.node_expand(&pv, &pod, bytes as i64, secrets.clone()))
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: NodeExpand of volume {i}: {}", e.message())
                });
        }
        let new_sum = g.sh(&format!("dd if=/dev/urandom of={target}/d bs=1M count=2 2>/dev/null && sync && sha256sum {target}/d | cut -d' ' -f1")).await.unwrap();
        node.node_unpublish_volume(k.node_unpublish(&pv, &pod))
            .await
            .unwrap();
        node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
        if rng.random_bool(0.5) {
            sim.set_knobs(r#"{"fail_hotplugs": 1}"#).unwrap();
            expected.failed_hotplugs += 1;
            faults += 1;
        }
        let (_, n) = until_ok("unpublish", || {
            ctl.controller_unpublish_volume(Request::new(attacher::controller_unpublish(
                &pv, WORKER_2,
            )))
        })
        .await;
        retries += n;
        assert_eq!(
            sim.faults(),
            expected,
            "round {round}: the unplug fault did not fire"
        );
        vols[i].2 = Some(new_sum);
        vols[i].3 = bytes;
    }
    // Every volume once more: the bytes last written are there.
    for (i, (pv, secrets, sum, _)) in vols.iter().enumerate() {
        let Some(want) = sum else { continue };
        let staging = k.staging_path(pv);
        let pc = attach(&ctl, pv, WORKER_2).await;
        node.node_stage_volume(k.node_stage(pv, &pc, secrets.clone()))
            .await
            .unwrap();
        let got = g
            .sh(&format!("sha256sum {staging}/d | cut -d' ' -f1"))
            .await
            .unwrap();
        assert_eq!(&got, want, "volume {i} lost its last bytes");
        node.node_unstage_volume(k.node_unstage(pv)).await.unwrap();
        detach(&ctl, pv, WORKER_2).await;
    }
    let vm: serde_json::Value = reqwest::Client::new()
        .get(format!("http://{}/pvesim/vms/112", sim.addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(vm["data"]["pending"], serde_json::json!({}), "{vm}");
    let keys: Vec<&String> = vm["data"]["config"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| {
            k.starts_with("unused")
                || k.strip_prefix("scsi")
                    .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .collect();
    assert!(keys.is_empty(), "left in VM 112: {keys:?}");
    eprintln!(
        "MEASURE guest soak: 14 rounds, {faults} faults, {retries} retried calls, every byte intact"
    );
}

/// LUKS on a kernel without AF_ALG, as Talos's: with the kernel's crypto
/// socket modules removed and module loading off, hostd run chrooted in the
/// Talos extension's service root formats and opens a LUKS2 volume with the
/// libcryptsetup and mkfs bundled there (their userspace crypto backend),
/// and dm-crypt serves the data.
#[tokio::test]
async fn luks_without_af_alg_in_the_kernel() {
    let Some((mut g, ctl, mut node, _held)) = Lab::start(Share::Shared, MINIMAL_ROLE)
        .await
        .map(Lab::parts)
    else {
        return;
    };
    // No socket(AF_ALG): its modules gone, and the kernel cannot load them
    // again on demand (request_module runs /proc/sys/kernel/modprobe).
    let gone = g
        .sh("rmmod algif_skcipher algif_hash af_alg; echo /bin/false > /proc/sys/kernel/modprobe; grep -cE '^(af_alg|algif_)' /proc/modules; grep -c '^ALG ' /proc/net/protocols; true")
        .await
        .unwrap_or_default();
    assert_eq!(
        gone.split_whitespace().collect::<Vec<_>>(),
        ["0", "0"],
        "{gone}"
    );

    // hostd as Talos runs it: from the extension's service root, with the
    // libraries and tools bundled there (the images' environment), the
    // spec's mounts and environment.
    tokio::task::spawn_blocking(e2e::guest::assemble_extension)
        .await
        .unwrap()
        .unwrap();
    let swapped = g
        .sh(&format!(
            "r=/run/ext-root; cp -a /ext/tree/rootfs/usr/local/lib/containers/proxmox-csi-hostd $r; \
             for d in dev sys proc tmp run/udev run/cryptsetup run/proxmox-csi-hostd var/lib/kubelet; do mkdir -p $r/$d; done; \
             mount --rbind /dev $r/dev; mount --make-rshared $r/dev; mount --rbind /sys $r/sys; \
             mount -t proc proc $r/proc; mount --bind /run/udev $r/run/udev; mount -o remount,bind,ro $r/run/udev; \
             mount --rbind /run/cryptsetup $r/run/cryptsetup; mount --rbind /var/lib/kubelet $r/var/lib/kubelet; \
             mount --make-rshared $r/var/lib/kubelet; mount --bind /run/proxmox-csi-hostd $r/run/proxmox-csi-hostd; \
             kill $(pidof proxmox-csi-hostd); sleep 0.5; rm -f {sock}; \
             (env -i DM_DISABLE_UDEV=1 PATH=/usr/sbin:/usr/bin chroot $r /usr/bin/proxmox-csi-hostd \
               --socket {sock} --socket-mode 666 --kubelet-root /var/lib/kubelet --luks-pbkdf pbkdf2:1000 \
               --device-wait 30 >> /run/hostd.log 2>&1 &); \
             n=0; until [ -S {sock} ]; do sleep 0.1; n=$((n+1)); [ $n -gt 100 ] && break; done; \
             grep -c \"$r/lib/x86_64-linux-gnu/libcryptsetup.so.12\" /proc/$(pidof proxmox-csi-hostd)/maps; true",
            sock = "/run/proxmox-csi-hostd/hostd.sock"
        ))
        .await
        .unwrap_or_default();
    assert!(
        swapped.trim().parse::<u32>().is_ok_and(|n| n > 0),
        "hostd does not run with the bundled libcryptsetup: {swapped}"
    );

    let k = kubelet();
    let pv = provision(&ctl, &class("local-lvm", "ext4"), &claim("no-af-alg")).await;
    let pc = attach(&ctl, &pv, WORKER_2).await;
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    let staged = tokio::time::timeout(
        Duration::from_secs(60),
        node.node_stage_volume(k.node_stage(&pv, &pc, luks())),
    )
    .await;
    if !matches!(staged, Ok(Ok(_))) {
        let why = g.sh("tail -5 /run/hostd.log").await.unwrap_or_default();
        panic!("NodeStage without AF_ALG failed: {staged:?}\nguest:\n{why}");
    }
    let staging = k.staging_path(&pv);
    let check = g
        .sh(&format!(
            "grep ' {staging} ' /proc/mounts; echo data > {staging}/f && sync && cat {staging}/f; \
             grep -cE '^(af_alg|algif_)' /proc/modules; true"
        ))
        .await
        .unwrap();
    assert!(
        check.contains("/dev/mapper/pvecsi-")
            && check.contains(" ext4 ")
            && check.contains("data\n0"),
        "{check}"
    );
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
    let mapped = g.sh("ls /dev/mapper").await.unwrap();
    assert!(!mapped.contains("pvecsi-"), "{mapped}");

    // The bundled mkfs.xfs's defaults (bigtime, inobtcount, reflink) mount
    // on this kernel, older than Talos's.
    let pv = provision(&ctl, &class("local-lvm", "xfs"), &claim("bundled-xfs")).await;
    let pc = attach(&ctl, &pv, WORKER_2).await;
    mkdirs(&mut g, k.stage_dirs(&pv)).await;
    node.node_stage_volume(k.node_stage(&pv, &pc, HashMap::new()))
        .await
        .unwrap();
    let staging = k.staging_path(&pv);
    let check = g
        .sh(&format!(
            "grep ' {staging} ' /proc/mounts; echo data > {staging}/f && sync && cat {staging}/f; true"
        ))
        .await
        .unwrap();
    assert!(check.contains(" xfs ") && check.contains("data"), "{check}");
    node.node_unstage_volume(k.node_unstage(&pv)).await.unwrap();
}
