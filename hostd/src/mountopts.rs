//! Mount options hostd passes to the kernel.
//!
//! The node plugin is not trusted to filter them. Refused are only the
//! options that name a device or a path, or act on the journal or on errors
//! beyond the volume: `logdev=` and `rtdev=` (xfs), `journal_dev=`,
//! `journal_path=`, `abort` and `errors=panic` (ext4), mount(8)'s device
//! set-ups (`loop`, `verity.*`), and the flags that change what the call
//! does rather than how the filesystem behaves (`bind`, `remount`, `move`,
//! propagation). Every other option the kernel's own tables list is
//! accepted with a value of the kind the table declares, so that
//! StorageClasses written for mount(8) keep working: fs/ext4/super.c
//! `ext4_param_specs`, fs/xfs/xfs_super.c `xfs_fs_parameters` (Linux 6.17),
//! and util-linux libmount/src/optmap.c `linux_flags_map` for the generic
//! flags. Options only mount(8) reads (`nofail`, `_netdev`, `x-*`, …,
//! `userspace_opts_map` there) mean nothing to the kernel and are dropped.

use nix::mount::MsFlags;

use crate::error::HostdError;

/// Generic options, as util-linux's `linux_flags_map` maps them to mount(2)
/// flags. The `no…` forms of flags a new mount does not set are no-ops
/// (`norelatime`: a new mount is relatime unless told otherwise).
fn generic(o: &str) -> Option<MsFlags> {
    Some(match o {
        "ro" => MsFlags::MS_RDONLY,
        "rw" | "defaults" | "async" | "exec" | "suid" | "dev" | "atime" | "diratime"
        | "norelatime" | "nostrictatime" | "nolazytime" | "nomand" | "noiversion" | "loud"
        | "symfollow" => MsFlags::empty(),
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
        "mand" => MsFlags::MS_MANDLOCK,
        "silent" => MsFlags::MS_SILENT,
        "iversion" => MsFlags::MS_I_VERSION,
        "nosymfollow" => MsFlags::from_bits_retain(nix::libc::MS_NOSYMFOLLOW),
        _ => return None,
    })
}

/// Options only mount(8) and fstab readers act on (`userspace_opts_map`),
/// but for those that set up a device (`loop`, `verity.*`: refused).
fn userspace_only(o: &str) -> bool {
    let name = o.split('=').next().unwrap_or(o);
    matches!(
        name,
        "auto"
            | "noauto"
            | "nofail"
            | "_netdev"
            | "user"
            | "nouser"
            | "users"
            | "nousers"
            | "owner"
            | "noowner"
            | "group"
            | "nogroup"
            | "comment"
            | "uhelper"
            | "helper"
    ) || o.starts_with("x-")
        || o.starts_with("X-")
}

fn selinux(o: &str) -> bool {
    ["context=", "fscontext=", "defcontext=", "rootcontext="]
        .iter()
        .any(|p| o.starts_with(p))
}

/// An SELinux context as mount(8) and kubelet write it: `user:role:type:level`
/// characters, quoted (`"…"`, the only place a comma or a quote may be,
/// as the kernel's SELinux option parser reads quotes) or not.
fn selinux_value(v: &str) -> bool {
    let context = |c: &str, comma: bool| {
        !c.is_empty()
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b) || (comma && b == b','))
    };
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => context(inner, true),
        None => context(v, false),
    }
}

/// Why an option is refused whatever its filesystem, if it is.
fn refused(o: &str) -> Option<&'static str> {
    let name = o.split('=').next().unwrap_or(o);
    Some(match name {
        "logdev" | "rtdev" | "journal_dev" | "journal_path" => {
            "it names a device other than the volume's"
        }
        // A superblock from a block inside the filesystem, which a pod
        // can write: the kernel would parse its geometry and metadata.
        "sb" => "it names a block to read the superblock from, which a pod can write",
        "loop" | "offset" | "sizelimit" | "encryption" => {
            "it asks mount(8) to set up a loop device"
        }
        n if n.starts_with("verity.") => "it asks mount(8) to set up a verity device",
        "errors" if o == "errors=panic" => "it panics the node on a filesystem error",
        "abort" => "it aborts the journal, as a test of error handling",
        "bind" | "rbind" | "move" | "remount" | "shared" | "rshared" | "slave" | "rslave"
        | "private" | "rprivate" | "unbindable" | "runbindable" => {
            "it changes what the mount call does, not how the filesystem behaves"
        }
        _ => return None,
    })
}

