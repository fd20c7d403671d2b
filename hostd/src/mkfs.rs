//! Making a filesystem, with the Go driver's defaults: ext2, ext3 and ext4
//! without reserved blocks (`-m0`, k8s.io/mount-utils formatAndMountSensitive,
//! which the Go driver formats with); xfs as mkfs.xfs makes it (mounted later
//! with `nouuid`). ext2 and ext3 are made by the same mke2fs as ext4, told
//! the type (`-t`), so no other tool needs to be on the node.
//!
//! Neither tool is forced (no `mkfs.ext4 -F`, no `mkfs.xfs -f` but over an
//! unfinished xfs). mkfs.xfs keeps its own refusal of a device that holds a
//! signature as a second safety net behind hostd's; mke2fs looks for an
//! existing filesystem only when stdin and stdout are terminals
//! (e2fsprogs misc/mke2fs.c `PRS`, `CHECK_FS_EXIST`), so for ext2/3/4
//! hostd's checks are the only ones (the disk's identity among them, read
//! again right before mkfs runs).
//! Neither discards: on thin storage a discard would free whatever a
//! mistaken format met.

use std::path::Path;
use std::process::Command;

use crate::error::HostdError;

/// Filesystems hostd formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    Ext2,
    Ext3,
    Ext4,
    Xfs,
}

