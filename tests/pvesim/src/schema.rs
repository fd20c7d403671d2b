//! Proxmox's own API schema (the `schema-subset.json` extracted from
//! pve-docs): request parameters are checked against it exactly as
//! pve-http-server does, with the same texts, and tests check that every
//! answer has the documented shape.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use regex::Regex;
use serde_json::Value;

use crate::reply::ApiError;

#[derive(Debug)]
pub struct Schema {
    /// path template → method → the schema's info object.
    endpoints: BTreeMap<String, BTreeMap<String, Value>>,
}

/// Where the schema lives in a checkout: `../shared/pve-api/` beside the repository.
pub fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/pve-api/schema-subset.json")
}

impl Schema {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("reading the Proxmox API schema {}: {e}", path.display())
        })?;
        let v: Value = serde_json::from_str(&text)?;
        let mut endpoints = BTreeMap::new();
        if let Some(map) = v.get("endpoints").and_then(Value::as_object) {
            for (path, methods) in map {
                let mut m = BTreeMap::new();
                if let Some(obj) = methods.as_object() {
                    for (method, info) in obj {
                        m.insert(method.clone(), info.clone());
                    }
                }
                endpoints.insert(path.clone(), m);
            }
        }
        Ok(Self { endpoints })
    }

    pub fn info(&self, template: &str, method: &str) -> Option<&Value> {
        self.endpoints.get(template)?.get(method)
    }

    pub fn templates(&self) -> impl Iterator<Item = (&String, &BTreeMap<String, Value>)> {
        self.endpoints.iter()
    }

    /// Checks request parameters (path placeholders included) the way
    /// pve-http-server does; every problem is reported on its key.
    pub fn validate(
        &self,
        template: &str,
        method: &str,
        params: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        let Some(info) = self.info(template, method) else {
            return Ok(());
        };
        let Some(props) = info
            .pointer("/parameters/properties")
            .and_then(Value::as_object)
        else {
            return Ok(());
        };
        let additional = info
            .pointer("/parameters/additionalProperties")
            .is_some_and(|v| v.as_i64() == Some(1) || v.as_bool() == Some(true));
        let mut errors: BTreeMap<String, String> = BTreeMap::new();
        for (key, value) in params {
            match lookup(props, key) {
                Some(schema) => {
                    if let Err(e) = check_value(key, schema, value) {
                        errors.insert(key.clone(), e);
                    }
                }
                None if additional => {}
                None => {
                    errors.insert(
                        key.clone(),
                        "property is not defined in schema and the schema does not allow additional properties"
                            .into(),
                    );
                }
            }
        }
        for (key, schema) in props {
            let optional = schema.get("optional").is_some_and(truthy);
            if !optional && !key.contains("[n]") && !params.contains_key(key) {
                errors.insert(
                    key.clone(),
                    "property is missing and it is not optional".into(),
                );
            }
            if let Some(req) = schema.get("requires").and_then(Value::as_str)
                && params.contains_key(key)
                && !params.contains_key(req)
            {
                errors.insert(
                    req.to_string(),
                    format!("missing property required by '{key}'"),
                );
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::params(errors))
        }
    }

    /// Whether `key` is a parameter of the endpoint (`scsi1` matching `scsi[n]`).
    pub fn has_param(&self, template: &str, method: &str, key: &str) -> bool {
        self.info(template, method)
            .and_then(|i| i.pointer("/parameters/properties"))
            .and_then(Value::as_object)
            .is_some_and(|props| lookup(props, key).is_some())
    }

    /// Checks an answer against the documented return schema. For tests.
    pub fn check_return(&self, template: &str, method: &str, value: &Value) -> Result<(), String> {
        let info = self
            .info(template, method)
            .ok_or_else(|| format!("{method} {template} is not in the schema"))?;
        match info.get("returns") {
            Some(r) => check_shape("data", r, value),
            None => Ok(()),
        }
    }
}

fn truthy(v: &Value) -> bool {
    v.as_i64() == Some(1) || v.as_bool() == Some(true)
}

/// `scsi1` is described as `scsi[n]`; the index range is in the description
/// ("n is 0 to 30").
fn lookup<'a>(props: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    if let Some(s) = props.get(key) {
        return Some(s);
    }
    let base = key.trim_end_matches(|c: char| c.is_ascii_digit());
    if base.len() == key.len() || base.is_empty() {
        return None;
    }
    let index: u32 = key[base.len()..].parse().ok()?;
    let schema = props.get(&format!("{base}[n]"))?;
    let desc = schema
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let range = Regex::new(r"n is (\d+) to (\d+)").ok()?;
    if let Some(c) = range.captures(desc) {
        let lo: u32 = c[1].parse().ok()?;
        let hi: u32 = c[2].parse().ok()?;
        if index < lo || index > hi {
            return None;
        }
    }
    Some(schema)
}

/// Perl regexes of the schema, made into anchored Rust ones.
fn perl_regex(pattern: &str) -> Option<Regex> {
    let mut p = pattern.to_string();
    if let Some(inner) = p.strip_prefix("(?^:").and_then(|s| s.strip_suffix(')')) {
        p = inner.to_string();
    }
    let p = Regex::new(r"\{,(\d+)\}")
        .ok()?
        .replace_all(&p, "{0,$1}")
        .into_owned();
    Regex::new(&format!("^(?:{p})$")).ok()
}

