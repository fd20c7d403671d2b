use super::*;

const GOOD: &str = r#"
features:
  provider: default
  controllerVmID: 9998
clusters:
  - url: https://pve1:8006/api2/json
    insecure: true
    token_id: "kubernetes-csi@pve!csi"
    token_secret: "s3cr3t-token"
    region: Region-1
  - url: https://pve2:8006
    username: root@pam
    password: "pw"
    region: Region-2
"#;

#[test]
fn parses_the_go_driver_format() {
    let c = CloudConfig::parse(GOOD).unwrap();
    assert_eq!(c.controller_vmid, 9998);
    assert_eq!(c.provider, Provider::Default);
    assert_eq!(c.clusters.len(), 2);
    assert_eq!(c.clusters[0].url.as_str(), "https://pve1:8006/api2/json");
    assert!(c.clusters[0].insecure);
    assert_eq!(
        c.clusters[0].credentials,
        Credentials::Token {
            id: "kubernetes-csi@pve!csi".into(),
            secret: Secret::new("s3cr3t-token".into())
        }
    );
    // A bare host gets the API root appended.
    assert_eq!(c.clusters[1].url.as_str(), "https://pve2:8006/api2/json");
    assert!(matches!(
        c.clusters[1].credentials,
        Credentials::Password { .. }
    ));
    assert!(c.ignored_keys.is_empty());
}

#[test]
fn secrets_do_not_print() {
    let c = CloudConfig::parse(GOOD).unwrap();
    let dump = format!("{c:?}");
    assert!(!dump.contains("s3cr3t-token"), "{dump}");
    assert!(!dump.contains("\"pw\""), "{dump}");
}

#[test]
fn the_go_docs_controller_vmid_spelling_is_not_read_as_go_never_read_it() {
    // A Go-era config (the Go driver's docs/config.md spelling): the Go
    // driver's disks are under 9999, and stay owned by it here.
    let c = CloudConfig::parse(&GOOD.replace("controllerVmID", "controllerVMID")).unwrap();
    assert_eq!(c.controller_vmid, DEFAULT_CONTROLLER_VMID);
    assert_eq!(c.vmids().range.low, DEFAULT_CONTROLLER_VMID + 1);
    let w = c.warnings().join("\n");
    assert!(
        w.contains("features.controllerVMID: 9998 is not read") && w.contains("under 9999"),
        "{w}"
    );
    let both = GOOD.replace(
        "  controllerVmID: 9998\n",
        "  controllerVmID: 9998\n  controllerVMID: 2000\n",
    );
    assert_eq!(CloudConfig::parse(&both).unwrap().controller_vmid, 9998);
    let c = CloudConfig::parse(&GOOD.replace("  controllerVmID: 9998\n", "")).unwrap();
    assert_eq!(c.controller_vmid, DEFAULT_CONTROLLER_VMID);
}

#[test]
fn reads_and_trims_file_credentials() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("id"), "csi@pve!k8s\n").unwrap();
    std::fs::write(dir.path().join("secret"), "  abc \n").unwrap();
    let text = format!(
        "clusters:\n  - url: http://h/api2/json\n    region: r\n    token_id_file: {0}/id\n    token_secret_file: {0}/secret\n",
        dir.path().display()
    );
    let c = CloudConfig::parse(&text).unwrap();
    assert_eq!(
        c.clusters[0].credentials,
        Credentials::Token {
            id: "csi@pve!k8s".into(),
            secret: Secret::new("abc".into())
        }
    );
}

fn error_of(yaml: &str) -> String {
    CloudConfig::parse(yaml).unwrap_err().to_string()
}

