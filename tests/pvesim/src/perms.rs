//! Roles and the privilege checks of pve-access-control over the users,
//! tokens and ACLs of `users`: `Permission check failed (<path>, <Priv>)`.

use crate::reply::ApiError;
use crate::state::Cluster;

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
    /// `path`. Proxmox walks from `/` down to `path`; at each level where an
    /// entry of the subject applies (on `path` itself, or propagated from an
    /// ancestor) its roles replace everything inherited: a narrower ACL
    /// narrows (pve-access-control src/PVE/AccessControl.pm roles: `$roles =
    /// $new; # overwrite previous settings`). NoAccess among the roles left
    /// means none (`return { 'NoAccess' => … }`).
    fn acl_privs(&self, subject: &str, is_token: bool, path: &str) -> Vec<String> {
        let mut levels = vec!["/".to_string()];
        let mut at = String::new();
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            at.push('/');
            at.push_str(seg);
            levels.push(at.clone());
        }
        let mut roles: Vec<&String> = Vec::new();
        let depth = levels.len();
        for (i, level) in levels.iter().enumerate() {
            let last = i + 1 == depth;
            let here: Vec<&String> = self
                .acl
                .iter()
                .filter(|e| e.path.trim_end_matches('/') == level.trim_end_matches('/'))
                .filter(|e| {
                    let names = if is_token { &e.tokens } else { &e.users };
                    names.iter().any(|n| n == subject)
                })
                .filter(|e| last || e.propagate)
                .flat_map(|e| e.roles.iter())
                .collect();
            if !here.is_empty() {
                roles = here;
            }
        }
        if roles.iter().any(|r| *r == "NoAccess") {
            return Vec::new();
        }
        roles.iter().flat_map(|r| self.role_privs(r)).collect()
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

    /// pve-guest-common src/PVE/GuestHelpers.pm assert_tag_permissions:
    /// VM.Config.Options on the VM, then each tag whose count changes
    /// between `old` and `new` must be allowed (get_allowed_tags), unless
    /// the caller holds Sys.Modify on `/`.
    pub fn assert_tag_permissions(
        &self,
        caller: &str,
        vmid: u32,
        old: &str,
        new: &str,
    ) -> Result<(), ApiError> {
        self.check(
            caller,
            &format!("/vms/{vmid}"),
            &["VM.Config.Options"],
            false,
        )?;
        if self.has_priv(caller, "/", "Sys.Modify") {
            return Ok(());
        }
        let count = |list: &str| {
            let mut m = std::collections::BTreeMap::<String, u32>::new();
            for t in split_list(list) {
                *m.entry(t).or_default() += 1;
            }
            m
        };
        let (old, new) = (count(old), count(new));
        let (allowed, freeform) = self.allowed_tags(caller);
        for tag in old.keys().chain(new.keys()) {
            if old.get(tag) == new.get(tag) {
                continue;
            }
            if (!allowed.contains(tag) && !freeform) || self.registered_tags.contains(tag) {
                return Err(ApiError::forbidden(
                    "/",
                    &format!("Sys.Modify for modifying tag '{tag}'"),
                ));
            }
        }
        Ok(())
    }

    /// GuestHelpers.pm get_allowed_tags for a caller without Sys.Modify on
    /// `/`: the allow-list (unless `none`), the tags of the guests it may
    /// audit (`existing`, `free`), less the registered tags; and whether
    /// any tag goes (`free`).
    pub fn allowed_tags(&self, caller: &str) -> (std::collections::BTreeSet<String>, bool) {
        let access = self
            .user_tag_access
            .clone()
            .unwrap_or(crate::state::TagAccess {
                user_allow: "free".into(),
                user_allow_list: Vec::new(),
            });
        let mut allowed = std::collections::BTreeSet::new();
        if access.user_allow != "none" {
            allowed.extend(access.user_allow_list.iter().cloned());
        }
        if matches!(access.user_allow.as_str(), "free" | "existing") {
            for vm in self.vms.values() {
                if self.has_priv(caller, &format!("/vms/{}", vm.vmid), "VM.Audit")
                    && let Some(tags) = vm.config.get("tags")
                {
                    allowed.extend(split_list(tags));
                }
            }
        }
        for t in &self.registered_tags {
            allowed.remove(t);
        }
        (allowed, access.user_allow == "free")
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

/// pve-common src/PVE/ParseUtils.pm split_list: `,` `;` and blanks separate.
fn split_list(list: &str) -> Vec<String> {
    list.split([',', ';', ' ', '\t', '\n'])
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect()
}
