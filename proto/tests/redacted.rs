//! No message that carries a secret prints it through Debug.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use proxmox_csi_proto::csi::v1 as csi;
use proxmox_csi_proto::hostd::v1 as hostd;

#[test]
fn secret_carrying_messages_print_no_secret() {
    let secrets = std::collections::HashMap::from([(
        "encryption-passphrase".to_string(),
        "hunter2-passphrase".to_string(),
    )]);
    let stage = csi::NodeStageVolumeRequest {
        volume_id: "v".into(),
        secrets: secrets.clone(),
        ..Default::default()
    };
    let create = csi::CreateVolumeRequest {
        name: "pvc-1".into(),
        secrets,
        ..Default::default()
    };
    let enc = hostd::Encryption {
        passphrase: b"hunter2-passphrase".to_vec(),
    };
    let req = hostd::StageRequest {
        encryption: Some(enc.clone()),
        ..Default::default()
    };
    for printed in [
        format!("{stage:?}"),
        format!("{create:?}"),
        format!("{enc:?}"),
        format!("{req:?}"),
    ] {
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(
            !printed.contains(&format!("{:?}", b"hunter2-passphrase".to_vec())),
            "{printed}"
        );
        assert!(printed.contains("redacted"), "{printed}");
    }
}

/// Every message of csi.proto with a `secrets` field is in build.rs's list.
#[test]
fn every_message_with_secrets_is_redacted() {
    let proto = std::fs::read_to_string(proxmox_csi_proto::CSI_PROTO_PATH).unwrap();
    let build = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/build.rs")).unwrap();
    let mut message = "";
    let mut with_secrets = Vec::new();
    for line in proto.lines() {
        if let Some(rest) = line.strip_prefix("message ") {
            message = rest.trim_end_matches(" {").trim();
        }
        if line
            .trim_start()
            .starts_with("map<string, string> secrets = ")
        {
            with_secrets.push(message.to_string());
        }
    }
    assert!(with_secrets.len() >= 19, "{with_secrets:?}");
    for m in with_secrets {
        assert!(
            build.contains(&format!("\".csi.v1.{m}\"")),
            "{m} carries secrets but is not redacted"
        );
    }
}
