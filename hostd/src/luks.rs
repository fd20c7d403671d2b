//! LUKS2 through libcryptsetup, in the Go driver's format (`aes-xts-plain64`,
//! 512-bit key) so its volumes keep opening.
//!
//! The volume key is never loaded into the kernel keyring: Talos' seccomp
//! profile for extension services blocks the keyring syscalls, and the key
//! then lives in the dm-crypt table as with `cryptsetup --disable-keyring`.

use std::path::{Path, PathBuf};

use libcryptsetup_rs::consts::flags::{CryptActivate, CryptDeactivate, CryptPbkdf, CryptVolumeKey};
use libcryptsetup_rs::consts::vals::{CryptKdf, EncryptionFormat};
use libcryptsetup_rs::{CryptInit, CryptPbkdfType, Either, LibcryptErr};
use proxmox_csi_common::Secret;

use crate::error::HostdError;

pub const CIPHER: (&str, &str) = ("aes", "xts-plain64");
/// What luksFormat writes at the head of the disk: LUKS2's header and key
/// slots area, 16 MiB by default (cryptsetup lib/luks2/luks2.h
/// `LUKS2_DEFAULT_HDR_SIZE`).
pub const HEADER_BYTES: u64 = 16 << 20;
pub const KEY_BYTES: usize = 512 / 8;

/// Key derivation for new key slots. Argon2id is cryptsetup's default;
/// pbkdf2 with a fixed iteration count makes tests fast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pbkdf {
    Argon2id { time_ms: u32, memory_kb: u32 },
    Pbkdf2 { iterations: u32 },
}

impl Default for Pbkdf {
    fn default() -> Self {
        Self::Argon2id {
            time_ms: 2000,
            memory_kb: 1 << 20,
        }
    }
}

impl std::fmt::Display for Pbkdf {
    /// As [`FromStr`](std::str::FromStr) reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Argon2id { time_ms, memory_kb } => write!(f, "argon2id:{time_ms}:{memory_kb}"),
            Self::Pbkdf2 { iterations } => write!(f, "pbkdf2:{iterations}"),
        }
    }
}

impl std::str::FromStr for Pbkdf {
    type Err = String;
    /// `argon2id`, `argon2id:<ms>:<KiB>`, `pbkdf2:<iterations>`.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| format!("{v:?} is not a number in {s:?}"))
        };
        match parts.as_slice() {
            ["argon2id"] => Ok(Self::default()),
            ["argon2id", t, m] => Ok(Self::Argon2id {
                time_ms: num(t)?,
                memory_kb: num(m)?,
            }),
            ["pbkdf2", i] if num(i)? >= 1000 => Ok(Self::Pbkdf2 {
                iterations: num(i)?,
            }),
            _ => Err(format!(
                "{s:?} is not a PBKDF setting: use argon2id, argon2id:<ms>:<KiB> or pbkdf2:<iterations ≥ 1000>"
            )),
        }
    }
}

/// The most a LUKS2 key slot may cost to open. A header is the disk's, so
/// anyone who could write the disk chose its costs; a slot above these is
/// refused before any key is derived, as one derivation holds
/// libcryptsetup's process-wide lock (the crate's `mutex` feature) and so
/// every other LUKS call of the node. The defaults are cryptsetup's own
/// maxima for what it makes (lib/libcryptsetup.h: 1 GiB, 4 threads;
/// argon2's time cost and pbkdf2's iterations at 4× what a 2 s benchmark
/// gives on a fast core).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfBounds {
    pub memory_kb: u32,
    pub threads: u32,
    pub argon2_iterations: u32,
    pub pbkdf2_iterations: u32,
}

impl Default for KdfBounds {
    fn default() -> Self {
        Self {
            memory_kb: 1 << 20,
            threads: 4,
            argon2_iterations: 64,
            pbkdf2_iterations: 16_000_000,
        }
    }
}

