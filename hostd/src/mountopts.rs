//! Mount options hostd passes to the kernel: an allow-list per filesystem.
//!
//! The node plugin is not trusted to filter them: `logdev=` and `rtdev=`
//! (xfs), `journal_path=`/`journal_dev=` (ext4) open another block device,
//! and `errors=panic` panics the node. What is allowed is what the kernel's
//! own option tables accept and is harmless (fs/ext4/super.c
//! `ext4_param_specs`, fs/xfs/xfs_super.c `xfs_fs_parameters`), the generic
//! flags of mount(2), the SELinux `context=` kubelet adds, and the options
//! only mount(8) reads (`nofail`, `_netdev`, `x-*`, …), which the Go
//! driver's users have in StorageClasses and which mean nothing to the
//! kernel: those are dropped.

use nix::mount::MsFlags;

use crate::error::HostdError;

/// Generic options, as mount(8) maps them to mount(2) flags.
fn generic(o: &str) -> Option<MsFlags> {
    Some(match o {
        "ro" => MsFlags::MS_RDONLY,
        "rw" | "defaults" | "async" | "exec" | "suid" | "dev" | "atime" | "diratime" => {
            MsFlags::empty()
        }
        "noatime" => MsFlags::MS_NOATIME,
        "nodiratime" => MsFlags::MS_NODIRATIME,
        "relatime" => MsFlags::MS_RELATIME,
        "strictatime" => MsFlags::MS_STRICTATIME,
        "lazytime" => MsFlags::MS_LAZYTIME,
        "nosuid" => MsFlags::MS_NOSUID,
        "nodev" => MsFlags::MS_NODEV,
        "noexec" => MsFlags::MS_NOEXEC,
        "sync" => MsFlags::MS_SYNCHRONOUS,
        "dirsync" => MsFlags::MS_DIRSYNC,
        _ => return None,
    })
}

/// Options only mount(8) and fstab readers act on.
fn userspace_only(o: &str) -> bool {
    matches!(
        o,
        "auto"
            | "noauto"
            | "nofail"
            | "_netdev"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "comment"
    ) || o.starts_with("x-")
        || o.starts_with("comment=")
}

fn selinux(o: &str) -> bool {
    ["context=", "fscontext=", "defcontext=", "rootcontext="]
        .iter()
        .any(|p| o.starts_with(p))
}

fn number(v: &str) -> bool {
    !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit())
}