/// What a table entry takes after `=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A flag: nothing.
    Flag,
    /// `fsparam_u32`/`fsparam_s32`/`fsparam_uid`/`fsparam_gid`: digits.
    Number,
    /// A size with an optional k, m or g (xfs's `suffix_kstrtoint`).
    Size,
    /// `fsparam_enum`: one of these.
    OneOf(&'static [&'static str]),
    /// A file name in the filesystem's root (ext4's journaled quota files:
    /// the kernel refuses a `/`), or empty to clear it.
    RootFile,
    /// `fsparam_string` of an option the kernel ignores (`check=`).
    Word,
}

/// One entry of a kernel option table.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    pub value: Value,
}

const fn e(name: &'static str, value: Value) -> Entry {
    Entry { name, value }
}

use Value::{Flag, Number, OneOf, RootFile, Size, Word};

const DAX: &[&str] = &["always", "inode", "never"];

/// fs/ext4/super.c `ext4_param_specs` (Linux 6.17), in its order, without
/// what `refused` names. Entries the kernel marks `Opt_removed` (`oldalloc`,
/// `bh`, `i_version`, `check=`, …) are still accepted and ignored by it.
pub const EXT4: &[Entry] = &[
    e("bsddf", Flag),
    e("minixdf", Flag),
    e("grpid", Flag),
    e("bsdgroups", Flag),
    e("nogrpid", Flag),
    e("sysvgroups", Flag),
    e("resgid", Number),
    e("resuid", Number),
    e("errors", OneOf(&["continue", "remount-ro"])),
    e("nouid32", Flag),
    e("debug", Flag),
    e("oldalloc", Flag),
    e("orlov", Flag),
    e("user_xattr", Flag),
    e("acl", Flag),
    e("norecovery", Flag),
    e("noload", Flag),
    e("bh", Flag),
    e("nobh", Flag),
    e("commit", Number),
    e("min_batch_time", Number),
    e("max_batch_time", Number),
    e("journal_checksum", Flag),
    e("nojournal_checksum", Flag),
    e("journal_async_commit", Flag),
    e("data", OneOf(&["journal", "ordered", "writeback"])),
    e("data_err", OneOf(&["abort", "ignore"])),
    e("usrjquota", RootFile),
    e("grpjquota", RootFile),
    e("jqfmt", OneOf(&["vfsold", "vfsv0", "vfsv1"])),
    e("grpquota", Flag),
    e("quota", Flag),
    e("noquota", Flag),
    e("usrquota", Flag),
    e("prjquota", Flag),
    e("barrier", Flag),
    e("barrier", Number),
    e("nobarrier", Flag),
    e("i_version", Flag),
    e("dax", Flag),
    e("dax", OneOf(DAX)),
    e("stripe", Number),
    e("delalloc", Flag),
    e("nodelalloc", Flag),
    e("warn_on_error", Flag),
    e("nowarn_on_error", Flag),
    e("debug_want_extra_isize", Number),
    e("mblk_io_submit", Flag),
    e("nomblk_io_submit", Flag),
    e("block_validity", Flag),
    e("noblock_validity", Flag),
    e("inode_readahead_blks", Number),
    e("journal_ioprio", Number),
    e("auto_da_alloc", Number),
    e("auto_da_alloc", Flag),
    e("noauto_da_alloc", Flag),
    e("dioread_nolock", Flag),
    e("nodioread_nolock", Flag),
    e("dioread_lock", Flag),
    e("discard", Flag),
    e("nodiscard", Flag),
    e("init_itable", Number),
    e("init_itable", Flag),
    e("noinit_itable", Flag),
    e("fc_debug_force", Flag),
    e("fc_debug_max_replay", Number),
    e("max_dir_size_kb", Number),
    e("test_dummy_encryption", Flag),
    e("test_dummy_encryption", OneOf(&["v1", "v2"])),
    e("inlinecrypt", Flag),
    e("nombcache", Flag),
    e("no_mbcache", Flag),
    e("prefetch_block_bitmaps", Flag),
    e("no_prefetch_block_bitmaps", Flag),
    e("mb_optimize_scan", OneOf(&["0", "1"])),
    e("check", Word),
    e("nocheck", Flag),
    e("reservation", Flag),
    e("noreservation", Flag),
    e("journal", Number),
];

