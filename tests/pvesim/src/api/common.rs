//! Checks shared by the handlers: nodes that exist and answer, VMs on the
//! node named in the path, volumes by id.

use crate::reply::ApiError;
use crate::state::{Cluster, StorageSpec, Vm};

/// `proxyto: node`: the node must resolve and be online.
pub fn node(c: &Cluster, node: &str) -> Result<(), ApiError> {
    match c.nodes.get(node) {
        None => Err(ApiError::die(format!(
            "hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"
        ))),
        Some(n) if !n.online => Err(ApiError::new(595, "No route to host")),
        Some(_) => Ok(()),
    }
}

pub fn no_config(node: &str, vmid: u32) -> ApiError {
    ApiError::die(format!(
        "Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"
    ))
}

/// pve-cluster PVE/Cluster.pm check_cfs_quorum.
pub fn quorum(c: &Cluster) -> Result<(), ApiError> {
    if c.knobs.no_quorum {
        return Err(ApiError::die("cluster not ready - no quorum?"));
    }
    Ok(())
}

pub fn vm<'a>(c: &'a Cluster, node_name: &str, vmid: u32) -> Result<&'a Vm, ApiError> {
    node(c, node_name)?;
    c.vms
        .get(&vmid)
        .filter(|v| v.node == node_name)
        .ok_or_else(|| no_config(node_name, vmid))
}

pub fn vm_mut<'a>(c: &'a mut Cluster, node_name: &str, vmid: u32) -> Result<&'a mut Vm, ApiError> {
    node(c, node_name)?;
    c.vms
        .get_mut(&vmid)
        .filter(|v| v.node == node_name)
        .ok_or_else(|| no_config(node_name, vmid))
}

/// A storage usable on `node` (activation checks of pve-storage).
pub fn storage<'a>(c: &'a Cluster, node: &str, id: &str) -> Result<&'a StorageSpec, ApiError> {
    let st = c
        .storages
        .get(id)
        .ok_or_else(|| ApiError::die(format!("storage '{id}' does not exist")))?;
    if st.disable {
        return Err(ApiError::die(format!("storage '{id}' is disabled")));
    }
    if !st.enabled_on(node) {
        return Err(ApiError::die(format!(
            "storage '{id}' is not available on node '{node}'"
        )));
    }
    // pve-storage src/PVE/Storage.pm activate_storage: a failed
    // check_connection without an error of its own.
    if !st.online() {
        return Err(ApiError::die(format!("storage '{id}' is not online")));
    }
    Ok(st)
}

/// Splits `<storage>:<volname>`.
pub fn split_volid(volid: &str) -> Result<(&str, &str), ApiError> {
    volid
        .split_once(':')
        .filter(|(s, n)| !s.is_empty() && !n.is_empty())
        .ok_or_else(|| ApiError::die(format!("unable to parse volume ID '{volid}'")))
}
