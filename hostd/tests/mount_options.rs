//! Every mount option hostd accepts, mounted by the running kernel on a real
//! ext4 and xfs filesystem (loop devices; needs root, CI is root): the
//! allow-list says what the kernel's tables say, no more and no less.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use proxmox_csi_hostd::mountopts::{self, Value};
use support::Loop;

/// Values the kernel takes for options whose kind alone does not say
/// (a power of two, a pair given together, a range, a companion option).
fn example(fs: &str, name: &str, value: Value) -> String {
    let v = match (fs, name, value) {
        ("ext4", "journal_async_commit", _) => {
            return "journal_async_commit,data=writeback".into();
        }
        (_, n, Value::Flag) => return n.to_string(),
        ("xfs", "sunit" | "swidth", _) => return "sunit=8,swidth=16".into(),
        ("xfs", "logbufs", _) => "8",
        ("xfs", "logbsize", _) => "256k",
        ("ext4", "usrjquota" | "grpjquota", _) => return format!("{name}=aquota.x,jqfmt=vfsv0"),
        ("ext4", "debug_want_extra_isize", _) => "32",
        ("ext4", "inode_readahead_blks", _) => "64",
        ("ext4", "commit" | "journal_ioprio", _) => "3",
        ("ext4", "check", _) => "none",
        ("ext4", "resuid" | "resgid" | "journal", _) => "0",
        (_, _, Value::Number) => "1",
        (_, _, Value::Size) => "64k",
        (_, _, Value::OneOf(set)) => set[0],
        (_, _, Value::RootFile) => "aquota.x",
        (_, _, Value::Word) => "none",
    };
    format!("{name}={v}")
}

/// Options the kernel takes only under conditions a loop device or this
/// test's filesystem does not meet, with the condition: hostd still passes
/// them on (the kernel is the judge there), and a failure must be EINVAL or
/// EOPNOTSUPP, never anything else.
fn conditional(fs: &str, option: &str) -> Option<&'static str> {
    let name = option.split('=').next().unwrap_or(option);
    Some(match (fs, name) {
        (_, "dax") => "a DAX-capable device (pmem)",
        ("ext4", "fc_debug_force" | "fc_debug_max_replay") => "a kernel built with EXT4_DEBUG",
        ("ext4", "test_dummy_encryption") => "a filesystem with the encrypt feature",
        ("ext4", "prjquota") => "a filesystem with the project feature",
        ("xfs", "max_open_zones" | "lifetime" | "nolifetime") => "a zoned device",
        (
            "xfs",
            "quota" | "usrquota" | "grpquota" | "prjquota" | "uquota" | "gquota" | "pquota"
            | "uqnoenforce" | "gqnoenforce" | "pqnoenforce" | "qnoenforce",
        ) => "a kernel built with XFS_QUOTA",
        ("xfs", "max_atomic_write") => "a device with atomic writes",
        ("xfs", "noattr2") => "a V4 filesystem (the kernel refuses it on V5)",
        ("xfs", "ikeep" | "noikeep" | "attr2") => "a kernel that has not retired it",
        _ => return None,
    })
}

struct Fs {
    _dir: tempfile::TempDir,
    dev: Loop,
    target: PathBuf,
}

fn filesystem(fs: &str) -> Fs {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.raw");
    let dev = Loop::create(&img, 1 << 30).unwrap();
    let mkfs = match fs {
        // With a stripe geometry, which sunit= and swidth= need.
        "xfs" => Command::new("mkfs.xfs")
            .args(["-q", "-d", "su=4k,sw=2"])
            .arg(&dev.dev)
            .output(),
        _ => Command::new("mkfs.ext4")
            .args(["-q", "-b", "4096"])
            .arg(&dev.dev)
            .output(),
    }
    .unwrap();
    assert!(mkfs.status.success(), "mkfs.{fs}: {mkfs:?}");
    let target = dir.path().join("mnt");
    std::fs::create_dir(&target).unwrap();
    Fs {
        _dir: dir,
        dev,
        target,
    }
}

/// Mounts with what hostd made of `option`; Ok(()) when the kernel took it.
fn try_mount(f: &Fs, fs: &str, option: &str) -> Result<(), nix::Error> {
    let mut checked = mountopts::check("mount_flags", Some(fs), &[option.to_string()])
        .unwrap_or_else(|e| panic!("hostd refused {option:?} for {fs}: {e}"));
    if option.starts_with("norecovery") {
        checked.flags |= MsFlags::MS_RDONLY;
    }
    let data = (!checked.data.is_empty()).then_some(checked.data.as_str());
    mount(Some(&f.dev.dev), &f.target, Some(fs), checked.flags, data)?;
    umount2(&f.target, MntFlags::empty()).unwrap();
    Ok(())
}

fn every_option_mounts(fs: &str) {
    let f = filesystem(fs);
    let mut options: Vec<String> = mountopts::table(fs)
        .unwrap()
        .iter()
        .map(|e| example(fs, e.name, e.value))
        .collect();
    // The generic flags mount(8) maps, each on its own.
    options.extend(
        [
            "ro",
            "rw",
            "noatime",
            "nodiratime",
            "relatime",
            "norelatime",
            "strictatime",
            "nostrictatime",
            "lazytime",
            "nolazytime",
            "nosuid",
            "nodev",
            "noexec",
            "sync",
            "dirsync",
            "mand",
            "nomand",
            "silent",
            "loud",
            "iversion",
            "noiversion",
            "nosymfollow",
            "symfollow",
            "nofail",
            "_netdev",
            "x-systemd.automount",
        ]
        .map(String::from),
    );
    let mut refused = BTreeMap::new();
    for o in &options {
        match try_mount(&f, fs, o) {
            Ok(()) => {}
            Err(e) => match conditional(fs, o) {
                Some(_) => assert!(
                    matches!(e, nix::Error::EINVAL | nix::Error::EOPNOTSUPP),
                    "{fs} {o}: {e}"
                ),
                None => {
                    refused.insert(o.clone(), e);
                }
            },
        }
    }
    assert!(
        refused.is_empty(),
        "the kernel refused options hostd accepts for {fs}: {refused:?}"
    );
}

#[test]
fn every_ext4_option_hostd_accepts_mounts() {
    testkit::require_root!();
    every_option_mounts("ext4");
}

#[test]
fn every_xfs_option_hostd_accepts_mounts() {
    testkit::require_root!();
    every_option_mounts("xfs");
}
