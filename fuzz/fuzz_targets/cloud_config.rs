//! The cloud config: any text is parsed or refused with a message, never a
//! panic; a secret never shows in the refusal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxmox_csi_controller::config::CloudConfig;

/// The values given to the secret keys, as YAML scalars on their line.
fn secrets(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.trim().trim_start_matches("- ");
            ["token_secret", "password"]
                .contains(&k)
                .then(|| v.trim().trim_matches(['"', '\'']))
        })
        // Short values can stand in any message by chance ("x", "ok"), and
        // a value also written elsewhere (as the url, say) may be quoted
        // for that other key.
        .filter(|v| v.len() >= 8 && text.matches(*v).count() == 1)
        // Plain tokens, which another token of their length replaces without
        // changing the document's structure.
        .filter(|v| {
            v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .collect()
}

fuzz_target!(|text: &str| {
    if let Err(e) = CloudConfig::parse(text) {
        let message = e.to_string();
        assert!(!message.is_empty());
        for s in secrets(text) {
            // The secret shows because it was given, not because the
            // message holds those words anyway: with another value of the
            // same length in its place, they are gone.
            let other = CloudConfig::parse(&text.replace(s, &"Q".repeat(s.len())))
                .err()
                .map(|e| e.to_string());
            let caused = other.is_some_and(|o| !o.contains(s));
            assert!(
                !(message.contains(s) && caused),
                "the refusal shows a secret: {message}"
            );
        }
    }
});
