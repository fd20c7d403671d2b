//! The planner's rules, one table row per case: a VM's config and pending
//! keys, the batch's jobs, and what the round writes and answers.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::error::CtlError;

const VMID: u32 = 112;

fn config(lines: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut c: BTreeMap<String, String> = lines
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    c.entry("scsi0".into())
        .or_insert_with(|| "local-lvm:vm-112-disk-0,size=8G".into());
    c
}

fn attach(disk: &str) -> Op {
    attach_with(disk, &[], Some(24))
}

fn attach_with(disk: &str, opts: &[(&str, &str)], limit: Option<u32>) -> Op {
    Op::Attach {
        volid: format!("local-lvm:{disk}"),
        handle: format!("r/pve1/local-lvm/{disk}"),
        opts: opts
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        limit,
    }
}

fn detach(disk: &str) -> Op {
    Op::Detach {
        volid: format!("local-lvm:{disk}"),
    }
}

fn run(
    cfg: &BTreeMap<String, String>,
    pending: &[&str],
    own: bool,
    ops: &[Op],
    per_write: usize,
) -> Plan {
    let pending: BTreeSet<String> = pending.iter().map(|k| k.to_string()).collect();
    let vm = VmView {
        vmid: VMID,
        config: cfg,
        pending: &pending,
        own,
    };
    let ops: Vec<&Op> = ops.iter().collect();
    plan(&vm, &ops, per_write)
}

fn write(p: Plan) -> Changes {
    match p {
        Plan::Write(c) => c,
        Plan::LiftProtection => panic!("expected a write, got a protection lift"),
    }
}

/// Each answer by job index: `None` for OK, else the error's kind.
fn codes(c: &Changes) -> Vec<(usize, Option<&'static str>)> {
    let mut out: Vec<_> = c
        .answers
        .iter()
        .map(|(i, r)| (*i, r.as_ref().err().map(kind)))
        .collect();
    out.sort_by_key(|(i, _)| *i);
    out
}

fn kind(e: &CtlError) -> &'static str {
    match e {
        CtlError::AlreadyExists(_) => "AlreadyExists",
        CtlError::FailedPrecondition(_) => "FailedPrecondition",
        CtlError::ResourceExhausted(_) => "ResourceExhausted",
        _ => "other",
    }
}

#[test]
fn slots_skip_taken_and_pending_keys() {
    let cfg = config(&[("scsi1", "local-lvm:vm-9999-pvc-a,wwn=0x5000000000000001")]);
    let c = write(run(
        &cfg,
        &["scsi2"],
        false,
        &[attach("vm-9999-pvc-b"), attach("vm-9999-pvc-c")],
        usize::MAX,
    ));
    let slots: Vec<&str> = c.sets.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(slots, ["scsi3", "scsi4"]);
    assert!(c.answers.is_empty() && c.deletes.is_empty());
    assert_eq!(
        c.present,
        ["local-lvm:vm-9999-pvc-b", "local-lvm:vm-9999-pvc-c"]
    );
    let line = DriveLine::parse(&c.sets[0].1);
    assert_eq!(line.volume, "local-lvm:vm-9999-pvc-b");
    assert_eq!(
        line.opts["wwn"],
        drive::wwn_for("r/pve1/local-lvm/vm-9999-pvc-b", 0)
    );
    assert_eq!(
        line.opts["serial"],
        drive::serial_for("r/pve1/local-lvm/vm-9999-pvc-b")
    );
    assert!(!c.protect, "a worker's protection is the operator's");
}

#[test]
fn a_wwn_already_on_the_vm_is_salted() {
    let taken = drive::wwn_for("r/pve1/local-lvm/vm-9999-pvc-b", 0);
    let cfg = config(&[(
        "scsi1",
        &format!("local-lvm:vm-1-other,wwn={}", taken.to_uppercase()),
    )]);
    let c = write(run(
        &cfg,
        &[],
        false,
        &[attach("vm-9999-pvc-b")],
        usize::MAX,
    ));
    let wwn = &c.attaches["local-lvm:vm-9999-pvc-b"].wwn;
    assert_eq!(*wwn, drive::wwn_for("r/pve1/local-lvm/vm-9999-pvc-b", 1));
}

#[test]
fn a_published_volume_is_answered_from_the_config_unless_its_access_differs() {
    let cfg = config(&[
        ("scsi3", "local-lvm:vm-9999-pvc-a,wwn=0x5aaa,serial=csi-a"),
        (
            "scsi4",
            "local-lvm:vm-9999-pvc-r,ro=1,wwn=0x5bbb,serial=csi-r",
        ),
    ]);
    let ops = [
        attach("vm-9999-pvc-a"),
        attach_with("vm-9999-pvc-a", &[("ro", "1")], Some(24)),
        attach("vm-9999-pvc-r"),
    ];
    let c = write(run(&cfg, &[], false, &ops, usize::MAX));
    assert!(c.is_empty());
    assert_eq!(
        codes(&c),
        [
            (0, None),
            (1, Some("AlreadyExists")),
            (2, Some("AlreadyExists"))
        ]
    );
    let Some((_, Ok(Some(a)))) = c.answers.iter().find(|(i, _)| *i == 0) else {
        panic!("job 0 is answered with its slot");
    };
    assert_eq!(
        (a.slot.as_str(), a.wwn.as_str(), a.serial.as_str()),
        ("scsi3", "0x5aaa", "csi-a")
    );
}

