//! The cloud config file, compatible with the Go driver's
//! (`clusters[]` + `features`), parsed once into trusted types.
//!
//! Every validation error names the cluster entry (`cluster #N`, counted from
//! zero like the Go driver) and the key at fault.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proxmox_csi_common::Secret;
use serde::Deserialize;
use url::Url;

/// Default owner VMID of unattached disks (`vm-9999-…`), as in the Go driver.
pub const DEFAULT_CONTROLLER_VMID: u32 = 9999;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading cloud config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The YAML parser's message with the document's values taken out (they
    /// may be secrets), so the parser's error is not kept as a source.
    #[error("invalid cloud config: {0}")]
    Syntax(String),
    #[error("cloud config: clusters not found: add at least one entry under `clusters:`")]
    NoClusters,
    #[error("cluster #{index}: {key}: {reason}")]
    Cluster {
        index: usize,
        key: &'static str,
        reason: String,
    },
    #[error("features.{key}: {reason}")]
    Feature { key: &'static str, reason: String },
}

/// How the controller authenticates to one Proxmox cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `PVEAPIToken=<token_id>=<secret>`.
    Token { id: String, secret: Secret<String> },
    /// Ticket login; needed only where Proxmox reserves an operation for root@pam.
    Password {
        username: String,
        password: Secret<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// API base, always ending in `/api2/json`.
    pub url: Url,
    pub insecure: bool,
    pub credentials: Credentials,
    pub region: String,
    /// PEM bundle of the CAs that sign the cluster's certificate.
    pub ca_file: Option<PathBuf>,
    /// Proxmox nodes volumes may be placed on; empty means all.
    pub allowed_nodes: Vec<String>,
    /// Storages volumes may be created on; empty means all.
    pub allowed_storages: Vec<String>,
}

impl Cluster {
    pub fn node_allowed(&self, node: &str) -> bool {
        self.allowed_nodes.is_empty() || self.allowed_nodes.iter().any(|n| n == node)
    }

    pub fn storage_allowed(&self, storage: &str) -> bool {
        self.allowed_storages.is_empty() || self.allowed_storages.iter().any(|s| s == storage)
    }
}

/// How a Kubernetes node is matched to a VM (`features.provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Provider {
    #[default]
    Default,
    Capmox,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfig {
    pub clusters: Vec<Cluster>,
    pub provider: Provider,
    pub controller_vmid: u32,
    /// Where the controller's own VMs (holders, copy VMs) take their VMIDs.
    pub vmid_range: VmidRange,
    /// Keys present in the file that this driver does not read, for a warning.
    pub ignored_keys: Vec<String>,
    /// `features.controllerVMID`, the spelling the Go driver's docs show and
    /// its parser never matched: kept only for the warning.
    pub unread_controller_vmid: Option<i64>,
}

#[derive(Deserialize, Default)]
struct RawConfig {
    #[serde(default)]
    features: RawFeatures,
    #[serde(default)]
    clusters: Option<Vec<RawCluster>>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_norway::Value>,
}

#[derive(Deserialize, Default)]
struct RawFeatures {
    provider: Option<String>,
    #[serde(rename = "controllerVmID")]
    controller_vmid: Option<i64>,
    #[serde(rename = "controllerVMID")]
    controller_vmid_doc: Option<i64>,
    #[serde(rename = "vmIDRange")]
    vmid_range: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_norway::Value>,
}

#[derive(Deserialize, Default)]
struct RawCluster {
    url: Option<String>,
    #[serde(default, deserialize_with = "yaml11_bool")]
    insecure: bool,
    token_id: Option<String>,
    token_id_file: Option<PathBuf>,
    token_secret: Option<Secret<String>>,
    token_secret_file: Option<PathBuf>,
    username: Option<String>,
    password: Option<Secret<String>>,
    password_file: Option<PathBuf>,
    region: Option<String>,
    ca_file: Option<PathBuf>,
    #[serde(default)]
    allowed_nodes: Vec<String>,
    #[serde(default)]
    allowed_storages: Vec<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_norway::Value>,
}

impl CloudConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// What the configuration leaves open, for a warning at start: the API
    /// token over plain HTTP, a certificate nobody checks.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in &self.clusters {
            if c.url.scheme() == "http" {
                out.push(format!(
                    "cluster {}: url {} is plain HTTP: the API credentials cross the network unencrypted; use https://",
                    c.region, c.url
                ));
            }
            if c.insecure && c.url.scheme() == "https" {
                out.push(format!(
                    "cluster {}: insecure: true: the server's certificate is not checked, anyone in the path can take the credentials; set ca_file instead",
                    c.region
                ));
            }
        }
        if let Some(v) = self.unread_controller_vmid {
            out.push(format!(
                "features.controllerVMID: {v} is not read: the Go driver's parser never matched this \
                 spelling (gopkg.in/yaml.v3 compares keys exactly), so its disks are under {}; \
                 disks stay there. Write controllerVmID to change the owner VMID",
                self.controller_vmid
            ));
        }
        out
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_norway::from_str(text)
                .map_err(|e| ConfigError::Syntax(without_values(&e.to_string())))?
        };
        let mut ignored_keys: Vec<String> = raw.other.keys().cloned().collect();
        ignored_keys.extend(raw.features.other.keys().map(|k| format!("features.{k}")));

        let provider = match raw.features.provider.as_deref() {
            None | Some("") | Some("default") => Provider::Default,
            Some("capmox") => Provider::Capmox,
            // Go's Provider is a free string; anything but capmox behaves as
            // default there (pkg/config/config.go), and its chart suggests
            // `proxmox`: the same here, with a warning, not a crash loop.
            Some(other) => {
                tracing::warn!(
                    provider = other,
                    "features.provider is neither default nor capmox; using default, as the Go driver does"
                );
                Provider::Default
            }
        };
        let controller_vmid = controller_vmid(&raw.features)?;
        let vmid_range = match raw.features.vmid_range.as_deref() {
            None => VmidRange::above(controller_vmid),
            Some(text) => {
                VmidRange::parse(text, controller_vmid).map_err(|reason| ConfigError::Feature {
                    key: "vmIDRange",
                    reason,
                })?
            }
        };

        let raw_clusters = raw.clusters.unwrap_or_default();
        if raw_clusters.is_empty() {
            return Err(ConfigError::NoClusters);
        }
        let mut clusters: Vec<Cluster> = Vec::with_capacity(raw_clusters.len());
        for (index, rc) in raw_clusters.into_iter().enumerate() {
            ignored_keys.extend(rc.other.keys().map(|k| format!("clusters[{index}].{k}")));
            let cluster = parse_cluster(index, rc, &mut ignored_keys)?;
            if let Some(first) = clusters.iter().position(|c| c.region == cluster.region) {
                return Err(ConfigError::Cluster {
                    index,
                    key: "region",
                    reason: format!(
                        "region {:?} is already used by cluster #{first}; regions name clusters and must be unique",
                        cluster.region
                    ),
                });
            }
            clusters.push(cluster);
        }
        Ok(Self {
            clusters,
            provider,
            controller_vmid,
            vmid_range,
            ignored_keys,
            unread_controller_vmid: raw.features.controller_vmid_doc,
        })
    }

    pub fn vmids(&self) -> VmIds {
        VmIds {
            controller: self.controller_vmid,
            range: self.vmid_range,
        }
    }

    pub fn cluster(&self, region: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.region == region)
    }
}

