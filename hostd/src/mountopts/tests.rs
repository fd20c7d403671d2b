use super::*;

fn v(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

#[test]
fn splits_flags_into_kernel_flags_and_data() {
    let c = check(
        "f",
        Some("xfs"),
        &v(&["noatime", "nouuid", "ro", "discard"]),
    )
    .unwrap();
    assert_eq!(
        c,
        Checked {
            flags: MsFlags::MS_NOATIME | MsFlags::MS_RDONLY,
            data: "nouuid,discard".into()
        }
    );
}

#[test]
fn takes_what_mount8_takes_and_drops_its_own_options() {
    let c = check(
        "f",
        Some("ext4"),
        &v(&[
            "noatime,discard",
            "nofail",
            "_netdev",
            "x-systemd.automount",
            "x-systemd.requires=\"a b\"",
            "auto",
            "exec",
            "async",
        ]),
    )
    .unwrap();
    assert_eq!(
        c,
        Checked {
            flags: MsFlags::MS_NOATIME,
            data: "discard,errors=remount-ro".into()
        }
    );
    let c = check(
        "f",
        Some("ext4"),
        &v(&[
            "context=\"system_u:object_r:container_file_t:s0:c1,c2\"",
            "errors=remount-ro",
        ]),
    )
    .unwrap();
    assert_eq!(
        c.data,
        "context=\"system_u:object_r:container_file_t:s0:c1,c2\",errors=remount-ro"
    );
}

#[test]
fn takes_what_stock_classes_carry() {
    // Options of StorageClasses written for mount(8) and the Go driver.
    for (fs, o) in [
        ("ext4", "data_err=abort"),
        ("ext4", "usrquota"),
        (
            "ext4",
            "usrjquota=aquota.user,grpjquota=aquota.group,jqfmt=vfsv0",
        ),
        ("ext4", "errors=continue"),
        (
            "ext4",
            "nodelalloc,journal_ioprio=3,barrier=0,mb_optimize_scan=1",
        ),
        ("ext3", "data=journal"),
        ("xfs", "norecovery,ro"),
        ("xfs", "logbsize=256k,allocsize=64m,prjquota,uqnoenforce"),
        ("xfs", "iversion,nomand,norelatime,silent,nosymfollow"),
    ] {
        let c = check("f", Some(fs), &v(&[o]));
        assert!(c.is_ok(), "{fs} {o}: {c:?}");
    }
    let c = check(
        "f",
        Some("ext4"),
        &v(&["iversion,silent,nosymfollow,nomand"]),
    )
    .unwrap();
    assert_eq!(
        c.flags,
        MsFlags::MS_I_VERSION
            | MsFlags::MS_SILENT
            | MsFlags::from_bits_retain(nix::libc::MS_NOSYMFOLLOW)
    );
    assert_eq!(c.data, "errors=remount-ro");
}

#[test]
fn an_ext_superblocks_error_behaviour_never_panics_the_node() {
    let c = check("f", Some("ext4"), &v(&["noatime"])).unwrap();
    assert_eq!(c.data, "errors=remount-ro");
    let c = check("f", Some("ext3"), &v(&["errors=continue"])).unwrap();
    assert_eq!(c.data, "errors=continue");
    assert_eq!(check("f", Some("xfs"), &v(&["noatime"])).unwrap().data, "");
}

#[test]
fn every_table_entry_is_accepted_with_a_value_of_its_kind() {
    fn example(v: Value) -> Option<&'static str> {
        match v {
            Value::Flag => None,
            Value::Number => Some("1"),
            Value::Size => Some("64k"),
            Value::OneOf(set) => Some(set[0]),
            Value::RootFile => Some("aquota.user"),
            Value::Word => Some("none"),
        }
    }
    for fs in ["ext2", "ext3", "ext4", "xfs"] {
        for e in table(fs).unwrap() {
            let o = match example(e.value) {
                Some(v) => format!("{}={v}", e.name),
                None => e.name.to_string(),
            };
            let c = check("f", Some(fs), &v(&[&o])).unwrap();
            let ext = fs != "xfs" && !o.starts_with("errors=");
            let want = if ext {
                format!("{o},errors=remount-ro")
            } else {
                o
            };
            assert_eq!(c.data, want, "{fs}");
        }
    }
}

#[test]
fn refuses_devices_paths_panics_and_other_calls() {
    for (fs, o, why) in [
        ("xfs", "logdev=/dev/sda", "names a device"),
        ("xfs", "rtdev=/dev/sda", "names a device"),
        ("ext4", "journal_path=/dev/sda", "names a device"),
        ("ext4", "journal_dev=8", "names a device"),
        ("ext4", "sb=131072", "superblock from"),
        ("ext4", "errors=panic", "panics the node"),
        ("ext4", "noatime,errors=panic", "panics the node"),
        ("ext4", "abort", "aborts the journal"),
        ("ext4", "loop=/dev/loop0", "loop device"),
        ("xfs", "verity.hashdevice=/dev/sdb", "verity device"),
        ("ext4", "bind", "what the mount call does"),
        ("xfs", "remount", "what the mount call does"),
        ("ext4", "usrjquota=/etc/shadow", "not one the kernel's ext4"),
        ("ext4", "nouuid", "not one the kernel's ext4"),
        ("xfs", "data=journal", "not one the kernel's xfs"),
        ("ext4", "commit=5s", "not one the kernel's ext4"),
        ("ext4", "data_err=panic", "not one the kernel's ext4"),
        ("ext4", "mb_optimize_scan=2", "not one the kernel's ext4"),
        // The kernel splits at every comma, quotes or not: a quoted
        // value must not carry options past the check.
        (
            "ext4",
            "usrjquota=\"aquota.user,jqfmt=vfsv0,errors=panic",
            "only an SELinux context's value may be quoted",
        ),
        (
            "ext4",
            "grpjquota=a\"b",
            "only an SELinux context's value may be quoted",
        ),
        (
            "ext4",
            "context=\"system_u:object_r:x:s0",
            "an SELinux context is",
        ),
        ("xfs", "context=\"a:b\",logdev=/dev/sda\"", "names a device"),
        ("ext4", "fscontext=a:b;c", "an SELinux context is"),
    ] {
        let e = check("volume_capability.mount_flags", Some(fs), &v(&[o]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("volume_capability.mount_flags: mount option") && e.contains(why),
            "{fs} {o}: {e}"
        );
    }
    // A bind mount checks them too, and hands on only the generic flags.
    assert!(check("f", None, &v(&["logdev=/dev/sda"])).is_err());
    assert!(check("f", None, &v(&["nouuid", "data_err=abort"])).is_ok());
    assert_eq!(
        check("f", None, &v(&["discard", "ro"])).unwrap(),
        Checked {
            flags: MsFlags::MS_RDONLY,
            data: String::new()
        }
    );
}
