//! A volume's LUKS mapping: formatted only on a blank disk (or over
//! hostd's own interrupted format), reused only on this very disk.

use super::*;

/// What a stage does about the volume's LUKS mapping (see [`luks_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LuksPlan {
    /// Open already, on this very disk: used as it is.
    Reuse,
    /// A blank disk, proven so: luksFormat, then open.
    Format,
    /// A header without a key slot from hostd's own interrupted
    /// luksFormat: formatted again, its costs checked, opened.
    FormatAgain,
    /// A header with a key slot: its costs checked, opened.
    Open,
}

impl Volumes {
    /// Opens the volume's LUKS mapping `name` on `device` (the disk `disk`,
    /// as verified), formatting a blank disk first; an open mapping is
    /// reused only on this very disk. Whether this call wrote the LUKS
    /// header.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_luks(
        &self,
        volume_id: &str,
        device: &Path,
        disk: &DiskId,
        (name, pass): (&str, &Secret<Vec<u8>>),
        claim: Claim,
        read_only: bool,
        table: &[mounts::MountEntry],
        actions: &mut Vec<String>,
        timings: &mut HashMap<String, u64>,
    ) -> Result<bool, HostdError> {
        let planning = Instant::now();
        close_half_made(&HOST, name, table)?;
        let plan = luks_plan(&HOST, device, name, claim, read_only, || {
            Ok(self.bindings.format_begun(volume_id, disk))
        })?;
        timings.insert("luks_plan".into(), ms(planning));
        match plan {
            LuksPlan::Reuse => return Ok(false),
            LuksPlan::Format => {
                let t = Instant::now();
                self.bindings.begin_format(volume_id, disk)?;
                self.still_the_disk(volume_id, device, disk, claim)?;
                kdf::format(device, pass, self.pbkdf)?;
                timings.insert("luks_format".into(), ms(t));
                actions.push("luksFormat".to_string());
            }
            LuksPlan::FormatAgain => {
                tracing::warn!(device = %device.display(), "LUKS header without a key slot: hostd's earlier luksFormat was interrupted; formatting again");
                self.still_the_disk(volume_id, device, disk, claim)?;
                kdf::format(device, pass, self.pbkdf)?;
                actions.push("luksFormat (an earlier one was interrupted)".to_string());
                luks::check_header_costs(device, self.kdf_bounds)?;
            }
            LuksPlan::Open => luks::check_header_costs(device, self.kdf_bounds)?,
        }
        let t = Instant::now();
        self.still_the_disk(volume_id, device, disk, claim)?;
        kdf::open(device, name, pass)?;
        timings.insert("luks_open".into(), ms(t));
        actions.push(format!("luksOpen {name}"));
        Ok(matches!(plan, LuksPlan::Format | LuksPlan::FormatAgain))
    }
}

/// A mapping `name` left by a hostd that died between activation and its
/// node (or before the mount) is torn down, to be made again; nothing can
/// be using it: the staging path is not mounted.
pub(super) fn close_half_made(
    host: &impl Host,
    name: &str,
    table: &[mounts::MountEntry],
) -> Result<(), HostdError> {
    if let Some(dm) = host.active(name)
        && !host.is_open(name)
        && !device_has_mount(host, table, &dm)
    {
        tracing::warn!(mapping = %name, dm, "closing a half-made mapping left by an earlier attempt");
        host.close(name, true)?;
    }
    Ok(())
}

/// What to do about the volume's mapping `name` on `device`: an open one
/// is used only on this very disk; a disk is luksFormatted only when blank
/// (every byte of the header area, and the samples, zero) or when the
/// format note (`begun`, read only where it decides) says hostd began it.
pub(super) fn luks_plan(
    host: &impl Host,
    device: &Path,
    name: &str,
    claim: Claim,
    read_only: bool,
    mut begun: impl FnMut() -> Result<bool, HostdError>,
) -> Result<LuksPlan, HostdError> {
    if host.is_open(name) {
        // An open mapping is used only if it sits on the disk just verified.
        return match mapping_on(host, name, device) {
            Ok(()) => Ok(LuksPlan::Reuse),
            Err(reason) => Err(HostdError::DeviceRefused {
                device: device.to_path_buf(),
                reason,
            }),
        };
    }
    let found = host.probe(device)?;
    let keyslot = matches!(&found, Contents::Filesystem(t) if t == "crypto_LUKS")
        && host.has_keyslot(device)?;
    if let Some(at) = claim.held_filesystem()
        && !keyslot
    {
        return Err(HostdError::HoldsData {
            device: device.to_path_buf(),
            found: format!(
                "{found} where its LUKS header with a key slot was, and the volume's claim at byte {at} \
                 says it has held its filesystem: the header is damaged or was overwritten (restore a \
                 header backup), and it is never formatted again"
            ),
        });
    }
    match found {
        Contents::Blank => {
            if read_only {
                return Err(read_only_blank(device));
            }
            if !begun()? {
                refuse_data(host, device)?;
                // luksFormat writes the header area whole: every
                // byte of it is read, not sampled.
                refuse_data_in(host, device, luks::HEADER_BYTES)?;
            }
            Ok(LuksPlan::Format)
        }
        Contents::Filesystem(t) if t == "crypto_LUKS" => {
            if keyslot {
                return Ok(LuksPlan::Open);
            }
            // Only hostd's own interrupted luksFormat: a header whose
            // slots someone removed may have a backup that opens the
            // data still.
            // The note is read before `read_only` counts: the disk it
            // names is found first, as it always was.
            let begun = begun()?;
            if read_only || !begun {
                return Err(HostdError::HoldsData {
                    device: device.to_path_buf(),
                    found: "a LUKS header without a key slot that hostd did not begin".into(),
                });
            }
            Ok(LuksPlan::FormatAgain)
        }
        found => Err(HostdError::HoldsData {
            device: device.to_path_buf(),
            found: format!("{found} and encryption was asked for"),
        }),
    }
}

/// Whether the LUKS mapping `name` sits on `device` alone; if not, where.
pub(super) fn mapping_on(
    host: &impl BlockDevices,
    name: &str,
    device: &Path,
) -> Result<(), String> {
    let disk = host.kernel_name(device).unwrap_or_default();
    let under = host
        .active(name)
        .map(|dm| host.slaves(&dm))
        .unwrap_or_default();
    if under == [disk.clone()] {
        Ok(())
    } else {
        Err(format!(
            "mapping {name} is open on {under:?}, not on this disk ({disk})"
        ))
    }
}