#[test]
fn the_volume_limit_counts_the_drivers_disks_and_this_round() {
    // Two volumes of the driver (owned by VMID 9999), one of the VM's own.
    let cfg = config(&[
        ("scsi1", "local-lvm:vm-9999-pvc-a"),
        ("scsi2", "local-lvm:vm-9999-pvc-b"),
        ("scsi5", "local-lvm:vm-112-disk-1"),
    ]);
    let ops = [
        attach_with("vm-9999-pvc-c", &[], Some(3)),
        attach_with("vm-9999-pvc-d", &[], Some(3)),
        attach_with("vm-9999-pvc-e", &[], None),
    ];
    let c = write(run(&cfg, &[], false, &ops, usize::MAX));
    assert_eq!(codes(&c), [(1, Some("ResourceExhausted"))]);
    assert_eq!(
        c.sets.len(),
        2,
        "the third, without a limit, is the controller's own"
    );
}

#[test]
fn a_full_vm_has_no_slot() {
    let lines: Vec<(String, String)> = (1..=30)
        .map(|n| (format!("scsi{n}"), format!("local-lvm:vm-112-disk-{n}")))
        .collect();
    let lines: Vec<(&str, &str)> = lines
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let c = write(run(
        &config(&lines),
        &[],
        false,
        &[attach("vm-9999-pvc-a")],
        usize::MAX,
    ));
    assert_eq!(codes(&c), [(0, Some("ResourceExhausted"))]);
    assert!(c.is_empty());
}

#[test]
fn a_protected_worker_takes_no_disk_and_keeps_its_disks() {
    let cfg = config(&[("protection", "1"), ("scsi1", "local-lvm:vm-9999-pvc-a")]);
    let ops = [
        attach("vm-9999-pvc-b"),
        detach("vm-9999-pvc-a"),
        detach("vm-9999-pvc-x"),
    ];
    let c = write(run(&cfg, &[], false, &ops, usize::MAX));
    assert!(c.is_empty());
    assert_eq!(
        codes(&c),
        [
            (0, Some("FailedPrecondition")),
            (1, Some("FailedPrecondition")),
            (2, None),
        ]
    );
    assert_eq!(c.absent, ["local-lvm:vm-9999-pvc-x"]);
}

#[test]
fn the_controllers_own_protected_vm_is_unprotected_to_detach_and_protected_again() {
    let cfg = config(&[("protection", "1"), ("scsi1", "local-lvm:vm-9999-pvc-a")]);
    assert!(matches!(
        run(&cfg, &[], true, &[detach("vm-9999-pvc-a")], usize::MAX),
        Plan::LiftProtection
    ));
    // Lifted: the detach is written with the flag set again.
    let cfg = config(&[("scsi1", "local-lvm:vm-9999-pvc-a")]);
    let c = write(run(&cfg, &[], true, &[detach("vm-9999-pvc-a")], usize::MAX));
    assert_eq!(c.deletes, ["scsi1"]);
    assert_eq!(
        c.form("d1"),
        [
            ("delete", "scsi1".to_string()),
            ("protection", "1".to_string()),
            ("digest", "d1".to_string())
        ]
    );
}

#[test]
fn per_write_bounds_a_round_and_a_repeated_job_shares_its_plan() {
    let cfg = config(&[
        ("scsi1", "local-lvm:vm-9999-pvc-a"),
        ("scsi2", "local-lvm:vm-9999-pvc-b"),
    ]);
    let ops = [
        attach("vm-9999-pvc-c"),
        attach("vm-9999-pvc-c"),
        detach("vm-9999-pvc-a"),
        attach("vm-9999-pvc-d"),
    ];
    let one = write(run(&cfg, &[], false, &ops, 1));
    assert_eq!(one.len(), 1);
    assert!(one.holds("local-lvm:vm-9999-pvc-c") && !one.holds("local-lvm:vm-9999-pvc-a"));
    assert!(one.answers.is_empty(), "jobs left wait for the next round");
    let all = write(run(&cfg, &[], false, &ops, usize::MAX));
    assert_eq!(all.sets.len(), 2, "one slot for both publishes of pvc-c");
    assert_eq!(all.deletes, ["scsi1"]);
    assert_eq!(all.attaches["local-lvm:vm-9999-pvc-c"].slot, "scsi3");
}