impl FsType {
    pub fn parse(s: &str) -> Result<Self, HostdError> {
        match s {
            "" | "ext4" => Ok(Self::Ext4),
            "ext3" => Ok(Self::Ext3),
            "ext2" => Ok(Self::Ext2),
            "xfs" => Ok(Self::Xfs),
            other => Err(HostdError::invalid(
                "filesystem.fs_type",
                format!(
                    "{other:?} is not supported; allowed: {}",
                    proxmox_csi_common::contract::fs_types_allowed()
                ),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Ext2 => "ext2",
            Self::Ext3 => "ext3",
            Self::Ext4 => "ext4",
            Self::Xfs => "xfs",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct MkfsOptions {
    pub block_size: u32,
    pub inode_size: u32,
    /// Overwrite an unfinished xfs (see `probe::Contents::Unfinished`).
    /// Otherwise mkfs.xfs keeps its own refusal of existing signatures as a
    /// second safety net behind ours.
    pub replace_unfinished: bool,
    /// The filesystem's size in bytes (a claimed volume's leaves the last
    /// MiB to its claim, `claim::fs_size`); 0 is the whole device.
    pub size_bytes: u64,
}

pub fn command(fs: FsType, device: &Path, opts: MkfsOptions) -> Command {
    let mut c;
    match fs {
        FsType::Ext2 | FsType::Ext3 | FsType::Ext4 => {
            c = Command::new("mkfs.ext4");
            // stdin is /dev/null: mke2fs asks nothing (see the module's note).
            c.args(["-q", "-t", fs.name(), "-m0", "-E", "nodiscard"]);
            if opts.block_size > 0 {
                c.arg("-b").arg(opts.block_size.to_string());
            }
            if opts.inode_size > 0 {
                c.arg("-I").arg(opts.inode_size.to_string());
            }
            c.arg(device);
            // mke2fs's fs-size operand follows the device.
            if opts.size_bytes > 0 {
                c.arg(format!("{}k", opts.size_bytes / 1024));
            }
        }
        FsType::Xfs => {
            c = Command::new("mkfs.xfs");
            c.args(["-q", "-K"]);
            if opts.replace_unfinished {
                c.arg("-f");
            }
            if opts.block_size > 0 {
                c.arg("-b").arg(format!("size={}", opts.block_size));
            }
            if opts.inode_size > 0 {
                c.arg("-i").arg(format!("size={}", opts.inode_size));
            }
            if opts.size_bytes > 0 {
                c.arg("-d").arg(format!("size={}", opts.size_bytes));
            }
            c.arg(device);
        }
    }
    c
}

pub fn validate(opts: MkfsOptions) -> Result<(), HostdError> {
    let pow2 = |v: u32| v == 0 || v.is_power_of_two();
    if !pow2(opts.block_size)
        || opts.block_size > 65536
        || (opts.block_size != 0 && opts.block_size < 512)
    {
        return Err(HostdError::invalid(
            "filesystem.block_size",
            format!(
                "{} is not a power of two between 512 and 65536",
                opts.block_size
            ),
        ));
    }
    if !pow2(opts.inode_size)
        || opts.inode_size > 4096
        || (opts.inode_size != 0 && opts.inode_size < 128)
    {
        return Err(HostdError::invalid(
            "filesystem.inode_size",
            format!(
                "{} is not a power of two between 128 and 4096",
                opts.inode_size
            ),
        ));
    }
    Ok(())
}

pub fn run(fs: FsType, device: &Path, opts: MkfsOptions) -> Result<(), HostdError> {
    let out = crate::tool::run(command(fs, device, opts), &format!("mkfs.{}", fs.name()))?;
    if !out.status.success() {
        return Err(HostdError::failed(
            "formatting",
            format!("{} as {}", device.display(), fs.name()),
            format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn builds_the_go_drivers_mkfs_lines() {
        let d = Path::new("/dev/sdb");
        assert_eq!(
            args(&command(FsType::Ext4, d, MkfsOptions::default())),
            [
                "mkfs.ext4",
                "-q",
                "-t",
                "ext4",
                "-m0",
                "-E",
                "nodiscard",
                "/dev/sdb"
            ]
        );
        assert_eq!(
            args(&command(FsType::Ext3, d, MkfsOptions::default())),
            [
                "mkfs.ext4",
                "-q",
                "-t",
                "ext3",
                "-m0",
                "-E",
                "nodiscard",
                "/dev/sdb"
            ]
        );
        assert_eq!(
            args(&command(
                FsType::Ext4,
                d,
                MkfsOptions {
                    block_size: 4096,
                    inode_size: 256,
                    ..Default::default()
                }
            )),
            [
                "mkfs.ext4",
                "-q",
                "-t",
                "ext4",
                "-m0",
                "-E",
                "nodiscard",
                "-b",
                "4096",
                "-I",
                "256",
                "/dev/sdb"
            ]
        );
        assert_eq!(
            args(&command(
                FsType::Xfs,
                d,
                MkfsOptions {
                    block_size: 4096,
                    inode_size: 512,
                    ..Default::default()
                }
            )),
            [
                "mkfs.xfs",
                "-q",
                "-K",
                "-b",
                "size=4096",
                "-i",
                "size=512",
                "/dev/sdb"
            ]
        );
    }

    #[test]
    fn a_claimed_volumes_filesystem_is_made_short_of_the_device() {
        let d = Path::new("/dev/sdb");
        let short = MkfsOptions {
            size_bytes: 1023 << 20,
            ..Default::default()
        };
        let ext4 = args(&command(FsType::Ext4, d, short));
        assert_eq!(ext4[ext4.len() - 2..], ["/dev/sdb", "1047552k"]);
        let xfs = args(&command(FsType::Xfs, d, short));
        assert_eq!(xfs[xfs.len() - 3..], ["-d", "size=1072693248", "/dev/sdb"]);
    }

    #[test]
    fn refuses_odd_sizes_and_unknown_filesystems() {
        assert!(
            validate(MkfsOptions {
                block_size: 3000,
                ..Default::default()
            })
            .unwrap_err()
            .to_string()
            .starts_with("filesystem.block_size: 3000")
        );
        assert!(
            validate(MkfsOptions {
                inode_size: 64,
                ..Default::default()
            })
            .is_err()
        );
        assert!(
            validate(MkfsOptions {
                block_size: 1024,
                inode_size: 256,
                ..Default::default()
            })
            .is_ok()
        );
        let e = FsType::parse("btrfs").unwrap_err().to_string();
        assert_eq!(
            e,
            "filesystem.fs_type: \"btrfs\" is not supported; allowed: ext4, xfs, ext3, ext2"
        );
    }
}
