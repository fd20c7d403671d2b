//! Stats: sizes, inode counts and the volume's condition.

use super::*;

impl Volumes {
    pub fn stats(&self, req: &pb::StatsRequest) -> Result<pb::StatsResponse, HostdError> {
        let (place, staged) = self.volume_at(&req.volume_id, &req.volume_path)?;
        let block = place.layout.is_block();
        let mut resp = pb::StatsResponse {
            block,
            ..Default::default()
        };
        let mut problems = Vec::new();
        if staged.name.is_empty() || !Path::new("/sys/class/block").join(&staged.name).exists() {
            problems.push("the device is gone".to_string());
        }
        if let Some((mapping, disk)) = &staged.mapping
            && !Path::new("/sys/class/block").join(disk).exists()
        {
            problems.push(format!("the disk under mapping {mapping} is gone"));
        }
        if block {
            resp.total_bytes = blockdev::size_of(&staged.name).unwrap_or(0);
        } else {
            match nix::sys::statvfs::fstatvfs(&place.open()?) {
                Ok(v) => {
                    let frag = v.fragment_size();
                    resp.total_bytes = v.blocks().saturating_mul(frag);
                    resp.available_bytes = v.blocks_available().saturating_mul(frag);
                    resp.used_bytes = v
                        .blocks()
                        .saturating_sub(v.blocks_free())
                        .saturating_mul(frag);
                    resp.total_inodes = v.files();
                    resp.available_inodes = v.files_available();
                    resp.used_inodes = v.files().saturating_sub(v.files_free());
                }
                // Words of the answer's VolumeCondition, not an error.
                Err(e) => problems.push(format!(
                    "the filesystem does not answer ({e}); it may have shut down"
                )),
            }
            if staged.entry.super_read_only && !staged.entry.read_only {
                problems.push("the filesystem was remounted read-only after errors".into());
            }
        }
        resp.condition = Some(pb::VolumeCondition {
            abnormal: !problems.is_empty(),
            message: if problems.is_empty() {
                "volume is healthy".into()
            } else {
                problems.join("; ")
            },
        });
        Ok(resp)
    }
}