/// A size as xfs takes it: digits with an optional k, m or g.
fn size(v: &str) -> bool {
    number(v.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G']))
}

fn ext4_data(o: &str) -> bool {
    let (k, v) = o.split_once('=').unwrap_or((o, ""));
    match (k, v) {
        (
            "discard"
            | "nodiscard"
            | "barrier"
            | "nobarrier"
            | "user_xattr"
            | "acl"
            | "noacl"
            | "delalloc"
            | "nodelalloc"
            | "auto_da_alloc"
            | "noauto_da_alloc"
            | "dioread_lock"
            | "dioread_nolock"
            | "journal_checksum"
            | "nojournal_checksum"
            | "journal_async_commit"
            | "init_itable"
            | "noinit_itable"
            | "quota"
            | "noquota"
            | "usrquota"
            | "grpquota"
            | "prjquota"
            | "i_version"
            | "nombcache"
            | "block_validity"
            | "noblock_validity"
            | "grpid"
            | "bsdgroups"
            | "nogrpid"
            | "sysvgroups"
            | "nouid32"
            | "debug"
            | "dax",
            "",
        ) => true,
        ("data", "ordered" | "writeback" | "journal") => true,
        ("errors", "remount-ro" | "continue") => true,
        ("dax", "always" | "never" | "inode") => true,
        (
            "commit"
            | "barrier"
            | "init_itable"
            | "stripe"
            | "max_batch_time"
            | "min_batch_time"
            | "inode_readahead_blks"
            | "resuid"
            | "resgid"
            | "journal_ioprio"
            | "max_dir_size_kb",
            v,
        ) => number(v),
        _ => false,
    }
}

fn xfs_data(o: &str) -> bool {
    let (k, v) = o.split_once('=').unwrap_or((o, ""));
    match (k, v) {
        (
            "nouuid" | "discard" | "nodiscard" | "wsync" | "noalign" | "swalloc" | "inode32"
            | "inode64" | "largeio" | "nolargeio" | "filestreams" | "ikeep" | "noikeep" | "grpid"
            | "bsdgroups" | "nogrpid" | "sysvgroups" | "quota" | "usrquota" | "uquota"
            | "uqnoenforce" | "qnoenforce" | "gquota" | "grpquota" | "gqnoenforce" | "pquota"
            | "prjquota" | "pqnoenforce" | "noquota" | "attr2" | "noattr2" | "dax",
            "",
        ) => true,
        ("dax", "always" | "never" | "inode") => true,
        ("logbufs" | "sunit" | "swidth", v) => number(v),
        ("logbsize" | "allocsize" | "biosize", v) => size(v),
        _ => false,
    }
}

/// What to hand to mount(2): its flags and the filesystem's data string.
#[derive(Debug, PartialEq, Eq)]
pub struct Checked {
    pub flags: MsFlags,
    pub data: String,
}

impl Default for Checked {
    fn default() -> Self {
        Self {
            flags: MsFlags::empty(),
            data: String::new(),
        }
    }
}

/// Checks mount flags for a filesystem (`ext2`, `ext3`, `ext4`: the kernel's
/// ext4 driver mounts all three with its options; `xfs`), or for a bind
/// mount (`None`: only generic flags take effect there; a filesystem's own
/// options, still checked, were given to the staging mount).
pub fn check(
    field: &'static str,
    fs: Option<&str>,
    flags: &[String],
) -> Result<Checked, HostdError> {
    let mut out = Checked::default();
    let mut data = Vec::new();
    let ext = fs.is_none_or(|f| matches!(f, "ext2" | "ext3" | "ext4"));
    let xfs = fs.is_none_or(|f| f == "xfs");
    for o in proxmox_csi_common::mount_options::split(flags) {
        if o.contains(['\n', '\0']) {
            return Err(HostdError::invalid(
                field,
                format!("{o:?} holds a control character"),
            ));
        }
        if let Some(f) = generic(&o) {
            out.flags |= f;
        } else if userspace_only(&o) {
            continue;
        } else if selinux(&o) || (ext && ext4_data(&o)) || (xfs && xfs_data(&o)) {
            data.push(o);
        } else {
            return Err(HostdError::invalid(
                field,
                format!(
                    "mount option {o:?} is not allowed{}: it is not one of the {} options hostd accepts \
                     (device options such as logdev= and errors=panic never are)",
                    fs.map(|f| format!(" for {f}")).unwrap_or_default(),
                    fs.unwrap_or("ext4 and xfs")
                ),
            ));
        }
    }
    if fs.is_some() {
        out.data = data.join(",");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn splits_flags_into_kernel_flags_and_data() {
        let c = check(
            "f",
            Some("xfs"),
            &v(&["noatime", "nouuid", "ro", "discard"]),
        )
        .unwrap();
        assert_eq!(
            c,
            Checked {
                flags: MsFlags::MS_NOATIME | MsFlags::MS_RDONLY,
                data: "nouuid,discard".into()
            }
        );
    }

    #[test]
    fn takes_what_mount8_takes_and_drops_its_own_options() {
        let c = check(
            "f",
            Some("ext4"),
            &v(&[
                "noatime,discard",
                "nofail",
                "_netdev",
                "x-systemd.automount",
                "auto",
                "exec",
                "async",
            ]),
        )
        .unwrap();
        assert_eq!(
            c,
            Checked {
                flags: MsFlags::MS_NOATIME,
                data: "discard".into()
            }
        );
        let c = check(
            "f",
            Some("ext4"),
            &v(&[
                "context=\"system_u:object_r:container_file_t:s0:c1,c2\"",
                "errors=remount-ro",
            ]),
        )
        .unwrap();
        assert_eq!(
            c.data,
            "context=\"system_u:object_r:container_file_t:s0:c1,c2\",errors=remount-ro"
        );
    }

    #[test]
    fn refuses_device_options_and_panics() {
        for (fs, o) in [
            ("xfs", "logdev=/dev/sda"),
            ("xfs", "rtdev=/dev/sda"),
            ("ext4", "journal_path=/dev/sda"),
            ("ext4", "journal_dev=8"),
            ("ext4", "errors=panic"),
            ("ext4", "noatime,errors=panic"),
            ("ext4", "nouuid"),
            ("xfs", "data=journal"),
            ("ext4", "commit=5s"),
        ] {
            let e = check("volume_capability.mount_flags", Some(fs), &v(&[o]))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("volume_capability.mount_flags: mount option"),
                "{e}"
            );
        }
        // A bind mount checks them too, and hands on only the generic flags.
        assert!(check("f", None, &v(&["logdev=/dev/sda"])).is_err());
        assert_eq!(
            check("f", None, &v(&["discard", "ro"])).unwrap(),
            Checked {
                flags: MsFlags::MS_RDONLY,
                data: String::new()
            }
        );
    }
}
