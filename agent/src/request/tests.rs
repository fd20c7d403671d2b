use super::*;
use callers::kubelet::{Kubelet, Pod};
use callers::provisioner::{self, Claim, StorageClass};
use callers::{PersistentVolume, VolumeMode};
use proxmox_csi_proto::csi::v1::volume_capability::AccessMode;

fn rules() -> Rules {
    Rules {
        kubelet_root: "/var/lib/kubelet".into(),
    }
}

/// The PV the provisioner writes for a 1 GiB xfs claim of a StorageClass
/// with `ssd: "1"` and `blockSize: "4096"` (the controller's context).
fn pv() -> PersistentVolume {
    let sc = StorageClass::new(&[
        ("storage", "local-lvm"),
        ("ssd", "1"),
        ("blockSize", "4096"),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ]);
    let claim = Claim::new("data", "1", 1 << 30);
    let volume = csi::Volume {
        volume_id: "region-1/pve2/local-lvm/vm-9999-pvc-1".into(),
        capacity_bytes: 1 << 30,
        volume_context: HashMap::from([
            ("ssd".into(), "1".into()),
            ("blockSize".into(), "4096".into()),
        ]),
        ..Default::default()
    };
    provisioner::persistent_volume(&sc, &claim, &volume)
}

fn kubelet() -> Kubelet {
    Kubelet::new("/var/lib/kubelet")
}

/// kubelet's NodeStage of `pv()` after the controller attached it.
fn stage_req() -> csi::NodeStageVolumeRequest {
    let attached = HashMap::from([
        ("wwn".into(), "0x5000c500a1b2c3d4".into()),
        ("serial".into(), "pvc-1".into()),
    ]);
    kubelet().node_stage(&pv(), &attached, HashMap::new())
}

/// A capability whose access mode is `mode` (replacing the PV's).
fn with_mode(mut cap: csi::VolumeCapability, mode: Mode) -> csi::VolumeCapability {
    cap.access_mode = Some(AccessMode { mode: mode as i32 });
    cap
}

#[test]
fn stage_becomes_the_hostd_request_it_stands_for() {
    let mut r = stage_req();
    r.secrets.insert(PASSPHRASE_KEY.into(), "pw".into());
    let h = rules().stage(&r).unwrap();
    assert_eq!(h.device.as_ref().unwrap().wwn, "0x5000c500a1b2c3d4");
    assert_eq!(h.device.as_ref().unwrap().serial, "pvc-1");
    assert_eq!(h.encryption.as_ref().unwrap().passphrase, b"pw");
    assert!(!h.read_only);
    let Some(hostd::stage_request::Access::Filesystem(fs)) = h.access else {
        panic!("filesystem expected")
    };
    assert_eq!(fs.fs_type, "xfs");
    assert_eq!(fs.block_size, 4096);
    assert_eq!(fs.mount_flags, ["noatime"]);
}

#[test]
fn go_driver_publish_context_still_stages() {
    let mut r = stage_req();
    r.publish_context = HashMap::from([
        (
            "DevicePath".into(),
            "/dev/disk/by-id/wwn-0x5056432d49443031".into(),
        ),
        ("lun".into(), "1".into()),
    ]);
    let h = rules().stage(&r).unwrap();
    assert_eq!(h.device.unwrap().wwn, "0x5056432d49443031");
}

