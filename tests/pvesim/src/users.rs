//! Users, API tokens and ACL entries as the state file declares them and
//! the cluster keeps them; `perms` checks privileges against them.

use serde::{Deserialize, Serialize};

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
