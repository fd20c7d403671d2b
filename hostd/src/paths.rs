//! The paths a request may name: kubelet's exact CSI layouts, and nothing
//! else.
//!
//! kubelet builds every path hostd is given (pkg/volume/csi:
//! `csi_attacher.go` `makeDeviceMountPath`, `csi_mounter.go` `GetPath`,
//! `csi_block.go` `GetStagingPath`/`getPublishPath`, `csi_plugin.go`
//! `GetVolumePath` for block stats). Each layout has a fixed depth, and every
//! directory above the last component is kubelet's own, which no pod can
//! write. A path is never resolved to a string and used again later: the
//! parent directory is opened once, beneath kubelet's root and with no
//! symlink anywhere (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`),
//! and every later step acts through that descriptor (`mkdirat`, `openat`,
//! `unlinkat`, mounts through `/proc/self/fd/N`).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::error::HostdError;

/// Which of kubelet's layouts a path has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/globalmount`
    FsStaging,
    /// `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>`
    BlockStaging,
    /// `pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount`
    FsTarget,
    /// `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>`
    BlockTarget,
    /// `plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>`: where
    /// kubelet maps a published block device, the path its Stats names.
    BlockMap,
}

impl Layout {
    pub const STAGING: &[Layout] = &[Layout::FsStaging, Layout::BlockStaging];
    pub const TARGET: &[Layout] = &[Layout::FsTarget, Layout::BlockTarget];
    /// What NodeGetVolumeStats and NodeExpandVolume name.
    pub const VOLUME: &[Layout] = &[
        Layout::FsTarget,
        Layout::FsStaging,
        Layout::BlockTarget,
        Layout::BlockMap,
        Layout::BlockStaging,
    ];

    pub fn is_block(self) -> bool {
        matches!(
            self,
            Self::BlockStaging | Self::BlockTarget | Self::BlockMap
        )
    }

    fn shape(self) -> &'static str {
        match self {
            Self::FsStaging => {
                "plugins/kubernetes.io/csi/<driver>/<sha256 of the volume id>/globalmount"
            }
            Self::BlockStaging => "plugins/kubernetes.io/csi/volumeDevices/staging/<pv>",
            Self::FsTarget => "pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount",
            Self::BlockTarget => "plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>",
            Self::BlockMap => "plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>",
        }
    }
}

/// The file kubelet keeps a volume's record in; never a path hostd acts on.
/// Here, beside the layouts that place it, so `paths` needs no `bindings`.
pub const VOL_DATA: &str = "vol_data.json";

/// kubelet's root (normally `/var/lib/kubelet`), opened once, and the name
/// of this driver's directory under `plugins/kubernetes.io/csi`.
#[derive(Debug, Clone)]
pub struct KubeletPaths {
    root: PathBuf,
    root_fd: Arc<OwnedFd>,
    driver: String,
}

/// A checked path: its layout, and its parent directory held open.
#[derive(Debug)]
pub struct Place {
    pub path: PathBuf,
    pub layout: Layout,
    parent: OwnedFd,
    leaf: OsString,
}

/// What is at a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Missing,
    Dir,
    File,
    /// A device node, a socket, a symlink: nothing hostd makes.
    Other,
}

const PATH_ONLY: OFlag = OFlag::O_PATH.union(OFlag::O_CLOEXEC);

fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// A name kubelet puts in a path: a PV name (DNS subdomain), an escaped
/// inline volume name (`/` → `~`), a pod UID, kubelet's `mount`.
fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