#[test]
fn every_error_names_the_entry_and_the_key() {
    let base = "clusters:\n  - url: https://a/api2/json\n    token_id: u@pve!t\n    token_secret: x\n    region: r1\n";
    let cases: &[(&str, &str)] = &[
        (
            "  - token_id: u@pve!t\n    token_secret: x\n    region: r2\n",
            "cluster #1: url: missing PVE API URL",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: u@pve!t\n    token_secret: x\n",
            "cluster #1: region: missing PVE region",
        ),
        (
            "  - url: ftp://b\n    token_id: u@pve!t\n    token_secret: x\n    region: r2\n",
            "cluster #1: url: \"ftp://b\" must start with http",
        ),
        (
            "  - url: https://b/api2/json\n    region: r2\n",
            "cluster #1: token_id: user, token or file credentials are required",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: u@pve!t\n    token_secret: x\n    username: root@pam\n    password: p\n    region: r2\n",
            "cluster #1: token_id: must specify one of user, token or file credentials, not multiple",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: u@pve!t\n    token_secret: x\n    token_secret_file: /etc/hostname\n    region: r2\n",
            "cluster #1: token_secret: must specify one of user, token or file credentials, not multiple",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: u@pve!t\n    region: r2\n",
            "cluster #1: token_secret: token_id is set but token_secret is missing",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: justaname\n    token_secret: x\n    region: r2\n",
            "cluster #1: token_id: \"justaname\" is not a token id",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: u@pve!t\n    token_secret: x\n    region: r1\n",
            "cluster #1: region: region \"r1\" is already used by cluster #0",
        ),
        (
            "  - url: https://b/api2/json\n    username: root\n    password: p\n    region: r2\n",
            "cluster #1: username: \"root\" has no realm",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: u@pve!t\n    token_secret_file: /nonexistent/secret\n    region: r2\n",
            "cluster #1: token_secret: reading token_secret_file /nonexistent/secret",
        ),
        (
            "  - url: https://b/api2/json\n    token_id: u@pve!t\n    token_secret: x\n    region: r2\n    ca_file: /nonexistent/ca.pem\n",
            "cluster #1: ca_file: /nonexistent/ca.pem is not a readable file",
        ),
    ];
    for (entry, want) in cases {
        let got = error_of(&format!("{base}{entry}"));
        assert!(got.starts_with(want), "want {want:?}\n got {got:?}");
    }
}

#[test]
fn rejects_bad_features_and_empty_files() {
    assert!(matches!(
        CloudConfig::parse("").unwrap_err(),
        ConfigError::NoClusters
    ));
    assert!(error_of("clusters: [").starts_with("invalid cloud config"));
    let one = "clusters:\n  - url: https://a\n    token_id: u@pve!t\n    token_secret: x\n    region: r\n";
    assert!(
        error_of(&format!("features:\n  controllerVmID: 100\n{one}"))
            .starts_with("features.controllerVmID: invalid VM ID 100, must be greater than 100")
    );
    // Go's free-string provider (its chart suggests `proxmox`): default, with a warning.
    let c = CloudConfig::parse(&format!("features:\n  provider: proxmox\n{one}")).unwrap();
    assert_eq!(c.provider, Provider::Default);
}

#[test]
fn reports_keys_it_does_not_read() {
    let c = CloudConfig::parse(
        "features:\n  controllerVmId: 5000\nclusters:\n  - url: https://a\n    token_id: u@pve!t\n    token_secret: x\n    region: r\n    tokenSecret: y\n",
    )
    .unwrap();
    assert_eq!(
        c.ignored_keys,
        vec![
            "features.controllerVmId".to_string(),
            "clusters[0].tokenSecret".to_string()
        ]
    );
}

#[test]
fn allow_lists_restrict_nodes_and_storages() {
    let c = CloudConfig::parse(
        "clusters:\n  - url: https://a\n    token_id: u@pve!t\n    token_secret: x\n    region: r\n    allowed_nodes: [pve1, pve2]\n    allowed_storages: [local-lvm]\n",
    )
    .unwrap();
    let cl = &c.clusters[0];
    assert!(cl.node_allowed("pve1") && !cl.node_allowed("pve3"));
    assert!(cl.storage_allowed("local-lvm") && !cl.storage_allowed("nfs"));
    assert!(c.ignored_keys.is_empty());
}

#[test]
fn warns_of_plain_http_and_unchecked_certificates() {
    let cluster = |url: &str, insecure: bool| {
        format!(
            "  - url: {url}\n    token_id: u@pve!t\n    token_secret: x\n    region: r-{}\n    insecure: {insecure}\n",
            url.len()
        )
    };
    let c = CloudConfig::parse(&format!(
        "clusters:\n{}{}{}",
        cluster("http://a:8006", false),
        cluster("https://bb:8006", true),
        cluster("https://ccc:8006", false)
    ))
    .unwrap();
    let w = c.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].starts_with("cluster r-13: url http://a:8006/api2/json is plain HTTP"),
        "{w:?}"
    );
    assert!(
        w[1].starts_with("cluster r-15: insecure: true: the server's certificate is not checked"),
        "{w:?}"
    );
}

