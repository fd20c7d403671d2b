//! The cloud config: any text is parsed or refused with a message, never a
//! panic; a secret never shows in the refusal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxmox_csi_controller::config::CloudConfig;

const SECRET_KEYS: [&str; 2] = ["token_secret", "password"];

/// The values given to the secret keys. In a document YAML can read, found
/// by YAML (a `token_secret:` line inside a quoted scalar is text of
/// another value, such as the url); otherwise as scalars on their line.
fn secrets(text: &str) -> Vec<String> {
    let given: Vec<String> = match serde_norway::from_str::<serde_norway::Value>(text) {
        Ok(doc) => {
            let mut found = Vec::new();
            walk(&doc, &mut found);
            found
        }
        Err(_) => text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                let k = k.trim().trim_start_matches("- ");
                SECRET_KEYS
                    .contains(&k)
                    .then(|| v.trim().trim_matches(['"', '\'']).to_string())
            })
            .collect(),
    };
    given
        .into_iter()
        // Short values can stand in any message by chance ("x", "ok"), and
        // a value also written elsewhere (as the url, say) may be quoted
        // for that other key.
        .filter(|v| v.len() >= 8 && text.matches(v.as_str()).count() == 1)
        // Plain tokens, which another token of their length replaces without
        // changing the document's structure.
        .filter(|v| {
            v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .collect()
}

/// The string values under a secret key anywhere in `v`.
fn walk(v: &serde_norway::Value, found: &mut Vec<String>) {
    match v {
        serde_norway::Value::Mapping(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    (Some(k), serde_norway::Value::String(s)) if SECRET_KEYS.contains(&k) => {
                        found.push(s.clone())
                    }
                    _ => walk(v, found),
                }
            }
        }
        serde_norway::Value::Sequence(items) => items.iter().for_each(|i| walk(i, found)),
        _ => {}
    }
}

fuzz_target!(|text: &str| {
    if let Err(e) = CloudConfig::parse(text) {
        let message = e.to_string();
        assert!(!message.is_empty());
        for s in secrets(text) {
            // The secret shows because it was given, not because the
            // message holds those words anyway: with another value of the
            // same length in its place, they are gone.
            let other = CloudConfig::parse(&text.replace(&s, &"Q".repeat(s.len())))
                .err()
                .map(|e| e.to_string());
            let caused = other.is_some_and(|o| !o.contains(&s));
            assert!(
                !(message.contains(&s) && caused),
                "the refusal shows a secret: {message}"
            );
        }
    }
});