/// fs/xfs/xfs_super.c `xfs_fs_parameters` (Linux 6.17), without `logdev`
/// and `rtdev`. `norecovery` the kernel takes only on a read-only mount.
pub const XFS: &[Entry] = &[
    e("logbufs", Number),
    e("logbsize", Size),
    e("wsync", Flag),
    e("noalign", Flag),
    e("swalloc", Flag),
    e("sunit", Number),
    e("swidth", Number),
    e("nouuid", Flag),
    e("grpid", Flag),
    e("nogrpid", Flag),
    e("bsdgroups", Flag),
    e("sysvgroups", Flag),
    e("allocsize", Size),
    e("norecovery", Flag),
    e("inode64", Flag),
    e("inode32", Flag),
    e("ikeep", Flag),
    e("noikeep", Flag),
    e("largeio", Flag),
    e("nolargeio", Flag),
    e("attr2", Flag),
    e("noattr2", Flag),
    e("filestreams", Flag),
    e("quota", Flag),
    e("noquota", Flag),
    e("usrquota", Flag),
    e("grpquota", Flag),
    e("prjquota", Flag),
    e("uquota", Flag),
    e("gquota", Flag),
    e("pquota", Flag),
    e("uqnoenforce", Flag),
    e("gqnoenforce", Flag),
    e("pqnoenforce", Flag),
    e("qnoenforce", Flag),
    e("discard", Flag),
    e("nodiscard", Flag),
    e("dax", Flag),
    e("dax", OneOf(DAX)),
    e("max_open_zones", Number),
    e("lifetime", Flag),
    e("nolifetime", Flag),
    e("max_atomic_write", Size),
];

fn number(v: &str) -> bool {
    !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit())
}

impl Value {
    /// Whether `v` (`None`: no `=`) is a value of this kind.
    fn takes(self, v: Option<&str>) -> bool {
        match (self, v) {
            (Flag, None) => true,
            (Number, Some(v)) => number(v),
            (Size, Some(v)) => number(v.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G'])),
            (OneOf(set), Some(v)) => set.contains(&v),
            // A plain file name: the kernel refuses `/`, and the data
            // string it is joined into is split at every comma.
            (RootFile, Some(v)) => {
                v.len() <= 255
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            }
            (Word, Some(v)) => v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric()),
            _ => false,
        }
    }
}

/// The option table of a filesystem hostd makes or mounts: ext2 and ext3
/// are mounted by the kernel's ext4 driver, with its options.
pub fn table(fs: &str) -> Option<&'static [Entry]> {
    match fs {
        "ext2" | "ext3" | "ext4" => Some(EXT4),
        "xfs" => Some(XFS),
        _ => None,
    }
}

fn in_table(table: &[Entry], o: &str) -> bool {
    let (name, value) = match o.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (o, None),
    };
    table.iter().any(|e| e.name == name && e.value.takes(value))
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
    // A bind mount (no filesystem) checks the options against both tables.
    let tables: Vec<&[Entry]> = match fs {
        Some(f) => table(f).into_iter().collect(),
        None => vec![EXT4, XFS],
    };
    for o in proxmox_csi_common::mount_options::split(flags) {
        if o.contains(['\n', '\0']) {
            return Err(HostdError::invalid(
                field,
                format!("{o:?} holds a control character"),
            ));
        }
        if let Some(why) = refused(&o) {
            return Err(HostdError::invalid(
                field,
                format!("mount option {o:?} is refused: {why}"),
            ));
        }
        // mount(8)'s own options never reach the kernel, whatever they hold.
        if userspace_only(&o) {
            continue;
        }
        // The kernel splits the data string at every comma, quotes or not
        // (fs_context.c vfs_parse_comma_sep): only an SELinux context, whose
        // own parser reads quotes, may hold one, and only quoted whole.
        if selinux(&o) {
            let value = o.split_once('=').map(|(_, v)| v).unwrap_or_default();
            if !selinux_value(value) {
                return Err(HostdError::invalid(
                    field,
                    format!(
                        "mount option {o:?} is refused: an SELinux context is user:role:type:level \
                         of letters, digits and _.:- (a comma only inside one pair of double quotes)"
                    ),
                ));
            }
            data.push(o);
            continue;
        }
        if o.contains(['"', ' ', '\t']) {
            return Err(HostdError::invalid(
                field,
                format!(
                    "mount option {o:?} is refused: only an SELinux context's value may be quoted"
                ),
            ));
        }
        if let Some(f) = generic(&o) {
            out.flags |= f;
        } else if tables.iter().any(|t| in_table(t, &o)) {
            data.push(o);
        } else {
            return Err(HostdError::invalid(
                field,
                format!(
                    "mount option {o:?} is not one the kernel's {} driver takes (or not with that value)",
                    fs.unwrap_or("ext4 or xfs")
                ),
            ));
        }
    }
    // ext4 keeps an error behaviour in its superblock (tune2fs -e), which
    // may be `panic` on a disk written elsewhere: a volume's errors never
    // panic the node, so the mount says what happens unless the class did.
    if fs.is_some_and(|f| matches!(f, "ext2" | "ext3" | "ext4"))
        && !data.iter().any(|o| o.starts_with("errors="))
    {
        data.push("errors=remount-ro".into());
    }
    if fs.is_some() {
        out.data = data.join(",");
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