impl std::str::FromStr for KdfBounds {
    type Err = String;
    /// `<memory KiB>:<threads>:<argon2 iterations>:<pbkdf2 iterations>`.
    fn from_str(s: &str) -> Result<Self, String> {
        let n: Vec<u32> = s
            .split(':')
            .map(|v| {
                v.parse::<u32>()
                    .map_err(|_| format!("{v:?} is not a number in {s:?}"))
            })
            .collect::<Result<_, _>>()?;
        match n.as_slice() {
            [m, t, a, p] if *m > 0 && *t > 0 && *a > 0 && *p > 0 => Ok(Self {
                memory_kb: *m,
                threads: *t,
                argon2_iterations: *a,
                pbkdf2_iterations: *p,
            }),
            _ => Err(format!(
                "{s:?} is not a KDF bound: use <memory KiB>:<threads>:<argon2 iterations>:<pbkdf2 iterations>, each above 0"
            )),
        }
    }
}

/// The LUKS2 header of `device`, loaded, and how many key slots LUKS2 has.
fn load_header(device: &Path) -> Result<(libcryptsetup_rs::CryptDevice, u32), HostdError> {
    let mut cd = CryptInit::init(device).map_err(|e| err("opening", device, e))?;
    cd.context_handle()
        .load::<libcryptsetup_rs::CryptParamsLuks2Ref<'_>>(Some(EncryptionFormat::Luks2), None)
        .map_err(|e| err("reading the LUKS2 header of", device, e))?;
    let max =
        libcryptsetup_rs::CryptKeyslotHandle::max_keyslots(EncryptionFormat::Luks2).unwrap_or(32);
    Ok((cd, max))
}

/// Where the data of the LUKS2 volume on `device` starts, in bytes, from
/// its header (crypt_get_data_offset): fixed, whatever the disk's or the
/// mapping's size read at another moment.
pub fn data_offset(device: &Path) -> Result<u64, HostdError> {
    let (mut cd, _) = load_header(device)?;
    Ok(cd.status_handle().get_data_offset().saturating_mul(512))
}

/// Where libcryptsetup looks for a LUKS2 header: the primary at 0 and the
/// secondary at any of the offsets a header size allows (cryptsetup
/// lib/luks2/luks2_disk_metadata.c `hdr2_offsets`).
const HEADER_OFFSETS: [u64; 10] = [
    0, 0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000, 0x100000, 0x200000, 0x400000,
];

/// What opening a LUKS2 header may cost at most, summed over everything a
/// passphrase is tried against: a wrong one is tried on every key slot,
/// and each slot's result is checked with its digest's PBKDF2.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Costs {
    pbkdf2_iterations: u64,
    argon2_iterations: u64,
    memory_kb: u64,
    threads: u64,
}

/// The costs of one header's JSON metadata (`keyslots`, `digests`).
fn costs_of(json: &serde_json::Value) -> Costs {
    let num = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    let mut c = Costs::default();
    let kdfs = json["keyslots"]
        .as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .map(|slot| &slot["kdf"]);
    let digests = json["digests"]
        .as_object()
        .into_iter()
        .flat_map(|o| o.values());
    for kdf in kdfs.chain(digests) {
        match kdf["type"].as_str() {
            Some("pbkdf2") => c.pbkdf2_iterations += num(kdf, "iterations"),
            Some(_) => {
                c.argon2_iterations += num(kdf, "time");
                c.memory_kb = c.memory_kb.max(num(kdf, "memory"));
                c.threads = c.threads.max(num(kdf, "cpus"));
            }
            None => {}
        }
    }
    c
}

