//! After a config write: the committed config is read again, what Proxmox
//! left pending (a failed hot-plug) is reverted, and each job is answered
//! by what the VM holds now, not by what the write answered.

use std::collections::{BTreeMap, BTreeSet};

use super::plan::{Answer, Changes};
use super::{Attached, Op, address_of};
use crate::drive::{self, DriveLine};
use crate::error::CtlError;
use crate::pve::{Client, Deadline};

/// How the write itself ended, when it did not simply succeed.
#[derive(Debug, Default)]
pub struct WriteOutcome {
    /// Proxmox failed the task or a hot-plug: part of the change may be
    /// there, part pending.
    pub failure: Option<String>,
    /// Proxmox was busy: what did not happen is tried again.
    pub retry_rest: bool,
    /// A privilege Proxmox refused in the worker (VM.Config.Disk per
    /// drive), with its remedy: no retry helps until it is granted.
    pub denied: Option<String>,
}

/// Each job's answer after the write, and the index updates.
#[derive(Debug, Default)]
pub struct Judged {
    pub answers: Vec<Answer>,
    pub present: Vec<String>,
    pub absent: Vec<String>,
    /// Detached volumes Proxmox kept as `unusedN`: the VM owns them.
    pub kept_unused: Vec<String>,
}

/// The keys of the write Proxmox left pending: to revert.
pub fn left_pending(c: &Changes, still_pending: &BTreeSet<String>) -> Vec<String> {
    c.sets
        .iter()
        .map(|(k, _)| k.clone())
        .chain(c.deletes.iter().cloned())
        .filter(|k| still_pending.contains(k))
        .collect()
}

/// Answers the jobs the write held, by the committed config `after`. A
/// change that is not there is answered as failed only when it was
/// written alone and Proxmox was not merely busy: otherwise the job waits
/// for the next round (alone, or again).
pub fn judge(
    vmid: u32,
    after: &BTreeMap<String, String>,
    c: &Changes,
    jobs: &[&Op],
    outcome: &WriteOutcome,
) -> Judged {
    let multi = c.len() > 1;
    let final_answer = !outcome.retry_rest && !multi;
    let why = outcome
        .failure
        .clone()
        .unwrap_or_else(|| "Proxmox left the change pending".to_string());
    let mut j = Judged::default();
    for (i, op) in jobs.iter().enumerate() {
        let volid = op.volid().to_string();
        match op {
            Op::Attach { .. } => {
                let Some(p) = c.attaches.get(&volid) else {
                    continue;
                };
                if after
                    .get(&p.slot)
                    .is_some_and(|v| DriveLine::parse(v).volume == volid)
                {
                    j.present.push(volid);
                    j.answers.push((
                        i,
                        Ok(Some(Attached {
                            slot: p.slot.clone(),
                            wwn: p.wwn.clone(),
                            serial: p.serial.clone(),
                            address: address_of(after, &p.slot),
                        })),
                    ));
                    continue;
                }
                if final_answer {
                    j.answers.push((i, Err(match &outcome.denied {
                        Some(remedy) => CtlError::FailedPrecondition(format!(
                            "attaching {volid} to VM {vmid} as {}: {remedy}", p.slot
                        )),
                        None => CtlError::Unavailable(format!(
                            "attaching {volid} to VM {vmid} as {} failed and was reverted: {why}", p.slot
                        )),
                    })));
                }
                j.absent.push(volid);
            }
            Op::Detach { .. } => {
                if !c.detaches.contains(&volid) {
                    continue;
                }
                if drive::slots_with(after, &volid).is_empty() {
                    if after.iter().any(|(k, v)| {
                        k.starts_with("unused") && DriveLine::parse(v).volume == volid
                    }) {
                        j.kept_unused.push(volid.clone());
                    }
                    j.absent.push(volid);
                    j.answers.push((i, Ok(None)));
                } else if final_answer {
                    j.answers.push((
                        i,
                        Err(match &outcome.denied {
                            Some(remedy) => CtlError::FailedPrecondition(format!(
                                "detaching {volid} from VM {vmid}: {remedy}"
                            )),
                            None => CtlError::Unavailable(format!(
                                "detaching {volid} from VM {vmid} failed and was reverted: {why}"
                            )),
                        }),
                    ));
                }
            }
        }
    }
    j
}