/// The VMIDs the controller's own VMs take (`features.vmIDRange`,
/// `LOW-HIGH`): by default every id above `controllerVmID`, where the Go
/// driver's replication holders start (proxmox-csi-plugin pkg/csi/utils.go
/// prepareReplication: `GetNextID(vmID+1)`), so that sites with fixed VMID
/// ranges (Terraform, Cluster API) keep them free of the driver's VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmidRange {
    pub low: u32,
    pub high: u32,
}

/// The VMIDs the driver uses: the placeholder that owns its disks and
/// must have no VM, and the range its own VMs take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmIds {
    pub controller: u32,
    pub range: VmidRange,
}

impl VmIds {
    /// `controller` with the default range above it.
    pub fn new(controller: u32) -> Self {
        Self {
            controller,
            range: VmidRange::above(controller),
        }
    }
}

/// The largest VMID Proxmox accepts (pve-common JSONSchema.pm `pve-vmid`).
pub const MAX_VMID: u32 = 999_999_999;

impl VmidRange {
    pub fn above(controller_vmid: u32) -> Self {
        Self {
            low: controller_vmid.saturating_add(1).min(MAX_VMID),
            high: MAX_VMID,
        }
    }

    pub fn parse(text: &str, controller_vmid: u32) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a VMID range: write LOW-HIGH, e.g. 10000-10999");
        let (low, high) = text.trim().split_once('-').ok_or_else(bad)?;
        let low: u32 = low.trim().parse().map_err(|_| bad())?;
        let high: u32 = high.trim().parse().map_err(|_| bad())?;
        if !(100..=MAX_VMID).contains(&low) || !(100..=MAX_VMID).contains(&high) || low > high {
            return Err(format!(
                "{text:?}: both ends must be VMIDs (100 to {MAX_VMID}), the first not above the second"
            ));
        }
        if low == high && low == controller_vmid {
            return Err(format!(
                "{text:?} holds only controllerVmID {controller_vmid}, which owns the volumes and must have no VM"
            ));
        }
        Ok(Self { low, high })
    }

    pub fn contains(&self, vmid: u32) -> bool {
        (self.low..=self.high).contains(&vmid)
    }
}

