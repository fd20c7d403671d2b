//! Volumes the Go driver (proxmox-csi-plugin) attached or staged: disks
//! without this driver's serial, its `-encrypted` mappings, and raw block
//! volumes it published without staging.

use super::*;

impl Volumes {
    /// A SCSI disk is tied to its volume by the serial the controller
    /// derives from the volume id (checked in `verify_identity`). A disk
    /// without one (attached by the Go driver, which sets none; its WWN is
    /// one of a few LUN-derived values) is used only where kubelet's records
    /// already tie it to the volume (`tied`: it is in use there already), or
    /// with the operator's `--go-takeover`.
    pub(super) fn require_serial(
        &self,
        device: &Path,
        volume_id: &str,
        tied: impl FnOnce() -> Result<bool, HostdError>,
    ) -> Result<(), HostdError> {
        // Loop devices (tests) carry no serial: their resolver proves the volume.
        let by_serial = matches!(self.resolver, Resolver::Sysfs { .. });
        serial_or_tie(&HOST, by_serial, self.go_takeover, device, volume_id, tied)
    }

    /// Whether `device`, or its Go mapping, is mounted at `staging`, which
    /// kubelet names for `volume_id`: a volume the Go driver staged.
    pub(super) fn staged_here(
        &self,
        device: &Path,
        volume_id: &str,
        staging: &Place,
    ) -> Result<bool, HostdError> {
        let disk = blockdev::kernel_name(device).unwrap_or_default();
        let table = mounts::table()?;
        let mut own = vec![device::majmin(device)?];
        if let Some(mm) = luks::go_mapping_on(&disk).and_then(|(_, dm)| blockdev::majmin_of(&dm)) {
            own.push(mm);
        }
        Ok(bindings::kubelet_says(
            &staging.path,
            staging.layout,
            volume_id,
            self.paths.driver(),
        ) && table
            .iter()
            .any(|m| m.mount_point == staging.path && own.contains(&m.majmin)))
    }

    /// A raw block volume the Go driver staged: it stages nothing (its
    /// NodeStageVolume returns at once for block, pkg/csi/node.go), so
    /// kubelet's staging directory is empty. The disk the publish context
    /// names, verified as Stage verifies it, is bound there as Stage would.
    pub(super) fn adopt_go_block(
        &self,
        req: &pb::PublishRequest,
        staging: &Place,
    ) -> Result<(), HostdError> {
        let Some(dev) = req.device.as_ref() else {
            return Ok(());
        };
        if staging.kind() != Kind::Dir || self.bindings.get(&req.volume_id)?.is_some() {
            return Ok(());
        }
        let file = staging.child(BLOCK_FILE)?;
        let table = mounts::table()?;
        if self.mounted_at(&file, &table)?.is_some() {
            return Ok(());
        }
        let wwn = Wwn::parse(&dev.wwn)?;
        let key = self.resolver.key(&wwn);
        let device = self
            .index
            .get(&key)
            .ok_or_else(|| HostdError::DeviceNotFound {
                wwn: wwn.to_string(),
                reason: format!("no block device with {key}"),
            })?;
        check_request_serial(&dev.serial, &req.volume_id)?;
        self.resolver
            .verify_identity(&device, &wwn, &dev.serial, &req.volume_id)?;
        // The Go driver's own publications of this volume bind the disk at
        // pods' block targets, which kubelet's vol_data.json names as this
        // volume's; any other use of the disk still refuses it.
        let name = blockdev::kernel_name(&device).unwrap_or_default();
        // A disk with this driver's serial was attached by this driver's
        // controller, and is staged by Stage, never adopted here.
        if device::serial_of(&name)
            .is_some_and(|s| s.starts_with(proxmox_csi_common::contract::SERIAL_PREFIX))
        {
            return Ok(());
        }
        refuse_luks_as_plain(&HOST, &device)?;
        // kubelet's binds of a published block volume: the publish path
        // (a file) and the map path `volumeDevices/<pv>/dev/<pod>`.
        let go_publication = |m: &mounts::MountEntry| {
            m.fs_type == "devtmpfs"
                && m.root.trim_start_matches('/') == name
                && self
                    .paths
                    .classify(&m.mount_point)
                    .filter(|l| matches!(l, Layout::BlockTarget | Layout::BlockMap))
                    .is_some_and(|l| {
                        bindings::kubelet_says(
                            &m.mount_point,
                            l,
                            &req.volume_id,
                            self.paths.driver(),
                        )
                    })
        };
        // A disk without this driver's serial is adopted only where the Go
        // driver's publication of this very volume ties it.
        self.require_serial(&device, &req.volume_id, || {
            Ok(table.iter().any(go_publication))
        })?;
        let table: Vec<mounts::MountEntry> = table
            .iter()
            .filter(|m| !go_publication(m))
            .cloned()
            .collect();
        let (_, majmin) = self.stage_block_over(&device, staging, table)?;
        tracing::info!(volume_id = %req.volume_id, device = %device.display(), "raw block volume staged by the Go driver: disk bound into its staging directory");
        self.bindings.put(&Binding {
            volume_id: req.volume_id.clone(),
            staging_path: staging.path.clone(),
            block: true,
            majmin,
            targets: Vec::new(),
        })
    }
}

/// A mapping the Go driver left on `device` (`<disk>-encrypted`,
/// `wwn-0x…-encrypted`) that
/// nothing mounts or holds: what a switch of drivers leaves when the Go
/// driver's unstage never ran to its close. It is only a view of this very
/// disk, just verified as the volume's, so it is closed for the stage.
pub(super) fn close_idle_go_mapping(
    host: &impl Host,
    device: &Path,
    table: &[mounts::MountEntry],
) -> Result<Option<String>, HostdError> {
    let Some(disk) = host.kernel_name(device) else {
        return Ok(None);
    };
    let Some((name, dm)) = host.go_mapping_on(&disk) else {
        return Ok(None);
    };
    if device_has_mount(host, table, &dm) || host.held(&dm) {
        return Ok(None);
    }
    tracing::warn!(mapping = %name, dm, disk, "closing the Go driver's idle mapping of the disk");
    host.close(&name, false)?;
    Ok(Some(format!("closed the Go driver's mapping {name}")))
}

/// [`Volumes::require_serial`] on `host`: `by_serial` when the resolver
/// names disks by serial at all.
pub(super) fn serial_or_tie(
    host: &impl BlockDevices,
    by_serial: bool,
    go_takeover: bool,
    device: &Path,
    volume_id: &str,
    tied: impl FnOnce() -> Result<bool, HostdError>,
) -> Result<(), HostdError> {
    if !by_serial {
        return Ok(());
    }
    let disk = host.kernel_name(device).unwrap_or_default();
    if host
        .serial(&disk)
        .is_some_and(|s| s.starts_with(proxmox_csi_common::contract::SERIAL_PREFIX))
    {
        return Ok(());
    }
    if go_takeover {
        tracing::warn!(%volume_id, device = %device.display(), "disk without this driver's serial taken over (--go-takeover)");
        return Ok(());
    }
    if tied()? {
        return Ok(());
    }
    Err(HostdError::DeviceRefused {
        device: device.to_path_buf(),
        reason: format!(
            "it carries no serial of this driver's, so nothing ties it to volume {volume_id}; \
             a disk the Go driver attached is used only with hostd's --go-takeover (docs/security.md), \
             or after the controller attaches it again"
        ),
    })
}