pub fn check_value(key: &str, schema: &Value, value: &str) -> Result<(), String> {
    check(key, schema, value, false)
}

/// `in_property_string`: booleans there may also be on/off/yes/no/true/false.
fn check(key: &str, schema: &Value, value: &str, in_property_string: bool) -> Result<(), String> {
    let ty = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("string");
    match ty {
        "boolean" => {
            let lenient = ["on", "off", "yes", "no", "true", "false"];
            if !(matches!(value, "0" | "1") || (in_property_string && lenient.contains(&value))) {
                return Err(format!("type check ('boolean') failed - got '{value}'"));
            }
        }
        "integer" => {
            let ok = Regex::new(r"^[+-]?\d+$")
                .map(|r| r.is_match(value))
                .unwrap_or(false);
            if !ok {
                return Err(format!("type check ('integer') failed - got '{value}'"));
            }
            let n: f64 = value.parse().unwrap_or(0.0);
            range(schema, n)?;
        }
        "number" => {
            let n: f64 = value
                .parse()
                .map_err(|_| format!("type check ('number') failed - got '{value}'"))?;
            range(schema, n)?;
        }
        _ => {
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && value.len() as u64 > max
            {
                return Err(format!("value may only be {max} characters long"));
            }
            if let Some(e) = schema.get("enum").and_then(Value::as_array) {
                let allowed: Vec<&str> = e.iter().filter_map(Value::as_str).collect();
                if !allowed.contains(&value) {
                    return Err(format!(
                        "value '{value}' does not have a value in the enumeration '{}'",
                        allowed.join(", ")
                    ));
                }
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str)
                && perl_regex(p).is_some_and(|r| !r.is_match(value))
            {
                return Err("value does not match the regex pattern".into());
            }
            if let Some(format) = schema.get("format").and_then(Value::as_object) {
                check_property_string(key, format, value)?;
            }
        }
    }
    Ok(())
}

fn range(schema: &Value, n: f64) -> Result<(), String> {
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
        && n < min
    {
        return Err(format!("value must have a minimum value of {min}"));
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
        && n > max
    {
        return Err(format!("value must have a maximum value of {max}"));
    }
    Ok(())
}

/// A property string (`vol,key=value,…`) against its format object.
fn check_property_string(
    key: &str,
    format: &serde_json::Map<String, Value>,
    value: &str,
) -> Result<(), String> {
    let default_key = format
        .iter()
        .find(|(_, v)| v.get("default_key").is_some_and(truthy))
        .map(|(k, _)| k.clone());
    let mut seen = std::collections::BTreeSet::new();
    for part in value.split(',') {
        let (k, v) = match part.split_once('=') {
            Some((k, v)) => (k.to_string(), v),
            None => match &default_key {
                Some(d) => (d.clone(), part),
                None => return Err("invalid format - value without key, but schema does not define a default key\n".to_string()),
            },
        };
        let mut sub = format.get(&k).ok_or_else(|| {
            format!("invalid format - invalid key in comma-separated list property: {k}\n")
        })?;
        let mut name = k.clone();
        if let Some(alias) = sub.get("alias").and_then(Value::as_str) {
            name = alias.to_string();
            sub = format.get(alias).unwrap_or(sub);
        }
        if !seen.insert(name.clone()) {
            return Err(format!(
                "invalid format - duplicate key in comma-separated list property: {name}\n"
            ));
        }
        check(&name, sub, v, true)
            .map_err(|e| format!("invalid format - format error\n{key}.{name}: {e}\n"))?;
    }
    Ok(())
}

fn check_shape(at: &str, schema: &Value, value: &Value) -> Result<(), String> {
    let ty = schema.get("type").and_then(Value::as_str);
    let optional = schema.get("optional").is_some_and(truthy);
    if value.is_null() {
        return if ty == Some("null") || optional || ty.is_none() {
            Ok(())
        } else {
            Err(format!("{at}: null where {ty:?} is documented"))
        };
    }
    let ok = match ty {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        // Perl booleans come out as 0/1.
        Some("boolean") => value.as_i64().is_some_and(|v| v == 0 || v == 1),
        Some("null") => false,
        _ => true,
    };
    if !ok {
        return Err(format!(
            "{at}: {value} is not of type {}",
            ty.unwrap_or("?")
        ));
    }
    if let (Some(props), Some(obj)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object(),
    ) {
        for (k, s) in props {
            match obj.get(k) {
                Some(v) => check_shape(&format!("{at}.{k}"), s, v)?,
                None if s.get("optional").is_some_and(truthy) => {}
                None => return Err(format!("{at}: property {k} is missing")),
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            check_shape(&format!("{at}[{i}]"), items, v)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perl_patterns_become_anchored_rust_regexes() {
        let r = perl_regex("(?^:^(0x)[0-9a-fA-F]{16})").unwrap();
        assert!(r.is_match("0x5000c500a1b2c3d4"));
        assert!(!r.is_match("0x5000c500a1b2c3d4ff"));
        let r = perl_regex("[A-Za-z0-9\\-_\\s]{,8}").unwrap();
        assert!(r.is_match("QEMU"));
        assert!(!r.is_match("TOOLONGVENDOR"));
    }
}
