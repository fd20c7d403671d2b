//! GetCapacity: the total free bytes, and the largest volume that fits, on
//! the class's storage (or every storage) within the request's topology.

use proxmox_csi_proto::csi::v1 as csi;

use super::Controller;
use super::create::{REGION, ZONE};
use crate::error::CtlError;
use crate::pve::Deadline;

impl Controller {
    pub async fn capacity(
        &self,
        r: &csi::GetCapacityRequest,
        d: Deadline,
    ) -> Result<(u64, u64), CtlError> {
        let segs = r
            .accessible_topology
            .as_ref()
            .map(|t| t.segments.clone())
            .unwrap_or_default();
        let Some(storage) = r.parameters.get("storage").filter(|s| !s.is_empty()) else {
            return self
                .capacity_of_all(segs.get(REGION), segs.get(ZONE), d)
                .await;
        };
        let region = match segs.get(REGION) {
            Some(r) => r.clone(),
            None if self.clients.len() == 1 => {
                self.clients.keys().next().cloned().unwrap_or_default()
            }
            None => {
                return Err(CtlError::invalid(
                    "accessible_topology",
                    format!("{REGION} is required with several clusters"),
                ));
            }
        };
        let client = self.client(&region)?;
        let rows = self.storage_rows(&client, storage, d).await?;
        let row = match segs.get(ZONE) {
            Some(z) => rows.iter().find(|r| &r.node == z),
            None => rows.iter().find(|r| r.shared == 1).or_else(|| rows.first()),
        };
        let Some(row) = row.filter(|r| r.status == "available") else {
            return Ok((0, 0));
        };
        let st = client.storage_status(&row.node, storage, d).await?;
        if st.enabled == 0 || st.active == 0 {
            return Ok((0, 0));
        }
        // The largest volume is the free space in whole 512 MiB steps.
        let max = st.avail / super::CHUNK * super::CHUNK;
        Ok((st.avail, max))
    }

    /// GetCapacity without a storage (no StorageClass names one): the free
    /// space of every storage this driver may use in the region (or zone),
    /// shared storages counted once, from the cluster's resource list; the
    /// largest volume is what the emptiest single storage holds.
    async fn capacity_of_all(
        &self,
        region: Option<&String>,
        zone: Option<&String>,
        d: Deadline,
    ) -> Result<(u64, u64), CtlError> {
        let (mut total, mut largest) = (0u64, 0u64);
        let mut regions: Vec<&String> = self
            .clients
            .keys()
            .filter(|r| region.is_none_or(|want| want == *r))
            .collect();
        regions.sort();
        for region in regions {
            let client = self.client(region)?;
            let cluster = client.cluster();
            let mut seen_shared = std::collections::HashSet::new();
            for row in client.storages(d).await? {
                let usable = row.status == "available"
                    && row.holds_images()
                    && cluster.storage_allowed(&row.storage)
                    && cluster.node_allowed(&row.node)
                    && zone.is_none_or(|z| *z == row.node);
                if !usable || (row.shared == 1 && !seen_shared.insert(row.storage.clone())) {
                    continue;
                }
                let free = row.maxdisk.saturating_sub(row.disk);
                total = total.saturating_add(free);
                largest = largest.max(free / super::CHUNK * super::CHUNK);
            }
        }
        Ok((total, largest))
    }
}
