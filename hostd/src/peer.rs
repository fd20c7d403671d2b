//! Who may call hostd: the socket's mode and group are the first gate; this
//! is the second, by the caller's credentials from `SO_PEERCRED`.

use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Status};

/// Allowed callers. Root is always allowed; with both lists empty, only
/// root is.
#[derive(Debug, Clone, Default)]
pub struct PeerPolicy {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl PeerPolicy {
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let cred = req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .ok_or_else(|| {
                Status::permission_denied("caller credentials unavailable (SO_PEERCRED)")
            })?;
        let (uid, gid) = (cred.uid(), cred.gid());
        if uid == 0 || self.uids.contains(&uid) || self.gids.contains(&gid) {
            Ok(())
        } else {
            tracing::warn!(target: "audit", uid, gid, pid = ?cred.pid(), "caller refused");
            Err(Status::permission_denied(format!(
                "caller uid {uid} gid {gid} is not allowed; allowed uids {:?}, gids {:?}",
                self.uids, self.gids
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_lists_only_root_is_let_in() {
        // A caller whose credentials are unknown is refused, lists or not.
        let e = PeerPolicy::default().check(&Request::new(())).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        let e = PeerPolicy {
            uids: vec![65532],
            gids: vec![],
        }
        .check(&Request::new(()))
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
    }
}