#[test]
fn every_bad_stage_input_names_its_field() {
    type Mutate = fn(&mut csi::NodeStageVolumeRequest);
    let cases: Vec<(Mutate, &str)> = vec![
        (|r| r.volume_id.clear(), "volume_id: is required"),
        (
            |r| r.staging_target_path.clear(),
            "staging_target_path: is required",
        ),
        (
            |r| r.staging_target_path = "relative/path".into(),
            "staging_target_path: \"relative/path\" is not an absolute path",
        ),
        (
            |r| r.staging_target_path = "/etc/kubernetes".into(),
            "staging_target_path: \"/etc/kubernetes\" is not under kubelet's directory /var/lib/kubelet",
        ),
        (
            |r| r.staging_target_path = "/var/lib/kubelet/../../etc".into(),
            "staging_target_path: \"/var/lib/kubelet/../../etc\" contains '..'",
        ),
        (
            |r| r.volume_capability = None,
            "volume_capability: is required",
        ),
        (
            |r| {
                r.volume_capability = r
                    .volume_capability
                    .take()
                    .map(|c| with_mode(c, Mode::MultiNodeMultiWriter))
            },
            "volume_capability.access_mode: MULTI_NODE_MULTI_WRITER is not supported",
        ),
        (
            |r| {
                if let Some(AccessType::Mount(m)) = r
                    .volume_capability
                    .as_mut()
                    .and_then(|c| c.access_type.as_mut())
                {
                    m.fs_type = "btrfs".into();
                }
            },
            "volume_capability.mount.fs_type: \"btrfs\" is not supported; allowed: ext4, xfs, ext3, ext2",
        ),
        (
            |r| r.publish_context.clear(),
            "publish_context.wwn: is required",
        ),
        (
            |r| r.publish_context = HashMap::from([("DevicePath".into(), "/dev/sdb".into())]),
            "publish_context.DevicePath: \"/dev/sdb\" does not name a disk by WWN",
        ),
        (
            |r| {
                r.volume_context.insert("inodeSize".into(), "big".into());
            },
            "volume_context.inodeSize: \"big\" is not a number",
        ),
        (
            |r| {
                r.secrets.insert(PASSPHRASE_KEY.into(), String::new());
            },
            "secrets.encryption-passphrase: is empty",
        ),
        (
            |r| {
                if let Some(AccessType::Mount(m)) = r
                    .volume_capability
                    .as_mut()
                    .and_then(|c| c.access_type.as_mut())
                {
                    m.mount_flags = vec!["noatime,bind".into()];
                }
            },
            "volume_capability.mount.mount_flags: \"bind\" is not allowed: it changes what is mounted",
        ),
        (
            |r| {
                if let Some(AccessType::Mount(m)) = r
                    .volume_capability
                    .as_mut()
                    .and_then(|c| c.access_type.as_mut())
                {
                    m.mount_flags = vec!["rbind".into()];
                }
            },
            "volume_capability.mount.mount_flags: \"rbind\" is not allowed",
        ),
    ];
    for (mutate, want) in cases {
        let mut r = stage_req();
        mutate(&mut r);
        let e = rules().stage(&r).unwrap_err();
        let status: tonic::Status = e.into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{want}");
        assert!(
            status.message().starts_with(want),
            "want {want:?}\n got {:?}",
            status.message()
        );
    }
}

#[test]
fn reader_only_and_readonly_publish_mount_read_only() {
    let (k, pod) = (kubelet(), Pod::new("u"));
    // SINGLE_NODE_READER_ONLY: no Kubernetes access mode maps to it, other
    // COs (and kubernetes-csi/csi-test pkg/sanity) send it.
    let mut p = k.node_publish(&pv(), &pod, &HashMap::new());
    p.volume_capability = p
        .volume_capability
        .take()
        .map(|c| with_mode(c, Mode::SingleNodeReaderOnly));
    assert!(rules().publish(&p).unwrap().read_only);
    let w = k.node_publish(&pv(), &pod, &HashMap::new());
    assert!(!rules().publish(&w).unwrap().read_only);
    // The pod's claim reference says readOnly.
    let ro = k.node_publish(
        &pv(),
        &Pod {
            read_only: true,
            ..pod.clone()
        },
        &HashMap::new(),
    );
    assert!(rules().publish(&ro).unwrap().read_only);
    let block = PersistentVolume {
        volume_mode: VolumeMode::Block,
        fs_type: String::new(),
        ..pv()
    };
    assert!(
        rules()
            .publish(&k.node_publish(&block, &pod, &HashMap::new()))
            .unwrap()
            .block
    );
}

#[test]
fn a_storage_classs_mount_options_stage_as_mount8_takes_them() {
    // As a Go driver StorageClass writes them: several in one entry, and
    // options only mount(8) reads (hostd drops those).
    let mut pv = pv();
    pv.mount_options = vec![
        "noatime,discard".into(),
        "nofail".into(),
        "_netdev".into(),
        "x-systemd.device-timeout=5".into(),
        "context=\"system_u:object_r:container_file_t:s0:c1,c2\"".into(),
    ];
    let attached = HashMap::from([("wwn".into(), "0x5000c500a1b2c3d4".into())]);
    let r = kubelet().node_stage(&pv, &attached, HashMap::new());
    let h = rules().stage(&r).unwrap();
    let Some(hostd::stage_request::Access::Filesystem(fs)) = h.access else {
        panic!("filesystem expected")
    };
    assert_eq!(
        fs.mount_flags,
        [
            "noatime",
            "discard",
            "nofail",
            "_netdev",
            "x-systemd.device-timeout=5",
            "context=\"system_u:object_r:container_file_t:s0:c1,c2\"",
        ]
    );
}

#[test]
fn ext3_and_ext2_stage_as_the_go_driver_formats_them() {
    for fs in ["ext3", "ext2"] {
        let mut pv = pv();
        pv.fs_type = fs.into();
        let attached = HashMap::from([("wwn".into(), "0x5000c500a1b2c3d4".into())]);
        let h = rules()
            .stage(&kubelet().node_stage(&pv, &attached, HashMap::new()))
            .unwrap();
        let Some(hostd::stage_request::Access::Filesystem(f)) = h.access else {
            panic!("filesystem expected")
        };
        assert_eq!(f.fs_type, fs);
    }
}