/// The JSON metadata of the LUKS2 header at `offset`, if one is there:
/// a 4 KiB binary header (magic, version 2, `hdr_size` at byte 8, big
/// endian) and the JSON area after it (cryptsetup lib/luks2/luks2.h
/// `struct luks2_hdr_disk`).
fn header_json(f: &std::fs::File, offset: u64) -> Option<serde_json::Value> {
    use std::os::unix::fs::FileExt;
    let mut bin = [0u8; 4096];
    f.read_exact_at(&mut bin, offset).ok()?;
    let magic = &bin[..6];
    if (magic != b"LUKS\xba\xbe" && magic != b"SKUL\xba\xbe") || bin[6..8] != [0, 2] {
        return None;
    }
    let size = u64::from_be_bytes(bin[8..16].try_into().ok()?);
    // A header area is 16 KiB to 4 MiB (luks2.h LUKS2_HDR_*_LEN).
    if !(0x4000..=0x400000).contains(&size) {
        return None;
    }
    let mut area = vec![0u8; usize::try_from(size - 4096).ok()?];
    f.read_exact_at(&mut area, offset + 4096).ok()?;
    let end = area.iter().position(|b| *b == 0).unwrap_or(area.len());
    serde_json::from_slice(&area[..end]).ok()
}

/// Refuses a LUKS2 header whose opening costs more than `bounds`, read from
/// the metadata itself before anything is derived: every key slot's KDF
/// and every digest's PBKDF2, summed, in every copy of the header
/// libcryptsetup might use (the disk's writer chose them all).
pub fn check_header_costs(device: &Path, bounds: KdfBounds) -> Result<(), HostdError> {
    let f = std::fs::File::open(device)
        .map_err(|e| HostdError::io("reading the LUKS2 header of", device.display(), e))?;
    let headers: Vec<serde_json::Value> = HEADER_OFFSETS
        .iter()
        .filter_map(|o| header_json(&f, *o))
        .collect();
    if headers.is_empty() {
        return Err(HostdError::failed(
            "reading the LUKS2 header of",
            device.display(),
            "no LUKS2 header metadata found",
        ));
    }
    for c in headers.iter().map(costs_of) {
        let over = if c.pbkdf2_iterations > u64::from(bounds.pbkdf2_iterations) {
            Some(format!(
                "pbkdf2 with {} iterations in all (at most {})",
                c.pbkdf2_iterations, bounds.pbkdf2_iterations
            ))
        } else if c.memory_kb > u64::from(bounds.memory_kb) {
            Some(format!(
                "argon2 with {} KiB of memory (at most {})",
                c.memory_kb, bounds.memory_kb
            ))
        } else if c.threads > u64::from(bounds.threads) {
            Some(format!(
                "argon2 with {} threads (at most {})",
                c.threads, bounds.threads
            ))
        } else if c.argon2_iterations > u64::from(bounds.argon2_iterations) {
            Some(format!(
                "argon2 with a time cost of {} in all (at most {})",
                c.argon2_iterations, bounds.argon2_iterations
            ))
        } else {
            None
        };
        if let Some(over) = over {
            return Err(HostdError::DeviceRefused {
                device: device.to_path_buf(),
                reason: format!(
                    "its LUKS key slots and digests cost {over} to try a passphrase against; raise hostd's --luks-kdf-bounds to open it"
                ),
            });
        }
    }
    Ok(())
}

