//! Where VMs are: an index of `/cluster/resources?type=vm`, built once per
//! region and refreshed when a lookup misses or the entry is old, instead of
//! a scan per call.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::pve::api::VmResource;
use crate::pve::{Client, Deadline, PveError};

const FRESH: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct VmIndex {
    by_region: Mutex<HashMap<String, (Instant, Vec<VmResource>)>>,
    /// SMBIOS uuid → VM id, as last found: one config read confirms it
    /// instead of a scan on every attach.
    by_uuid: Mutex<HashMap<String, u32>>,
}

impl VmIndex {
    async fn rows(
        &self,
        client: &Client,
        refresh: bool,
        d: Deadline,
    ) -> Result<Vec<VmResource>, PveError> {
        let mut map = self.by_region.lock().await;
        if let Some((at, rows)) = map.get(client.region())
            && !refresh
            && at.elapsed() < FRESH
        {
            return Ok(rows.clone());
        }
        let rows = client.vms(d).await?;
        map.insert(client.region().to_string(), (Instant::now(), rows.clone()));
        Ok(rows)
    }

    /// The Proxmox node VM `vmid` runs on, or `None` if it does not exist.
    pub async fn node_of(
        &self,
        client: &Client,
        vmid: u32,
        d: Deadline,
    ) -> Result<Option<VmResource>, PveError> {
        for refresh in [false, true] {
            if let Some(v) = self
                .rows(client, refresh, d)
                .await?
                .into_iter()
                .find(|v| v.vmid == vmid)
            {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// Where VM `vmid` is right now (the cluster's list read again): for the
    /// rare calls that must not act on a node the VM has left.
    pub async fn current(
        &self,
        client: &Client,
        vmid: u32,
        d: Deadline,
    ) -> Result<Option<VmResource>, PveError> {
        Ok(self
            .rows(client, true, d)
            .await?
            .into_iter()
            .find(|v| v.vmid == vmid))
    }

    /// The VMs named like the Kubernetes node: exactly, else as the first
    /// label of an FQDN.
    pub async fn by_name(
        &self,
        client: &Client,
        name: &str,
        d: Deadline,
    ) -> Result<Vec<VmResource>, PveError> {
        for refresh in [false, true] {
            let rows = self.rows(client, refresh, d).await?;
            let exact: Vec<VmResource> = rows
                .iter()
                .filter(|v| v.name.as_deref() == Some(name))
                .cloned()
                .collect();
            let prefix: Vec<VmResource> = rows
                .iter()
                .filter(|v| {
                    v.name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&format!("{name}.")))
                })
                .cloned()
                .collect();
            let found = if exact.is_empty() { prefix } else { exact };
            if !found.is_empty() {
                return Ok(found);
            }
        }
        Ok(Vec::new())
    }

    /// One of the controller's own VMs, `name`d and tagged `proxmox-csi`
    /// and `kind`. Its name comes into `/cluster/resources` from RRD data
    /// pvestatd writes about every 10 s (pve-manager PVE/API2Tools.pm
    /// extract_vm_stats; PVE/Service/pvestatd.pm update_qemu_status), its
    /// tags at once: a VM listed without a name yet is asked for its config.
    /// VMs made by earlier versions carry a `csi-name.<name>` tag as well.
    /// A VM the driver made without tags (a tag policy that refuses them at
    /// creation) and never got to tag (a lost answer, a restart) is known by
    /// its name and the description the driver writes, and tagged now.
    pub async fn own(
        &self,
        client: &Client,
        name: &str,
        kind: &str,
        d: Deadline,
    ) -> Result<Option<VmResource>, PveError> {
        let tag = name_tag(name);
        let ours = |v: &VmResource| v.has_tag(OWN_TAG) && v.has_tag(kind);
        for refresh in [false, true] {
            let rows = self.rows(client, refresh, d).await?;
            if let Some(v) = rows
                .iter()
                .find(|v| ours(v) && (v.has_tag(&tag) || v.name.as_deref() == Some(name)))
            {
                return Ok(Some(v.clone()));
            }
            if !refresh {
                continue;
            }
            let untagged = |v: &VmResource| v.tags.as_deref().is_none_or(|t| t.trim().is_empty());
            let maybe = rows.iter().filter(|v| {
                (ours(v) && v.name.is_none())
                    || (untagged(v) && v.name.as_deref().is_none_or(|n| n == name))
            });
            for v in maybe {
                let cfg = match client.vm_config(&v.node, v.vmid, d).await {
                    Ok(cfg) => cfg,
                    // A tagged one may be the one looked for: unknown until
                    // its node answers (else a second copy would be made).
                    Err(e) if e.is_transient() && ours(v) => return Err(e),
                    // Gone, or an untagged VM on a node that does not answer
                    // (names are missing from the list while its pvestatd is
                    // silent).
                    Err(e) if e.is_not_found() || e.is_transient() => continue,
                    Err(e) => return Err(e),
                };
                if cfg.values.get("name").map(String::as_str) != Some(name) {
                    continue;
                }
                let mut found = VmResource {
                    name: Some(name.to_string()),
                    ..v.clone()
                };
                if !ours(v) {
                    let made_by_driver = cfg
                        .values
                        .get("description")
                        .is_some_and(|d| d.contains(crate::naming::OWNED.trim_end()));
                    if !made_by_driver {
                        continue;
                    }
                    let tags = format!("{OWN_TAG};{kind}");
                    let form = [
                        ("tags", tags.clone()),
                        ("protection", "1".to_string()),
                        ("digest", cfg.digest.clone()),
                    ];
                    tracing::info!(
                        vmid = v.vmid,
                        name,
                        "a VM of the driver without its tags: tagging it"
                    );
                    client.update_config(&v.node, v.vmid, &form, d).await?;
                    found.tags = Some(tags);
                    self.invalidate(client.region()).await;
                }
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The VM whose `smbios1` uuid is `uuid`. VMs named with the node's name
    /// as a prefix are asked first; if none is named so, every VM of the
    /// region is (one config read per VM, as with Cluster API machines whose
    /// VM names differ from the node names).
    pub async fn by_smbios_uuid(
        &self,
        client: &Client,
        name: &str,
        uuid: &str,
        d: Deadline,
    ) -> Result<Option<VmResource>, PveError> {
        let rows = self.rows(client, false, d).await?;
        let known = self.by_uuid.lock().await.get(uuid).copied();
        let named: Vec<&VmResource> = rows
            .iter()
            .filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(name)))
            .collect();
        let scan = if named.is_empty() {
            rows.iter().collect()
        } else {
            named
        };
        // The VM found last time first; the scan covers a recreated VM.
        let candidates = rows
            .iter()
            .filter(|v| Some(v.vmid) == known)
            .chain(scan.into_iter().filter(|v| Some(v.vmid) != known));
        for vm in candidates {
            let config = client.vm_config(&vm.node, vm.vmid, d).await?;
            if config
                .values
                .get("smbios1")
                .is_some_and(|line| smbios_uuid(line).as_deref() == Some(uuid))
            {
                self.by_uuid.lock().await.insert(uuid.to_string(), vm.vmid);
                return Ok(Some(vm.clone()));
            }
        }
        Ok(None)
    }

    /// Every VM of the region (for the attachment index).
    pub async fn all(&self, client: &Client, d: Deadline) -> Result<Vec<VmResource>, PveError> {
        self.rows(client, false, d).await
    }

    /// Forget what is known about a region (after a VM moved).
    pub async fn invalidate(&self, region: &str) {
        self.by_region.lock().await.remove(region);
    }
}

pub use crate::naming::OWN_TAG;

/// Whether a VM config is one of the controller's own VMs (its tag).
pub fn is_own(cfg: &std::collections::BTreeMap<String, String>) -> bool {
    cfg.get("tags")
        .is_some_and(|t| t.split([';', ',', ' ']).any(|x| x == OWN_TAG))
}

/// Proxmox's `protection: 1` in a VM config: the VM may not be destroyed
/// nor lose a disk while it is set (pve-guest-common
/// src/PVE/AbstractConfig.pm check_protection).
pub fn is_protected(cfg: &std::collections::BTreeMap<String, String>) -> bool {
    cfg.get("protection").is_some_and(|v| v.trim() == "1")
}

/// The tag that named one of the controller's VMs before fixed tags:
/// `csi-name.<name>` (a
/// Proxmox tag, `[a-z0-9_][a-z0-9_\-+.]*`: pve-common
/// src/PVE/JSONSchema.pm $PVE_TAG_RE; VM names are already `[a-z0-9-]`).
pub fn name_tag(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+') {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("csi-name.{clean}")
}

/// The `uuid=` of an `smbios1` config line, lower-case.
fn smbios_uuid(line: &str) -> Option<String> {
    line.split(',')
        .find_map(|kv| kv.strip_prefix("uuid="))
        .map(|u| u.trim().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::smbios_uuid;

    #[test]
    fn smbios1_uuid() {
        assert_eq!(
            smbios_uuid("uuid=6E1B3C2A-0000-4000-8000-0000000000AB").as_deref(),
            Some("6e1b3c2a-0000-4000-8000-0000000000ab")
        );
        assert_eq!(
            smbios_uuid("base64=1,serial=aT0xMTM=,uuid=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(smbios_uuid("serial=x"), None);
    }
}
