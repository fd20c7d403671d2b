//! The requests without fields, and who sends them: the sidecars through
//! kubernetes-csi/csi-lib-utils rpc/common.go (GetDriverName,
//! GetPluginCapabilities, GetControllerCapabilities, Probe and
//! ProbeForever, the livenessprobe's too), kubelet (pkg/volume/csi
//! csi_client.go NodeGetInfo at registration, NodeGetCapabilities before
//! staging) and the node-driver-registrar (NodeGetInfo).

use crate::csi;

pub fn get_plugin_info() -> csi::GetPluginInfoRequest {
    csi::GetPluginInfoRequest {}
}

pub fn get_plugin_capabilities() -> csi::GetPluginCapabilitiesRequest {
    csi::GetPluginCapabilitiesRequest {}
}

pub fn probe() -> csi::ProbeRequest {
    csi::ProbeRequest {}
}

pub fn controller_get_capabilities() -> csi::ControllerGetCapabilitiesRequest {
    csi::ControllerGetCapabilitiesRequest {}
}

pub fn node_get_info() -> csi::NodeGetInfoRequest {
    csi::NodeGetInfoRequest {}
}

pub fn node_get_capabilities() -> csi::NodeGetCapabilitiesRequest {
    csi::NodeGetCapabilitiesRequest {}
}