fn sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl KubeletPaths {
    pub fn new(root: &Path, driver: &str) -> std::io::Result<Self> {
        let root = root.canonicalize()?;
        let root_fd = nix::fcntl::open(&root, PATH_ONLY | OFlag::O_DIRECTORY, Mode::empty())?;
        Ok(Self {
            root,
            root_fd: Arc::new(root_fd),
            driver: driver.to_string(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The CSI driver whose staging directories these are.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// This driver's staging directory, `plugins/kubernetes.io/csi/<driver>`.
    pub fn driver_dir(&self) -> PathBuf {
        self.root
            .join("plugins/kubernetes.io/csi")
            .join(&self.driver)
    }

    /// The layout of a path relative to kubelet's root, if it has one.
    fn layout_of(&self, parts: &[&str]) -> Option<Layout> {
        match parts {
            [
                "plugins",
                "kubernetes.io",
                "csi",
                "volumeDevices",
                "staging",
                pv,
            ] if plain_name(pv) => Some(Layout::BlockStaging),
            [
                "plugins",
                "kubernetes.io",
                "csi",
                "volumeDevices",
                "publish",
                pv,
                pod,
            ] if plain_name(pv) && plain_name(pod) => Some(Layout::BlockTarget),
            [
                "plugins",
                "kubernetes.io",
                "csi",
                "volumeDevices",
                pv,
                "dev",
                pod,
            ] if plain_name(pv) && plain_name(pod) && !matches!(*pv, "staging" | "publish") => {
                Some(Layout::BlockMap)
            }
            [
                "plugins",
                "kubernetes.io",
                "csi",
                driver,
                hash,
                "globalmount",
            ] if *driver == self.driver && sha256_hex(hash) => Some(Layout::FsStaging),
            // kubelet names the last directory `mount`; kubernetes-csi/csi-test's
            // sanity suite names it `target` and `other_target`. The name
            // carries no privilege: the directory above it is kubelet's. It is
            // never kubelet's own record of the volume beside it.
            ["pods", uid, "volumes", "kubernetes.io~csi", pv, leaf]
                if plain_name(uid) && plain_name(pv) && plain_name(leaf) && *leaf != VOL_DATA =>
            {
                Some(Layout::FsTarget)
            }
            _ => None,
        }
    }

    /// Checks that `raw` has one of the `allowed` layouts and opens its
    /// parent directory beneath kubelet's root, refusing any symlink on the
    /// way. The last component may not exist yet; if it does, it must not be
    /// a symlink.
    pub fn place(
        &self,
        field: &'static str,
        raw: &str,
        allowed: &[Layout],
    ) -> Result<Place, HostdError> {
        if raw.is_empty() {
            return Err(HostdError::invalid(field, "is empty"));
        }
        let path = Path::new(raw);
        if !path.is_absolute() {
            return Err(HostdError::invalid(
                field,
                format!("{raw:?} is not an absolute path"),
            ));
        }
        if path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        {
            return Err(HostdError::invalid(
                field,
                format!("{raw:?} contains '..' or '.'"),
            ));
        }
        let outside = || HostdError::PathOutsideKubelet {
            field,
            path: path.to_path_buf(),
            root: self.root.clone(),
            expected: allowed
                .iter()
                .map(|l| l.shape())
                .collect::<Vec<_>>()
                .join(" or "),
        };
        let rel = path.strip_prefix(&self.root).map_err(|_| outside())?;
        let parts: Vec<&str> = rel
            .iter()
            .map(|c| c.to_str())
            .collect::<Option<_>>()
            .ok_or_else(|| HostdError::invalid(field, format!("{raw:?} is not UTF-8")))?;
        let layout = self
            .layout_of(&parts)
            .filter(|l| allowed.contains(l))
            .ok_or_else(outside)?;
        let (leaf, dirs) = parts.split_last().ok_or_else(outside)?;
        let parent = openat2(
            self.root_fd.as_fd(),
            dirs.join("/").as_str(),
            OpenHow::new()
                .flags(PATH_ONLY | OFlag::O_DIRECTORY)
                .resolve(beneath()),
        )
        .map_err(|e| match e {
            Errno::ENOENT => HostdError::ParentMissing {
                field,
                path: path.to_path_buf(),
            },
            Errno::ELOOP | Errno::EXDEV => {
                HostdError::invalid(field, format!("a directory above {raw:?} is a symlink"))
            }
            source => HostdError::ParentUnusable {
                field,
                path: raw.to_owned(),
                source,
            },
        })?;
        let place = Place {
            path: self.root.join(rel),
            layout,
            parent,
            leaf: OsString::from(leaf),
        };
        if place
            .lstat()
            .is_some_and(|s| SFlag::from_bits_truncate(s.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
        {
            return Err(HostdError::invalid(field, format!("{raw:?} is a symlink")));
        }
        Ok(place)
    }

    /// The layout `raw` would have, without opening anything.
    pub fn classify(&self, raw: &Path) -> Option<Layout> {
        let rel = raw.strip_prefix(&self.root).ok()?;
        let parts: Option<Vec<&str>> = rel.iter().map(|c| c.to_str()).collect();
        self.layout_of(&parts?)
    }
}

impl Place {
    fn lstat(&self) -> Option<FileStat> {
        fstatat(
            self.parent.as_fd(),
            self.leaf.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok()
    }

    pub fn kind(&self) -> Kind {
        match self
            .lstat()
            .map(|s| SFlag::from_bits_truncate(s.st_mode) & SFlag::S_IFMT)
        {
            None => Kind::Missing,
            Some(SFlag::S_IFDIR) => Kind::Dir,
            Some(SFlag::S_IFREG) => Kind::File,
            Some(_) => Kind::Other,
        }
    }

    /// The directory or file a staging place holds: for block staging, the
    /// file the device node is bound onto.
    pub fn child(&self, name: &str) -> Result<Place, HostdError> {
        let dir = openat2(
            self.parent.as_fd(),
            self.leaf.as_os_str(),
            OpenHow::new()
                .flags(PATH_ONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW)
                .resolve(beneath()),
        )
        .map_err(|e| HostdError::sys("opening", self.path.display(), e))?;
        Ok(Place {
            path: self.path.join(name),
            layout: self.layout,
            parent: dir,
            leaf: OsString::from(name),
        })
    }

    /// Makes the directory (mode 0750, as kubelet makes its own) unless it is one.
    pub fn ensure_dir(&self) -> Result<(), HostdError> {
        match mkdirat(
            self.parent.as_fd(),
            self.leaf.as_os_str(),
            Mode::from_bits_truncate(0o750),
        ) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST) if self.kind() == Kind::Dir => Ok(()),
            Err(e) => Err(HostdError::sys(
                "creating directory",
                self.path.display(),
                e,
            )),
        }
    }

    /// Makes an empty regular file unless one is there; never follows a symlink.
    pub fn ensure_file(&self) -> Result<(), HostdError> {
        if self.kind() == Kind::File {
            return Ok(());
        }
        nix::fcntl::openat(
            self.parent.as_fd(),
            self.leaf.as_os_str(),
            OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o640),
        )
        .map(drop)
        .map_err(|e| HostdError::sys("creating file", self.path.display(), e))
    }

    /// Opens what is at the place (the mount on top, if one is), without
    /// following a symlink; its `/proc/self/fd` path names exactly it.
    pub fn open(&self) -> Result<Opened, HostdError> {
        openat2(
            self.parent.as_fd(),
            self.leaf.as_os_str(),
            OpenHow::new()
                .flags(PATH_ONLY | OFlag::O_NOFOLLOW)
                .resolve(beneath()),
        )
        .map(Opened)
        .map_err(|e| HostdError::sys("opening", self.path.display(), e))
    }

    /// The place as a path through its parent's descriptor
    /// (`/proc/self/fd/<parent>/<leaf>`): for umount(2), which an open
    /// descriptor of the mount itself would keep busy. Use it with
    /// `UMOUNT_NOFOLLOW`.
    pub fn via_parent(&self) -> PathBuf {
        Path::new(&format!("/proc/self/fd/{}", self.parent.as_raw_fd())).join(&self.leaf)
    }

    /// Removes the empty directory or the file hostd made there, when it is
    /// of the kind `made`; a missing one is fine, any other is left alone
    /// and named.
    pub fn remove_only(&self, made: Kind) -> Result<(), HostdError> {
        let how = match self.kind() {
            Kind::Missing => return Ok(()),
            Kind::Dir if made == Kind::Dir => UnlinkatFlags::RemoveDir,
            Kind::File if made == Kind::File => UnlinkatFlags::NoRemoveDir,
            found => {
                return Err(HostdError::failed(
                    "removing",
                    self.path.display(),
                    format!("it is a {found:?}, where hostd makes a {made:?}; left as it is"),
                ));
            }
        };
        match unlinkat(self.parent.as_fd(), self.leaf.as_os_str(), how) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(HostdError::sys("removing", self.path.display(), e)),
        }
    }

    /// The name kubelet gave the directory above (the PV name for targets).
    pub fn leaf(&self) -> &[u8] {
        self.leaf.as_bytes()
    }
}

/// An `O_PATH` descriptor of what a place holds.
#[derive(Debug)]
pub struct Opened(OwnedFd);

impl AsFd for Opened {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Opened {
    /// A path the kernel resolves to exactly this file, whatever happens to
    /// the names above it meanwhile.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }
}

#[cfg(test)]
mod tests;