/// The device-mapper name of a volume's mapping: stable, short, and made
/// only of characters device-mapper allows, whatever the volume id holds.
pub fn mapping_name(volume_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(volume_id.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("pvecsi-{hex}")
}

/// The names the Go driver gives a disk's mapping: the base name of the
/// path it opened, with `-encrypted` (siderolabs/go-blockdevice v0.4.8
/// blockdevice/encryption/luks/luks.go Open, util.go PartPathEncrypted).
/// That path is `/dev/<kernel name>` when the Go node plugin found the disk
/// in sysfs, else its `/dev/disk/by-id/wwn-0x<wwn>` link
/// (proxmox-csi-plugin pkg/csi/helper.go getDevicePath): `sdb-encrypted`
/// or `wwn-0x5056432d49443031-encrypted`.
pub fn go_mapping_names(disk: &str) -> Vec<String> {
    let mut names = vec![format!("{disk}-encrypted")];
    if let Some(wwn) = crate::device::wwn_of(disk) {
        names.push(format!("wwn-0x{wwn}-encrypted"));
    }
    names
}

/// The Go driver's mapping of `disk`, if one is active and sits on that
/// disk alone: its name and kernel name (`dm-N`).
pub fn go_mapping_on(disk: &str) -> Option<(String, String)> {
    go_mapping_names(disk).into_iter().find_map(|name| {
        let dm = crate::blockdev::active(&name)?;
        (crate::blockdev::slaves(&dm) == [disk.to_string()]).then_some((name, dm))
    })
}

/// The LUKS facts and the one action a decision takes: libcryptsetup on a
/// host ([`crate::host::System`]), a table that records closes in unit tests.
pub trait Crypt {
    /// See [`is_open`].
    fn is_open(&self, name: &str) -> bool;
    /// See [`has_keyslot`].
    fn has_keyslot(&self, device: &Path) -> Result<bool, HostdError>;
    /// See [`go_mapping_on`].
    fn go_mapping_on(&self, disk: &str) -> Option<(String, String)>;
    /// See [`close`].
    fn close(&self, name: &str, force: bool) -> Result<(), HostdError>;
}

pub fn mapper_path(name: &str) -> PathBuf {
    Path::new("/dev/mapper").join(name)
}

/// The CPU priority (nice) key derivation runs at. Argon2id takes every CPU
/// for about two seconds per key slot; at a lower priority it still gets
/// all of them when nothing else wants them, while hostd's Health, the node
/// plugin and the node's pods are served first.
const KDF_NICE: i32 = 10;

/// Argon2 threads for a new key slot: half the node's CPUs (cryptsetup's
/// default is all of them, up to 4), so that a key derivation leaves the
/// other half to the node's pods and hostd's own answers. The time cost is
/// calibrated to the same 2 s either way.
fn kdf_threads() -> u32 {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    u32::try_from((cpus / 2).clamp(1, 4)).unwrap_or(1)
}

/// Lowers the calling thread's priority until dropped; the threads Argon2
/// starts meanwhile inherit it (nice is per thread on Linux).
struct Lowered {
    tid: nix::libc::id_t,
    before: i32,
}

impl Lowered {
    fn new() -> Self {
        let tid = nix::unistd::gettid().as_raw() as nix::libc::id_t;
        // SAFETY: plain system calls on this thread's own priority.
        let before = unsafe { nix::libc::getpriority(nix::libc::PRIO_PROCESS, tid) };
        unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid, KDF_NICE.max(before)) };
        Self { tid, before }
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        // SAFETY: as above. Raising it back needs CAP_SYS_NICE, which hostd has.
        unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, self.tid, self.before) };
    }
}

fn err(action: &'static str, target: &Path, e: LibcryptErr) -> HostdError {
    HostdError::crypt(action, target.display(), e)
}

/// Writes a LUKS2 header with one key slot for `passphrase`. The caller has
/// checked that the device holds no signature.
pub fn format(device: &Path, passphrase: &Secret<Vec<u8>>, pbkdf: Pbkdf) -> Result<(), HostdError> {
    let mut cd = CryptInit::init(device).map_err(|e| err("opening for luksFormat", device, e))?;
    let kdf = match pbkdf {
        Pbkdf::Argon2id { time_ms, memory_kb } => CryptPbkdfType {
            type_: CryptKdf::Argon2Id,
            hash: Some("sha256".into()),
            time_ms,
            iterations: 0,
            max_memory_kb: memory_kb,
            parallel_threads: kdf_threads(),
            flags: CryptPbkdf::empty(),
        },
        Pbkdf::Pbkdf2 { iterations } => CryptPbkdfType {
            type_: CryptKdf::Pbkdf2,
            hash: Some("sha256".into()),
            time_ms: 0,
            iterations,
            max_memory_kb: 0,
            parallel_threads: 0,
            flags: CryptPbkdf::NO_BENCHMARK,
        },
    };
    cd.settings_handle()
        .set_pbkdf_type(&kdf)
        .map_err(|e| err("setting the PBKDF for", device, e))?;
    cd.context_handle()
        .format::<libcryptsetup_rs::CryptParamsLuks2Ref<'_>>(
            EncryptionFormat::Luks2,
            CIPHER,
            None,
            Either::Right(KEY_BYTES),
            None,
        )
        .map_err(|e| err("luksFormat", device, e))?;
    let _lowered = Lowered::new();
    cd.keyslot_handle()
        .add_by_key(None, None, passphrase.expose(), CryptVolumeKey::empty())
        .map_err(|e| err("adding a key slot to", device, e))?;
    Ok(())
}

