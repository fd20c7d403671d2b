//! Publish and unpublish: binds of the staged volume into pods.

use super::*;

impl Volumes {
    pub fn publish(&self, req: &pb::PublishRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let (staging_layout, target_layout) = if req.block {
            (Layout::BlockStaging, Layout::BlockTarget)
        } else {
            (Layout::FsStaging, Layout::FsTarget)
        };
        let staging = self
            .paths
            .place("staging_path", &req.staging_path, &[staging_layout])?;
        let target = self
            .paths
            .place("target_path", &req.target_path, &[target_layout])?;
        self.require_tie("staging_path", &staging, &req.volume_id)?;
        self.require_tie("target_path", &target, &req.volume_id)?;
        let opts = mountopts::check("mount_flags", None, &req.mount_flags)?;
        if req.block {
            self.adopt_go_block(req, &staging)?;
        }
        let record = self.bindings.get(&req.volume_id)?;
        let table = mounts::table()?;
        // What is bound: the device file in a block staging directory, or
        // (a second handle on) the filesystem staging directory itself.
        let source = if req.block {
            staging.child(BLOCK_FILE)?
        } else {
            self.paths
                .place("staging_path", &req.staging_path, &[staging_layout])?
        };
        let staged = self.mounted_at(&source, &table)?.ok_or_else(|| {
            HostdError::NotStaged(format!(
                "{} (nothing mounted at {})",
                req.volume_id,
                source.path.display()
            ))
        })?;
        if !self.owns(&req.volume_id, &staging, &staged, record.as_ref()) {
            return Err(Self::not_this_volume(
                "staging_path",
                &staging,
                &req.volume_id,
                &staged,
            ));
        }
        if let Some(m) = table.iter().rev().find(|m| m.mount_point == target.path) {
            let there = self.mounted_at(&target, &table)?.unwrap_or_default();
            if there == staged && m.read_only == req.read_only {
                return self.record_target(
                    &req.volume_id,
                    &staging,
                    &target,
                    &staged,
                    req.block,
                    record,
                );
            }
            return Err(HostdError::StagedDifferently {
                path: target.path.clone(),
                what: "published",
                detail: format!(
                    "device {there} mounted {} is there, the request is device {staged} {}",
                    if m.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    if req.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                ),
            });
        }
        // One read-write publication at a time (the spec's answer for a
        // second one is FAILED_PRECONDITION): another read-write mount of
        // the staged filesystem in a pod's directory is that publication.
        if req.single_writer && !req.read_only && !req.block {
            let pods = self.paths.root().join("pods");
            if let Some(other) = table.iter().find(|m| {
                m.majmin == staged
                    && !m.read_only
                    && m.mount_point != source.path
                    && m.mount_point.starts_with(&pods)
            }) {
                return Err(HostdError::PublishedElsewhere {
                    volume_id: req.volume_id.clone(),
                    other: other.mount_point.clone(),
                });
            }
        }
        if req.block {
            target.ensure_file()?;
        } else {
            target.ensure_dir()?;
        }
        mounts::bind(&source.open()?.proc_path(), &target, req.read_only, &opts)?;
        self.record_target(
            &req.volume_id,
            &staging,
            &target,
            &staged,
            req.block,
            record,
        )
    }

    fn record_target(
        &self,
        volume_id: &str,
        staging: &Place,
        target: &Place,
        majmin: &str,
        block: bool,
        record: Option<Binding>,
    ) -> Result<(), HostdError> {
        let mut b = record.unwrap_or_else(|| Binding {
            volume_id: volume_id.to_string(),
            staging_path: staging.path.clone(),
            block,
            majmin: majmin.to_string(),
            targets: Vec::new(),
        });
        if !b.targets.contains(&target.path) {
            b.targets.push(target.path.clone());
        }
        self.bindings.put(&b)
    }

    pub fn unpublish(&self, req: &pb::UnpublishRequest) -> Result<(), HostdError> {
        check_volume_id(&req.volume_id)?;
        let target = self
            .paths
            .place("target_path", &req.target_path, Layout::TARGET)?;
        self.require_tie("target_path", &target, &req.volume_id)?;
        let record = self.bindings.get(&req.volume_id)?;
        let table = mounts::table()?;
        if let Some(mm) = self.mounted_at(&target, &table)? {
            let listed = record
                .as_ref()
                .is_some_and(|b| b.targets.contains(&target.path));
            if !listed && !self.owns(&req.volume_id, &target, &mm, record.as_ref()) {
                return Err(Self::not_this_volume(
                    "target_path",
                    &target,
                    &req.volume_id,
                    &mm,
                ));
            }
            unmount_all(&target)?;
        }
        // What publish made: a filesystem target is a directory, a block
        // target a file; nothing else at such a path is removed.
        target.remove_only(if target.layout.is_block() {
            Kind::File
        } else {
            Kind::Dir
        })?;
        if let Some(mut b) = record.filter(|b| b.targets.contains(&target.path)) {
            b.targets.retain(|t| *t != target.path);
            self.bindings.put(&b)?;
        }
        Ok(())
    }
}
