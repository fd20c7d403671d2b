//! The simulated cluster, loaded from a YAML state file.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// What `GET /version` reports.
    #[serde(default = "default_version")]
    pub version: String,
    #[serde(default)]
    pub users: Vec<User>,
}

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
}

fn default_cluster() -> String {
    "pvesim".into()
}

fn default_version() -> String {
    "9.0.3".into()
}

impl Default for State {
    fn default() -> Self {
        Self {
            cluster: default_cluster(),
            version: default_version(),
            users: Vec::new(),
        }
    }
}

impl State {
    pub fn from_yaml(text: &str) -> Result<Self, serde_norway::Error> {
        serde_norway::from_str(text)
    }

    /// A user's token whose secret matches, as `user@realm!name`.
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
