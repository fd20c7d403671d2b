//! Unstage: unmounts and closes what this volume staged, never while a
//! pod still has it.

use super::*;

impl Volumes {
    pub fn unstage(&self, req: &pb::UnstageRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let staging = self
            .paths
            .place("staging_path", &req.staging_path, Layout::STAGING)?;
        let record = self.bindings.get(&req.volume_id)?;
        if let Some(b) = record.as_ref().filter(|b| b.staging_path != staging.path) {
            return Err(HostdError::NotThisVolume {
                field: "staging_path",
                path: staging.path.clone(),
                volume_id: req.volume_id.clone(),
                reason: format!("the volume is staged at {}", b.staging_path.display()),
            });
        }
        self.require_tie("staging_path", &staging, &req.volume_id)?;
        let table = mounts::table()?;
        // Nothing is unmounted or closed while a pod still has the volume:
        // a closed mapping's device number goes to the next mapping made,
        // which the pod's bound node would then reach.
        let block_file = if staging.layout == Layout::BlockStaging && staging.kind() == Kind::Dir {
            Some(staging.child(BLOCK_FILE)?)
        } else {
            None
        };
        let here = block_file.as_ref().unwrap_or(&staging);
        let mounted = self.mounted_at(here, &table)?;
        if let Some(mm) = &mounted
            && !self.owns(&req.volume_id, &staging, mm, record.as_ref())
        {
            return Err(Self::not_this_volume(
                "staging_path",
                here,
                &req.volume_id,
                mm,
            ));
        }
        let published = still_published(
            &HOST,
            &table,
            &req.volume_id,
            mounted.as_deref(),
            &[&staging.path, &here.path],
        );
        if !published.is_empty() {
            return Err(HostdError::StillPublished {
                volume_id: req.volume_id.clone(),
                targets: published,
            });
        }
        let mut flushed = None;
        let mut go_mapping = None;
        if let Some(file) = &block_file {
            if mounted.is_some() {
                unmount_all(file)?;
                flushed = mounted;
            }
            file.remove_only(Kind::File)?;
        } else if let Some(mm) = mounted {
            // A volume the Go driver staged sits on its mapping
            // `<disk>-encrypted` or `wwn-0x…-encrypted`, which is closed
            // below with the mount gone.
            go_mapping = go_mapping_of(&HOST, staged_at(&staging)?.and_then(|s| s.mapping));
            unmount_all(&staging)?;
            flushed = Some(mm);
        }
        if let Some(mm) = flushed {
            blockdev::flush(&mm);
        }
        close_mappings(&HOST, &req.volume_id, go_mapping)?;
        // A format note outlives no unstage: the next stage starts afresh.
        self.bindings.end_format(&req.volume_id)?;
        self.bindings.remove(&req.volume_id)
    }
}

/// Where the volume is still mounted or bound besides `except` (its staging
/// path): what `mounted` there is, or its own mapping, elsewhere.
pub(super) fn still_published(
    host: &impl BlockDevices,
    table: &[mounts::MountEntry],
    volume_id: &str,
    mounted: Option<&str>,
    except: &[&Path],
) -> Vec<PathBuf> {
    let mut staged_devices: Vec<String> = mounted.iter().map(|m| m.to_string()).collect();
    if let Some(mm) = host
        .active(&luks::mapping_name(volume_id))
        .and_then(|dm| host.majmin_of(&dm))
    {
        staged_devices.push(mm);
    }
    publications(host, table, &staged_devices, except)
}

/// The mapping (name, disk) a staging path sits on, if it is the Go
/// driver's mapping of that disk: only such a one is closed for the volume.
pub(super) fn go_mapping_of(
    host: &impl Crypt,
    mapping: Option<(String, String)>,
) -> Option<(String, String)> {
    mapping.filter(|(dm, disk)| {
        host.go_mapping_on(disk)
            .is_some_and(|(name, _)| name == *dm)
    })
}

/// Closes what the volume staged through: the Go driver's mapping it was
/// mounted from (`go_mapping`, when nothing else uses it), then the
/// volume's own mapping, even if nothing was mounted (a crash between
/// unmount and close, or a surprise unplug). No other mapping.
pub(super) fn close_mappings(
    host: &impl Host,
    volume_id: &str,
    go_mapping: Option<(String, String)>,
) -> Result<(), HostdError> {
    if let Some((name, disk)) = go_mapping {
        let table = host.table()?;
        if host
            .active(&name)
            .is_some_and(|dm| !device_has_mount(host, &table, &dm) && !host.held(&dm))
        {
            tracing::info!(mapping = %name, disk, "closing the Go driver's mapping of the volume");
            host.close(&name, !host.backing_present(&name))?;
        }
    }
    let name = luks::mapping_name(volume_id);
    if host.active(&name).is_some() {
        // A vanished disk leaves a mapping that only a forced close removes.
        host.close(&name, !host.backing_present(&name))?;
    }
    Ok(())
}