/// Reverts `keys` Proxmox left pending. Reverting a pending disk is a
/// delete, which a protected VM refuses: the controller's own VM (`own`)
/// is unprotected for it and protected again after. Failures are logged:
/// the jobs are answered by the config either way.
pub async fn revert(
    client: &Client,
    node: &str,
    vmid: u32,
    own_and_protected: bool,
    keys: &[String],
    d: Deadline,
) {
    let lifted = own_and_protected && {
        let lift = [("delete", "protection".to_string())];
        client.update_config(node, vmid, &lift, d).await.is_ok()
    };
    let revert = [("revert", keys.join(","))];
    if let Err(e) = client.update_config(node, vmid, &revert, d).await {
        tracing::error!(vmid, keys = %keys.join(","), error = %e, "reverting a change Proxmox left pending failed");
    }
    if lifted {
        let protect = [("protection", "1".to_string())];
        if let Err(e) = client.update_config(node, vmid, &protect, d).await {
            tracing::error!(vmid, error = %e, "protecting the driver's own VM again failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::plan::Planned;
    use super::*;

    fn after(lines: &[(&str, &str)]) -> BTreeMap<String, String> {
        lines
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn attach(volid: &str) -> Op {
        Op::Attach {
            volid: volid.into(),
            handle: format!("r/pve1/{volid}"),
            opts: BTreeMap::new(),
            limit: None,
        }
    }

    fn written(attaches: &[(&str, &str)], detaches: &[&str]) -> Changes {
        Changes {
            sets: attaches
                .iter()
                .map(|(v, slot)| (slot.to_string(), v.to_string()))
                .collect(),
            deletes: detaches.iter().map(|_| "scsi9".to_string()).collect(),
            attaches: attaches
                .iter()
                .map(|(v, slot)| {
                    let p = Planned {
                        slot: slot.to_string(),
                        wwn: "0x5000000000000abc".into(),
                        serial: "csi-abc".into(),
                    };
                    (v.to_string(), p)
                })
                .collect::<HashMap<_, _>>(),
            detaches: detaches.iter().map(|v| v.to_string()).collect(),
            ..Changes::default()
        }
    }

    #[test]
    fn what_the_committed_config_holds_is_the_answer() {
        let c = written(&[("l:vm-9-a", "scsi1")], &[]);
        let ops = [attach("l:vm-9-a")];
        let ops: Vec<&Op> = ops.iter().collect();
        let there = after(&[
            ("scsi1", "l:vm-9-a,wwn=0x5000000000000abc"),
            ("scsihw", "virtio-scsi-single"),
        ]);
        let j = judge(112, &there, &c, &ops, &WriteOutcome::default());
        let [(0, Ok(Some(a)))] = j.answers.as_slice() else {
            panic!("{:?}", j.answers);
        };
        assert_eq!((a.slot.as_str(), a.serial.as_str()), ("scsi1", "csi-abc"));
        assert_eq!(j.present, ["l:vm-9-a"]);
        // The task said it failed, but the disk is there: it is attached.
        let failed = WriteOutcome {
            failure: Some("hotplug problem".into()),
            ..WriteOutcome::default()
        };
        let j = judge(112, &there, &c, &ops, &failed);
        assert!(matches!(j.answers.as_slice(), [(0, Ok(Some(_)))]));
    }

    #[test]
    fn a_change_not_committed_is_answered_only_when_written_alone() {
        let failed = WriteOutcome {
            failure: Some("hotplug problem".into()),
            ..WriteOutcome::default()
        };
        let ops = [attach("l:vm-9-a"), attach("l:vm-9-b")];
        let ops: Vec<&Op> = ops.iter().collect();
        let alone = written(&[("l:vm-9-a", "scsi1")], &[]);
        let j = judge(112, &after(&[]), &alone, &ops, &failed);
        let [(0, Err(CtlError::Unavailable(m)))] = j.answers.as_slice() else {
            panic!("{:?}", j.answers);
        };
        assert!(
            m.ends_with("failed and was reverted: hotplug problem"),
            "{m}"
        );
        assert_eq!(j.absent, ["l:vm-9-a"]);
        // Several in one write: each is tried again alone (Round::Split).
        let both = written(&[("l:vm-9-a", "scsi1"), ("l:vm-9-b", "scsi2")], &[]);
        let j = judge(112, &after(&[]), &both, &ops, &failed);
        assert!(j.answers.is_empty());
        assert_eq!(j.absent, ["l:vm-9-a", "l:vm-9-b"]);
        // Busy: tried again, not answered.
        let busy = WriteOutcome {
            retry_rest: true,
            ..WriteOutcome::default()
        };
        assert!(
            judge(112, &after(&[]), &alone, &ops, &busy)
                .answers
                .is_empty()
        );
        // A refused privilege names its remedy.
        let denied = WriteOutcome {
            denied: Some("grant VM.Config.Disk".into()),
            ..WriteOutcome::default()
        };
        let j = judge(112, &after(&[]), &alone, &ops, &denied);
        assert!(matches!(
            j.answers.as_slice(),
            [(0, Err(CtlError::FailedPrecondition(_)))]
        ));
    }

    #[test]
    fn a_detach_is_done_when_no_slot_holds_the_volume() {
        let ops = [Op::Detach {
            volid: "l:vm-9-a".into(),
        }];
        let ops: Vec<&Op> = ops.iter().collect();
        let c = written(&[], &["l:vm-9-a"]);
        let j = judge(
            112,
            &after(&[("unused0", "l:vm-9-a")]),
            &c,
            &ops,
            &WriteOutcome::default(),
        );
        assert!(matches!(j.answers.as_slice(), [(0, Ok(None))]));
        assert_eq!(j.kept_unused, ["l:vm-9-a"]);
        let j = judge(
            112,
            &after(&[("scsi9", "l:vm-9-a")]),
            &c,
            &ops,
            &WriteOutcome::default(),
        );
        assert!(matches!(
            j.answers.as_slice(),
            [(0, Err(CtlError::Unavailable(_)))]
        ));
        assert!(j.absent.is_empty());
    }

    #[test]
    fn only_the_writes_own_keys_are_reverted() {
        let c = written(&[("l:vm-9-a", "scsi1")], &["l:vm-9-b"]);
        let pending = ["scsi1", "scsi9", "scsi4"].map(String::from).into();
        assert_eq!(left_pending(&c, &pending), ["scsi1", "scsi9"]);
    }
}