/// Opens `device` as `/dev/mapper/<name>`. A wrong passphrase is a
/// FailedPrecondition naming the volume, not an internal error.
pub fn open(
    device: &Path,
    name: &str,
    passphrase: &Secret<Vec<u8>>,
) -> Result<PathBuf, HostdError> {
    let mut cd = CryptInit::init(device).map_err(|e| err("opening", device, e))?;
    cd.context_handle()
        .load::<libcryptsetup_rs::CryptParamsLuks2Ref<'_>>(Some(EncryptionFormat::Luks2), None)
        .map_err(|e| err("reading the LUKS2 header of", device, e))?;
    cd.context_handle()
        .volume_key_keyring(false)
        .map_err(|e| err("disabling the kernel keyring for", device, e))?;
    let lowered = Lowered::new();
    let activated = cd.activate_handle().activate_by_passphrase(
        Some(name),
        None,
        passphrase.expose(),
        CryptActivate::empty(),
    );
    drop(lowered);
    match activated {
        Ok(_) => Ok(mapper_path(name)),
        Err(LibcryptErr::IOError(e)) if e.raw_os_error() == Some(libc_eperm()) => {
            Err(HostdError::DeviceRefused {
                device: device.to_path_buf(),
                reason: "the encryption passphrase does not open its LUKS volume".into(),
            })
        }
        Err(e) => Err(err("activating dm-crypt for", device, e)),
    }
}

fn libc_eperm() -> i32 {
    nix::errno::Errno::EPERM as i32
}

/// Whether the LUKS2 header on `device` has a key slot. A header without
/// one comes from a luksFormat that was interrupted before its key slot was
/// written: its volume key is lost, so it protects nothing and can be made
/// again.
pub fn has_keyslot(device: &Path) -> Result<bool, HostdError> {
    use libcryptsetup_rs::consts::vals::KeyslotInfo;
    let (mut cd, max) = load_header(device)?;
    for slot in 0..max {
        if matches!(
            cd.keyslot_handle().status(slot),
            Ok(KeyslotInfo::Active | KeyslotInfo::ActiveLast | KeyslotInfo::Unbound)
        ) {
            return Ok(true);
        }
    }
    Ok(false)
}

pub fn is_open(name: &str) -> bool {
    mapper_path(name).exists()
}

/// Closes the mapping; with `force`, also one whose device has vanished
/// (surprise unplug), which would otherwise stay behind.
pub fn close(name: &str, force: bool) -> Result<(), HostdError> {
    let path = mapper_path(name);
    let mut cd = CryptInit::init_by_name_and_header(name, None)
        .map_err(|e| err("looking up mapping", &path, e))?;
    let flags = if force {
        CryptDeactivate::FORCE
    } else {
        CryptDeactivate::empty()
    };
    cd.activate_handle()
        .deactivate(name, flags)
        .map_err(|e| err("closing mapping", &path, e))
}

