//! Calls a test makes for what it sets up, on top of the requests
//! `callers` shapes as the sidecars do: the answer, or the test fails
//! naming the call and its status.

use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::csi::v1::controller_server::Controller;
use tonic::Request;

/// The volume CreateVolume answers for `req`.
pub async fn created<C: Controller>(ctl: &C, req: csi::CreateVolumeRequest) -> csi::Volume {
    let name = req.name.clone();
    match ctl.create_volume(Request::new(req)).await {
        Ok(r) => match r.into_inner().volume {
            Some(v) => v,
            None => panic!("CreateVolume {name}: an answer without a volume"),
        },
        Err(e) => panic!("CreateVolume {name}: {e:?}"),
    }
}
