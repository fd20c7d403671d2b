use super::*;

#[test]
fn parses_and_prints_the_go_drivers_handles() {
    let v = VolumeId::parse("Region-1/pve-1/data/vm-9999-pvc-5bc58ec7").unwrap();
    assert_eq!(v.zone.as_deref(), Some("pve-1"));
    assert_eq!(v.volid(), "data:vm-9999-pvc-5bc58ec7");
    assert_eq!(v.owner(), Some(9999));
    assert_eq!(v.to_string(), "Region-1/pve-1/data/vm-9999-pvc-5bc58ec7");
    let s = VolumeId::parse("r//nfs/9999/vm-9999-pvc-a.raw").unwrap();
    assert_eq!(s.zone, None);
    assert_eq!(s.disk, "9999/vm-9999-pvc-a.raw");
    assert_eq!(s.to_string(), "r//nfs/9999/vm-9999-pvc-a.raw");
    assert_eq!(
        VolumeId::parse("r/z/s").unwrap_err().to_string(),
        "volume id \"r/z/s\": VolumeID must be in the format of region/zone/storageName/diskName"
    );
    assert!(matches!(
        VolumeId::parse("r/z//d"),
        Err(HandleError::EmptyPart {
            kind: HandleKind::Volume,
            ..
        })
    ));
}

#[test]
fn snapshot_ids_round_trip() {
    let ours = SnapshotId::parse("region-1/pve2/local-lvm/snapshot-vm-104").unwrap();
    assert_eq!(
        ours,
        SnapshotId::Copy {
            region: "region-1".into(),
            zone: "pve2".into(),
            storage: "local-lvm".into(),
            vmid: 104,
            mark: None,
        }
    );
    assert_eq!(ours.to_string(), "region-1/pve2/local-lvm/snapshot-vm-104");
    let marked = SnapshotId::parse("region-1/pve2/local-lvm/snapshot-vm-104.0a1b2c3d").unwrap();
    assert!(
        matches!(&marked, SnapshotId::Copy { vmid: 104, mark: Some(m), .. } if m == "0a1b2c3d")
    );
    assert_eq!(
        marked.to_string(),
        "region-1/pve2/local-lvm/snapshot-vm-104.0a1b2c3d"
    );
    let go = SnapshotId::parse("region-1/pve2/local-lvm/vm-9999-snapshot-5bc58ec7").unwrap();
    assert!(matches!(go, SnapshotId::Volume(ref v) if v.disk == "vm-9999-snapshot-5bc58ec7"));
    for bad in [
        "region-1/pve2/local-lvm/snapshot-vm-104.xyz",
        "r/z/s/snapshot-vm-x",
    ] {
        assert!(
            matches!(SnapshotId::parse(bad), Err(HandleError::NotACopyVm { .. })),
            "{bad}"
        );
    }
    assert_eq!(
        SnapshotId::parse("r/z/s/snapshot-vm-x")
            .unwrap_err()
            .to_string(),
        "snapshot id \"r/z/s/snapshot-vm-x\": snapshot-vm- must be followed by a VMID (and .<8 hex digits>)"
    );
    assert_eq!(
        SnapshotId::parse("r/z").unwrap_err().to_string(),
        "snapshot id \"r/z\": VolumeID must be in the format of region/zone/storageName/diskName"
    );
}

#[test]
fn owner_follows_the_go_regex() {
    assert_eq!(owner_of("vm-100-disk-1"), Some(100));
    assert_eq!(owner_of("9999/vm-9999-pvc-a.raw"), Some(9999));
    assert_eq!(owner_of("base-100-disk-0/vm-101-disk-0"), Some(101));
    assert_eq!(owner_of("vm-99-disk-1"), None);
    assert_eq!(owner_of("pvc-1"), None);
    assert_eq!(pv_of("vm-9999-pvc-a.csf-5bc58ec71c2d"), Some("pvc-a"));
}

#[test]
fn cluster_ids() {
    let id = ClusterId::from_namespace_uid("5BC58EC7-1c2d-4e5f-8a9b-0c1d2e3f4a5b").unwrap();
    assert_eq!(id.as_str(), "5bc58ec71c2d");
    assert_eq!(ClusterId::from_namespace_uid("12ab"), None);
    assert_eq!(
        ClusterId::parse("a-b").unwrap_err().to_string(),
        "cluster id \"a-b\": 1 to 16 lower-case letters and digits"
    );
    assert!(ClusterId::parse("").is_err());
    assert_eq!(ClusterId::parse("prod1").unwrap().as_str(), "prod1");
    assert_eq!(
        ClusterId::of_disk("local-lvm:vm-9999-pvc-a.csf-prod1"),
        Some(ClusterId::parse("prod1").unwrap())
    );
}

proptest::proptest! {
    /// Whatever parses prints back to itself, and a handle printed is read
    /// back as the same handle: ids are the only state the CO keeps.
    #[test]
    fn handles_round_trip(
        region in "[A-Za-z0-9-]{1,12}",
        zone in proptest::option::of("[a-z0-9-]{1,12}"),
        storage in "[a-z0-9-]{1,12}",
        disk in "[a-z0-9./-]{0,8}[a-z0-9]",
        vmid in 100u32..1_000_000,
        mark in proptest::option::of("[0-9a-f]{8}"),
        raw in ".{0,40}",
    ) {
        let v = VolumeId { region: region.clone(), zone: zone.clone(), storage: storage.clone(), disk };
        proptest::prop_assert_eq!(VolumeId::parse(&v.to_string()), Ok(v.clone()));
        let s = SnapshotId::Copy {
            region, zone: zone.unwrap_or_default(), storage, vmid, mark,
        };
        proptest::prop_assert_eq!(SnapshotId::parse(&s.to_string()), Ok(s));
        if let Ok(v) = VolumeId::parse(&raw) {
            proptest::prop_assert_eq!(v.to_string(), raw.clone());
        }
        if let Ok(s) = SnapshotId::parse(&raw) {
            proptest::prop_assert_eq!(SnapshotId::parse(&s.to_string()), Ok(s));
        }
    }
}