/// Grows the mapping to the size of its device.
pub fn resize(name: &str, passphrase: Option<&Secret<Vec<u8>>>) -> Result<(), HostdError> {
    let path = mapper_path(name);
    let mut cd = CryptInit::init_by_name_and_header(name, None)
        .map_err(|e| err("looking up mapping", &path, e))?;
    cd.context_handle()
        .volume_key_keyring(false)
        .map_err(|e| err("disabling the kernel keyring for", &path, e))?;
    if let Err(first) = cd.context_handle().resize(name, 0) {
        // Without the key in the keyring, unlock a key slot to give
        // libcryptsetup the volume key, then try again.
        let Some(pass) = passphrase else {
            return Err(err("resizing", &path, first));
        };
        let lowered = Lowered::new();
        let unlocked = cd.activate_handle().activate_by_passphrase(
            None,
            None,
            pass.expose(),
            CryptActivate::empty(),
        );
        drop(lowered);
        unlocked.map_err(|e| err("unlocking for resize", &path, e))?;
        cd.context_handle()
            .resize(name, 0)
            .map_err(|e| err("resizing", &path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_names_are_stable_short_and_safe() {
        let a = mapping_name("region-1/pve2/local-lvm/vm-9999-pvc-0c6e8a");
        assert_eq!(
            a,
            mapping_name("region-1/pve2/local-lvm/vm-9999-pvc-0c6e8a")
        );
        assert_ne!(
            a,
            mapping_name("region-1/pve2/local-lvm/vm-9999-pvc-0c6e8b")
        );
        assert_eq!(a.len(), "pvecsi-".len() + 32);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    #[test]
    fn key_derivation_runs_at_a_lower_priority_and_gives_it_back() {
        let prio = || unsafe {
            nix::libc::getpriority(
                nix::libc::PRIO_PROCESS,
                nix::unistd::gettid().as_raw() as nix::libc::id_t,
            )
        };
        std::thread::spawn(move || {
            let before = prio();
            {
                let _l = Lowered::new();
                assert_eq!(prio(), KDF_NICE.max(before));
                // A thread started meanwhile (as Argon2's are) inherits it.
                assert_eq!(
                    std::thread::spawn(prio).join().unwrap(),
                    KDF_NICE.max(before)
                );
            }
            if nix::unistd::geteuid().is_root() {
                assert_eq!(prio(), before);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn header_costs_add_up_every_slot_and_digest() {
        let json = serde_json::json!({
            "keyslots": {
                "0": {"type": "luks2", "kdf": {"type": "argon2id", "time": 4, "memory": 1048576, "cpus": 4}},
                "1": {"type": "luks2", "kdf": {"type": "pbkdf2", "hash": "sha256", "iterations": 1000}},
                "2": {"type": "luks2", "kdf": {"type": "argon2i", "time": 6, "memory": 65536, "cpus": 1}}
            },
            "digests": {"0": {"type": "pbkdf2", "iterations": 250000, "keyslots": ["0", "1", "2"]}}
        });
        assert_eq!(
            costs_of(&json),
            Costs {
                pbkdf2_iterations: 251_000,
                argon2_iterations: 10,
                memory_kb: 1_048_576,
                threads: 4,
            }
        );
    }

    #[test]
    fn parses_pbkdf_settings() {
        assert_eq!(
            "pbkdf2:1000".parse::<Pbkdf>().unwrap(),
            Pbkdf::Pbkdf2 { iterations: 1000 }
        );
        assert_eq!(
            "argon2id:500:65536".parse::<Pbkdf>().unwrap(),
            Pbkdf::Argon2id {
                time_ms: 500,
                memory_kb: 65536
            }
        );
        assert!("pbkdf2:10".parse::<Pbkdf>().is_err());
        for p in [Pbkdf::default(), Pbkdf::Pbkdf2 { iterations: 1000 }] {
            assert_eq!(p.to_string().parse::<Pbkdf>().unwrap(), p);
        }
        assert!("scrypt".parse::<Pbkdf>().unwrap_err().contains("argon2id"));
    }
}
