//! A raw block volume's stage: the disk, or its LUKS mapping, bound onto
//! the device file in kubelet's block staging directory.

use super::*;

impl Volumes {
    /// A raw block volume: the disk, or with a passphrase its LUKS mapping
    /// (the disk formatted when blank), bound into the staging directory.
    /// A disk of an encrypted class that holds data but no LUKS header was
    /// written by the Go driver, which stages block volumes without their
    /// class's encryption (pkg/csi/node.go NodeStageVolume returns for block
    /// before it reads the secrets): it stays usable, unencrypted, as there.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_block_volume(
        &self,
        volume_id: &str,
        device: &Path,
        disk: &DiskId,
        staging: &Place,
        read_only: bool,
        passphrase: Option<&Secret<Vec<u8>>>,
        timings: &mut HashMap<String, u64>,
    ) -> Result<(Vec<String>, String), HostdError> {
        let Some(pass) = passphrase else {
            refuse_luks_as_plain(&HOST, device)?;
            return self.stage_block(device, staging);
        };
        let name = luks::mapping_name(volume_id);
        let mut actions = Vec::new();
        if let Some(found) = plain_data_under(&HOST, device, &name, self.go_takeover)? {
            tracing::warn!(
                %volume_id,
                device = %device.display(),
                %found,
                "raw block volume of an encrypted class holds unencrypted data (written by the Go driver, \
                 which does not encrypt block volumes): staged as it is; copy it to a new volume to encrypt it"
            );
            let (mut a, m) = self.stage_block(device, staging)?;
            a.insert(
                0,
                format!("not encrypted: the disk holds {found}, no LUKS header"),
            );
            return Ok((a, m));
        }
        // Opened, or checked to be open on this very disk.
        let table = mounts::table()?;
        device::verify_unused(device, &table, Some(&name))?;
        // A raw volume's every byte may be data: no claim decides here.
        self.open_luks(
            volume_id,
            device,
            disk,
            (&name, pass),
            Claim::Unmarked,
            read_only,
            &table,
            &mut actions,
            timings,
        )?;
        // No filesystem follows: the format, if there was one, is done.
        self.bindings.end_format(volume_id)?;
        // The kernel's own node (`/dev/dm-N`, found in sysfs), so that the
        // mount table names the device sysfs knows; `/dev/mapper/<name>` is
        // a node of its own when libdevmapper runs without udev.
        let dm = blockdev::active(&name).ok_or_else(|| {
            HostdError::failed(
                "finding",
                luks::mapper_path(&name).display(),
                "no such device-mapper device in sysfs",
            )
        })?;
        let (a, m) = self.stage_block(&Path::new("/dev").join(dm), staging)?;
        actions.extend(a);
        Ok((actions, m))
    }

    pub(super) fn stage_block(
        &self,
        device: &Path,
        staging: &Place,
    ) -> Result<(Vec<String>, String), HostdError> {
        self.stage_block_over(device, staging, mounts::table()?)
    }

    /// `stage_block` against `table`, the mounts that count.
    pub(super) fn stage_block_over(
        &self,
        device: &Path,
        staging: &Place,
        table: Vec<mounts::MountEntry>,
    ) -> Result<(Vec<String>, String), HostdError> {
        let mm = device::majmin(device)?;
        // kubelet makes the block staging directory before it calls
        // (csi_block.go stageVolumeForBlock): hostd makes none of its own.
        if staging.kind() != Kind::Dir {
            return Err(HostdError::invalid(
                "staging_path",
                format!(
                    "{} is not a directory; kubelet makes it before NodeStageVolume",
                    staging.path.display()
                ),
            ));
        }
        let file = staging.child(BLOCK_FILE)?;
        if table.iter().any(|m| m.mount_point == file.path) {
            // A bound device node: the file now stats as that device.
            let bound = device::majmin(&file.open()?.proc_path())?;
            if bound == mm {
                return Ok((vec!["already staged".into()], mm));
            }
            return Err(HostdError::StagedDifferently {
                path: file.path.clone(),
                what: "a bound device",
                detail: format!(
                    "device {bound} is bound there, the request is {} ({mm})",
                    device.display()
                ),
            });
        }
        device::verify_unused(device, &table, None)?;
        file.ensure_file()?;
        mounts::bind(device, &file, false, &mountopts::Checked::default())?;
        Ok((
            vec![format!(
                "bound {} at {}",
                device.display(),
                file.path.display()
            )],
            mm,
        ))
    }
}

/// For a raw block volume of an encrypted class whose mapping `name` is not
/// open: what `device` holds if that is data without a LUKS header (the Go
/// driver's, which never encrypts block volumes), staged as it is only with
/// `go_takeover`; `None` for a blank disk or a LUKS header.
pub(super) fn plain_data_under(
    host: &impl Host,
    device: &Path,
    name: &str,
    go_takeover: bool,
) -> Result<Option<String>, HostdError> {
    if host.is_open(name) {
        return Ok(None);
    }
    // What a raw block volume holds rarely has a signature: bytes
    // where a blank disk has none are data too.
    let found = match host.probe(device)? {
        Contents::Blank => host
            .first_data(device)?
            .map(|at| format!("no signature, but data at byte {at}")),
        Contents::Filesystem(t) if t == "crypto_LUKS" => None,
        other => Some(other.to_string()),
    };
    if let Some(found) = &found
        && !go_takeover
    {
        return Err(HostdError::DeviceRefused {
            device: device.to_path_buf(),
            reason: format!(
                "the volume's class asks for encryption, but the disk holds {found} and no LUKS header; \
                 staging it unencrypted (a raw block volume the Go driver wrote) needs hostd's --go-takeover"
            ),
        });
    }
    Ok(found)
}
