//! Stage: the request checked and its device found, then the disk made
//! ready (see `filesystem` and `encrypted`) and mounted or bound into the
//! staging path. A raw block volume is bound here.

use super::*;

/// A Stage request checked, with its device found: what the blocking part
/// of Stage works from.
#[derive(Debug)]
pub struct StageWork {
    volume_id: String,
    staging: Place,
    device: PathBuf,
    /// The disk as it was verified, checked again right before use: the
    /// wait for a call slot may outlast the disk (detached, and its name
    /// given to the next disk attached).
    disk: DiskId,
    wwn: Wwn,
    serial: String,
    access: pb::stage_request::Access,
    read_only: bool,
    passphrase: Option<Secret<Vec<u8>>>,
    timings: HashMap<String, u64>,
}

impl Volumes {
    /// Stage's checks and its wait for the device; nothing is touched yet.
    pub async fn prepare_stage(&self, req: &mut pb::StageRequest) -> Result<StageWork, HostdError> {
        let begun = Instant::now();
        check_volume_id(&req.volume_id)?;
        let access = req
            .access
            .clone()
            .ok_or_else(|| HostdError::invalid("access", "filesystem or block is required"))?;
        let layout = match access {
            pb::stage_request::Access::Filesystem(_) => Layout::FsStaging,
            pb::stage_request::Access::Block(_) => Layout::BlockStaging,
        };
        let staging = self
            .paths
            .place("staging_path", &req.staging_path, &[layout])?;
        self.require_tie("staging_path", &staging, &req.volume_id)?;
        let dev = req
            .device
            .as_ref()
            .ok_or_else(|| HostdError::invalid("device", "is required"))?;
        let wwn = Wwn::parse(&dev.wwn)?;
        check_request_serial(&dev.serial, &req.volume_id)?;
        // Moved, not copied, into a Secret: wiped when the stage is done.
        let passphrase = match req.encryption.as_mut() {
            Some(e) if e.passphrase.is_empty() => {
                return Err(HostdError::invalid("encryption.passphrase", "is empty"));
            }
            Some(e) => Some(Secret::new(std::mem::take(&mut e.passphrase))),
            None => None,
        };
        if let Some(other) = self
            .bindings
            .staged_at(&staging.path)?
            .filter(|b| b.volume_id != req.volume_id)
        {
            return Err(HostdError::NotThisVolume {
                field: "staging_path",
                path: staging.path.clone(),
                volume_id: req.volume_id.clone(),
                reason: format!("volume {} is staged there", other.volume_id),
            });
        }
        let key = self.resolver.key(&wwn);
        let index = &self.index;
        let request = ms(begun);
        let waiting = Instant::now();
        let rescanned = index.clone();
        let device = index
            .wait_for(&key, self.device_wait, RESCAN_GRACE, move || {
                // Writing each host's `scan` waits for its bus: never on an
                // async worker, and one at a time however many Stages wait.
                static RESCANNING: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !RESCANNING.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    drop(tokio::task::spawn_blocking(move || {
                        discovery::rescan_scsi(&rescanned);
                        RESCANNING.store(false, std::sync::atomic::Ordering::Release);
                    }));
                }
            })
            .await
            .ok_or_else(|| HostdError::DeviceNotFound {
                wwn: wwn.to_string(),
                reason: format!("no block device with {key} within {:?}", self.device_wait),
            })?;
        let wait = ms(waiting);
        let verifying = Instant::now();
        self.resolver
            .verify_identity(&device, &wwn, &dev.serial, &req.volume_id)?;
        self.require_serial(&device, &req.volume_id, || {
            self.staged_here(&device, &req.volume_id, &staging)
        })?;
        Ok(StageWork {
            volume_id: req.volume_id.clone(),
            disk: DiskId::of(&device)?,
            wwn,
            serial: dev.serial.clone(),
            staging,
            device,
            access,
            read_only: req.read_only,
            passphrase,
            timings: HashMap::from([
                ("request".to_string(), request),
                ("wait".to_string(), wait),
                ("identity".to_string(), ms(verifying)),
            ]),
        })
    }

    /// Stage's work on the device, once found: blocking.
    pub fn stage(&self, mut w: StageWork) -> Result<pb::StageResponse, HostdError> {
        let verifying = Instant::now();
        // The same disk still, under the same name, as it was verified.
        if DiskId::of(&w.device).ok().as_ref() != Some(&w.disk) {
            return Err(HostdError::DeviceRefused {
                device: w.device.clone(),
                reason: "the disk changed since it was verified (detached, or another attached under its name); the stage is retried".into(),
            });
        }
        self.resolver
            .verify_identity(&w.device, &w.wwn, &w.serial, &w.volume_id)?;
        *w.timings.entry("identity".into()).or_default() += ms(verifying);
        let (actions, majmin, block) = match &w.access {
            pb::stage_request::Access::Filesystem(fs) => {
                let crypt = w
                    .passphrase
                    .as_ref()
                    .map(|p| (luks::mapping_name(&w.volume_id), p));
                let (a, m) = self.stage_filesystem(
                    &w.volume_id,
                    &w.device,
                    &w.disk,
                    &w.staging,
                    fs,
                    w.read_only,
                    crypt,
                    &mut w.timings,
                )?;
                (a, m, false)
            }
            pb::stage_request::Access::Block(_) => {
                let (a, m) = self.stage_block_volume(
                    &w.volume_id,
                    &w.device,
                    &w.disk,
                    &w.staging,
                    w.read_only,
                    w.passphrase.as_ref(),
                    &mut w.timings,
                )?;
                (a, m, true)
            }
        };
        let recording = Instant::now();
        let mut binding = self.bindings.get(&w.volume_id)?.unwrap_or_else(|| Binding {
            volume_id: w.volume_id.clone(),
            staging_path: w.staging.path.clone(),
            block,
            majmin: majmin.clone(),
            targets: Vec::new(),
        });
        binding.staging_path = w.staging.path.clone();
        binding.majmin = majmin.clone();
        self.bindings.put(&binding)?;
        let size_bytes = blockdev::name_of(&majmin)
            .and_then(|n| blockdev::size_of(&n))
            .unwrap_or(0);
        w.timings.insert("record".into(), ms(recording));
        Ok(pb::StageResponse {
            actions,
            size_bytes,
            timings_ms: w.timings,
        })
    }
}