impl std::fmt::Display for VmidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.low, self.high)
    }
}

/// A boolean as the Go driver's yaml.v3 reads one into a `bool` field:
/// YAML 1.2's true/false, and YAML 1.1's y/yes/on and n/no/off in their
/// three spellings (go-yaml/yaml v3 decode.go `unmarshal`, reflect.Bool:
/// "This offers some compatibility with the 1.1 spec").
fn yaml11_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bool(bool),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Bool(b) => Ok(b),
        Raw::Text(t) => match t.as_str() {
            "true" | "True" | "TRUE" | "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => {
                Ok(true)
            }
            "false" | "False" | "FALSE" | "n" | "N" | "no" | "No" | "NO" | "off" | "Off"
            | "OFF" => Ok(false),
            other => Err(serde::de::Error::custom(format!(
                "{other:?} is not a boolean: write true or false"
            ))),
        },
    }
}

/// The owner VMID of unattached disks: `controllerVmID`, as the Go driver
/// reads it (pkg/config/config.go ClustersFeatures, yaml tag
/// `controllerVmID`, default 9999); `controllerVMID` is not read there.
fn controller_vmid(f: &RawFeatures) -> Result<u32, ConfigError> {
    let Some(value) = f.controller_vmid else {
        return Ok(DEFAULT_CONTROLLER_VMID);
    };
    // Proxmox VMIDs run from 100 to 999999999; the Go driver demands more than 100.
    if !(101..=999_999_999).contains(&value) {
        return Err(ConfigError::Feature {
            key: "controllerVmID",
            reason: format!(
                "invalid VM ID {value}, must be greater than 100 and at most 999999999"
            ),
        });
    }
    Ok(value as u32)
}