#[test]
fn a_refusal_never_quotes_the_file() {
    // Found by fuzzing: a document that is one string was echoed whole.
    for text in [
        "clusters\n\npassword: hunter2-secret-value",
        "clusters: \"token_secret: hunter2-secret-value\"",
        "a \" quote, then\n\ntoken_secret: hunter2-secret-value",
    ] {
        let e = CloudConfig::parse(text).unwrap_err().to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            e.starts_with("invalid cloud config: ") || e.contains("clusters"),
            "{e}"
        );
    }
}

#[test]
fn vmid_range_defaults_above_the_controller_vmid_and_names_bad_input() {
    let c = CloudConfig::parse(GOOD).unwrap();
    assert_eq!(
        c.vmid_range,
        VmidRange {
            low: 9999,
            high: MAX_VMID
        }
    );
    let with = |r: &str| {
        CloudConfig::parse(&GOOD.replace(
            "  controllerVmID: 9998\n",
            &format!("  controllerVmID: 9998\n  vmIDRange: \"{r}\"\n"),
        ))
    };
    assert_eq!(
        with("20000-20999").unwrap().vmid_range,
        VmidRange {
            low: 20000,
            high: 20999
        }
    );
    for (bad, says) in [
        ("20000", "write LOW-HIGH"),
        ("a-b", "write LOW-HIGH"),
        ("20999-20000", "the first not above the second"),
        ("50-200", "both ends must be VMIDs"),
        ("9998-9998", "holds only controllerVmID 9998"),
    ] {
        let e = with(bad).unwrap_err().to_string();
        assert!(e.starts_with("features.vmIDRange: "), "{bad}: {e}");
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn go_era_configs_keep_working() {
    // yaml.v3 reads YAML 1.1 booleans into Go's `Insecure bool`.
    for (spelling, want) in [
        ("yes", true),
        ("on", true),
        ("y", true),
        ("Yes", true),
        ("ON", true),
        ("no", false),
        ("off", false),
        ("N", false),
        ("\"true\"", true),
    ] {
        let c =
            CloudConfig::parse(&GOOD.replace("insecure: true", &format!("insecure: {spelling}")))
                .unwrap_or_else(|e| panic!("{spelling}: {e}"));
        assert_eq!(c.clusters[0].insecure, want, "{spelling}");
    }
    let e = CloudConfig::parse(&GOOD.replace("insecure: true", "insecure: maybe")).unwrap_err();
    // The value itself is not echoed: syntax errors never print values.
    assert!(
        e.to_string()
            .contains("is not a boolean: write true or false"),
        "{e}"
    );

    // A token with a stray username (or password): Go logs in with the
    // token; so does this driver, and it says what it left unread.
    let stray = GOOD.replace(
        "    token_secret: \"s3cr3t-token\"\n",
        "    token_secret: \"s3cr3t-token\"\n    username: kubernetes-csi@pve\n",
    );
    let c = CloudConfig::parse(&stray).unwrap();
    assert!(matches!(
        c.clusters[0].credentials,
        Credentials::Token { .. }
    ));
    assert_eq!(c.ignored_keys, ["clusters[0].username"]);
    let stray = GOOD.replace(
        "    token_secret: \"s3cr3t-token\"\n",
        "    token_secret: \"s3cr3t-token\"\n    password: pw\n",
    );
    let c = CloudConfig::parse(&stray).unwrap();
    assert!(matches!(
        c.clusters[0].credentials,
        Credentials::Token { .. }
    ));
    assert_eq!(c.ignored_keys, ["clusters[0].password"]);
    // A token and a whole login are still refused, with Go's text.
    let both = GOOD.replace(
        "    token_secret: \"s3cr3t-token\"\n",
        "    token_secret: \"s3cr3t-token\"\n    username: root@pam\n    password: pw\n",
    );
    let e = CloudConfig::parse(&both).unwrap_err().to_string();
    assert!(e.contains("not multiple"), "{e}");
}

#[test]
fn two_entries_for_one_region_are_refused_naming_both() {
    // Go keeps the last; which cluster then holds a volume's disk would
    // depend on the order of the entries, so this driver refuses.
    let dup = GOOD.replace("region: Region-2", "region: Region-1");
    let e = CloudConfig::parse(&dup).unwrap_err().to_string();
    assert!(e.contains("cluster #1: region"), "{e}");
    assert!(e.contains("already used by cluster #0"), "{e}");
}
