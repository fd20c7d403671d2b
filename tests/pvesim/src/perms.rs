//! Users, API tokens, roles and ACLs, and the privilege checks of
//! pve-access-control: `Permission check failed (<path>, <Priv>)`.

use serde::{Deserialize, Serialize};

use crate::reply::ApiError;
use crate::state::Cluster;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    /// `name@realm`.
    pub userid: String,
    /// Password for ticket login; absent means the user cannot log in.
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub tokens: Vec<Token>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    /// The part after `!`.
    pub name: String,
    pub secret: String,
    /// Privilege separation: the token has only its own ACLs, intersected
    /// with its user's. Proxmox's default.
    #[serde(default = "yes")]
    pub privsep: bool,
}

fn yes() -> bool {
    true
}

/// One ACL line: on `path`, `roles` for each of `users` and `tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclEntry {
    pub path: String,
    pub roles: Vec<String>,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub tokens: Vec<String>,
    #[serde(default = "yes")]
    pub propagate: bool,
}

/// Every privilege the simulated endpoints check.
pub const ALL_PRIVS: &[&str] = &[
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "Sys.Audit",
    "Sys.Modify",
    "Sys.Console",
    "Sys.PowerMgmt",
    "VM.Allocate",
    "VM.Audit",
    "VM.Backup",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Migrate",
    "VM.PowerMgmt",
    "VM.Replicate",
    "VM.Snapshot",
];

impl Cluster {
    fn role_privs(&self, role: &str) -> Vec<String> {
        match role {
            "Administrator" => ALL_PRIVS.iter().map(|p| p.to_string()).collect(),
            "PVEAuditor" => ["Datastore.Audit", "Sys.Audit", "VM.Audit"]
                .map(String::from)
                .to_vec(),
            "NoAccess" => Vec::new(),
            other => self.roles.get(other).cloned().unwrap_or_default(),
        }
    }

    /// Privileges `subject` (a user or token id, as ACLs name it) holds on
    /// `path` from ACL entries on it or, propagated, on its ancestors.
    fn acl_privs(&self, subject: &str, is_token: bool, path: &str) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.acl {
            let names = if is_token { &e.tokens } else { &e.users };
            if !names.iter().any(|n| n == subject) {
                continue;
            }
            let applies = e.path == path
                || (e.propagate
                    && (e.path == "/"
                        || path.starts_with(&format!("{}/", e.path.trim_end_matches('/')))));
            if applies {
                for r in &e.roles {
                    out.extend(self.role_privs(r));
                }
            }
        }
        out
    }

    /// Whether `caller` holds `privilege` on `path`.
    pub fn has_priv(&self, caller: &str, path: &str, privilege: &str) -> bool {
        if caller == "root@pam" {
            return true;
        }
        match caller.split_once('!') {
            None => self
                .acl_privs(caller, false, path)
                .iter()
                .any(|p| p == privilege),
            Some((user, token)) => {
                let privsep = self
                    .users
                    .iter()
                    .find(|u| u.userid == user)
                    .and_then(|u| u.tokens.iter().find(|t| t.name == token))
                    .is_none_or(|t| t.privsep);
                let user_has = user == "root@pam"
                    || self
                        .acl_privs(user, false, path)
                        .iter()
                        .any(|p| p == privilege);
                if !privsep {
                    return user_has;
                }
                user_has
                    && self
                        .acl_privs(caller, true, path)
                        .iter()
                        .any(|p| p == privilege)
            }
        }
    }

    /// The schema's `["perm", path, [privs], ("any", 1)?]` check.
    pub fn check(
        &self,
        caller: &str,
        path: &str,
        privs: &[&str],
        any: bool,
    ) -> Result<(), ApiError> {
        let ok = if any {
            privs.iter().any(|p| self.has_priv(caller, path, p))
        } else {
            privs.iter().all(|p| self.has_priv(caller, path, p))
        };
        if ok {
            Ok(())
        } else if any {
            Err(ApiError::forbidden(path, &privs.join("|")))
        } else {
            let missing = privs
                .iter()
                .find(|p| !self.has_priv(caller, path, p))
                .copied()
                .unwrap_or_default();
            Err(ApiError::forbidden(path, missing))
        }
    }

    pub fn token_identity(&self, tokenid: &str, secret: &str) -> Option<String> {
        let (userid, name) = tokenid.split_once('!')?;
        let user = self.users.iter().find(|u| u.userid == userid)?;
        user.tokens
            .iter()
            .find(|t| t.name == name && t.secret == secret)
            .map(|_| tokenid.to_string())
    }

    pub fn password_ok(&self, userid: &str, password: &str) -> bool {
        self.users
            .iter()
            .any(|u| u.userid == userid && u.password.as_deref() == Some(password))
    }
}