/// One `clusters[]` entry; keys it leaves unread are added to `ignored`.
fn parse_cluster(
    index: usize,
    rc: RawCluster,
    ignored: &mut Vec<String>,
) -> Result<Cluster, ConfigError> {
    let err = |key: &'static str, reason: String| ConfigError::Cluster { index, key, reason };

    let url = match rc.url.as_deref().map(str::trim) {
        None | Some("") => return Err(err("url", "missing PVE API URL in cloud config".into())),
        Some(u) => parse_url(u).map_err(|reason| err("url", reason))?,
    };
    let region = match rc.region.as_deref().map(str::trim) {
        None | Some("") => {
            return Err(err("region", "missing PVE region in cloud config".into()));
        }
        Some(r) => r.to_string(),
    };

    let token_id = inline_or_file(index, "token_id", rc.token_id, rc.token_id_file)?;
    let token_secret = inline_or_file(
        index,
        "token_secret",
        rc.token_secret.map(|s| s.expose().clone()),
        rc.token_secret_file,
    )?;
    let password = inline_or_file(
        index,
        "password",
        rc.password.map(|s| s.expose().clone()),
        rc.password_file,
    )?;
    let username = rc.username.filter(|u| !u.trim().is_empty());

    let uses_token = token_id.is_some() || token_secret.is_some();
    // As the Go driver: only a username with a password counts as a login
    // (pkg/config/config.go ReadCloudConfig `hasUserAuth`); beside a token,
    // a lone one of them is left unread, and said so.
    let (username, password) = match (uses_token, &username, &password) {
        (true, Some(_), None) => {
            ignored.push(format!("clusters[{index}].username"));
            (None, None)
        }
        (true, None, Some(_)) => {
            ignored.push(format!("clusters[{index}].password"));
            (None, None)
        }
        _ => (username, password),
    };
    let uses_user = username.is_some() || password.is_some();
    let credentials = match (uses_token, uses_user) {
        (true, true) => {
            return Err(err(
                "token_id",
                "must specify one of user, token or file credentials, not multiple: \
                 use token_id/token_secret or username/password"
                    .into(),
            ));
        }
        (false, false) => {
            return Err(err(
                "token_id",
                "user, token or file credentials are required: set token_id and token_secret \
                 (or token_id_file and token_secret_file)"
                    .into(),
            ));
        }
        (true, false) => {
            let id = token_id.ok_or_else(|| {
                err(
                    "token_id",
                    "token_secret is set but token_id is missing".into(),
                )
            })?;
            let secret = token_secret.ok_or_else(|| {
                err(
                    "token_secret",
                    "token_id is set but token_secret is missing".into(),
                )
            })?;
            validate_token_id(&id).map_err(|r| err("token_id", r))?;
            Credentials::Token {
                id,
                secret: Secret::new(secret),
            }
        }
        (false, true) => {
            let username = username
                .ok_or_else(|| err("username", "password is set but username is missing".into()))?;
            let password = password
                .ok_or_else(|| err("password", "username is set but password is missing".into()))?;
            if !username.contains('@') {
                return Err(err(
                    "username",
                    format!("{username:?} has no realm; expected user@realm, e.g. root@pam"),
                ));
            }
            Credentials::Password {
                username,
                password: Secret::new(password),
            }
        }
    };

    if let Some(ca) = &rc.ca_file
        && !ca.is_file()
    {
        return Err(err(
            "ca_file",
            format!("{} is not a readable file", ca.display()),
        ));
    }

    Ok(Cluster {
        url,
        insecure: rc.insecure,
        credentials,
        region,
        ca_file: rc.ca_file,
        allowed_nodes: rc.allowed_nodes,
        allowed_storages: rc.allowed_storages,
    })
}

/// A YAML error's text with every quoted value replaced by `"…"`: serde
/// quotes what it could not take (`invalid type: string "…"`), and that may
/// be a secret, or the whole file.
fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let (mut quoted, mut escaped) = (false, false);
    for c in message.chars() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => {
                quoted = false;
                out.push_str("…\"");
            }
            (true, false, _) => {}
            (false, _, '"') => {
                quoted = true;
                out.push('"');
            }
            (false, _, c) => out.push(c),
        }
    }
    if quoted {
        out.push_str("…\"");
    }
    out
}

/// A value given inline or as `<key>_file` (whose content is trimmed), never both.
fn inline_or_file(
    index: usize,
    key: &'static str,
    inline: Option<String>,
    file: Option<PathBuf>,
) -> Result<Option<String>, ConfigError> {
    let err = |reason: String| ConfigError::Cluster { index, key, reason };
    let inline = inline.filter(|v| !v.is_empty());
    match (inline, file) {
        (Some(_), Some(_)) => Err(err(format!(
            "must specify one of user, token or file credentials, not multiple: \
             {key} and {key}_file are both set"
        ))),
        (Some(v), None) => Ok(Some(v)),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| err(format!("reading {key}_file {}: {e}", path.display())))?;
            let v = text.trim().to_string();
            if v.is_empty() {
                return Err(err(format!("{key}_file {} is empty", path.display())));
            }
            Ok(Some(v))
        }
        (None, None) => Ok(None),
    }
}

fn parse_url(raw: &str) -> Result<Url, String> {
    if !raw.starts_with("http") {
        return Err(format!("{raw:?} must start with http:// or https://"));
    }
    let mut url = Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{raw:?} must be http(s)://host[:port]/api2/json"));
    }
    let path = url.path().trim_end_matches('/').to_string();
    if path.is_empty() {
        url.set_path("/api2/json");
    } else if !path.ends_with("/api2/json") {
        return Err(format!(
            "{raw:?} must point at the API root, e.g. https://pve:8006/api2/json"
        ));
    } else {
        url.set_path(&path);
    }
    Ok(url)
}

fn validate_token_id(id: &str) -> Result<(), String> {
    // user@realm!tokenname
    let ok = id
        .split_once('!')
        .is_some_and(|(user, name)| user.contains('@') && !name.is_empty());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{id:?} is not a token id; expected user@realm!tokenname, e.g. kubernetes-csi@pve!csi"
        ))
    }
}

#[cfg(test)]
mod tests;
