//! The decisions on a fake host (`fake`): what is refused, what is
//! formatted, what is closed. No root, no devices; the root tests in
//! `hostd/tests` prove the same on loop devices.

use std::cell::Cell;

use super::block::plain_data_under;
use super::encrypted::{LuksPlan, close_half_made, luks_plan, mapping_on};
use super::fake::{Fake, entry};
use super::filesystem::{FsCase, FsPlan, formatted_since_allocation, fs_plan};
use super::gocompat::{close_idle_go_mapping, serial_or_tie};
use super::unstage::{close_mappings, go_mapping_of, still_published};
use super::*;

const SDB: &str = "/dev/sdb";
const VOL: &str = "vol-a";

fn luks() -> Contents {
    Contents::Filesystem("crypto_LUKS".into())
}

fn fs(t: &str) -> Contents {
    Contents::Filesystem(t.into())
}

/// A stage of a plain ext4 volume on `/dev/sdb`: nothing begun, nothing held.
fn case(fs_device: &Path) -> FsCase<'_> {
    FsCase {
        device: Path::new(SDB),
        fs_device,
        fs_type: FsType::Ext4,
        claim: Claim::Unmarked,
        read_only: false,
        encrypted: false,
        made_luks: false,
        begun: false,
    }
}

fn holds_data(r: Result<impl std::fmt::Debug, HostdError>, what: &str) {
    match r {
        Err(HostdError::HoldsData { found, .. }) => {
            assert!(found.contains(what), "{found:?} does not say {what:?}");
        }
        other => panic!("expected HoldsData ({what}), got {other:?}"),
    }
}

fn refused(r: Result<impl std::fmt::Debug, HostdError>, what: &str) {
    match r {
        Err(HostdError::DeviceRefused { reason, .. }) => {
            assert!(reason.contains(what), "{reason:?} does not say {what:?}");
        }
        other => panic!("expected DeviceRefused ({what}), got {other:?}"),
    }
}

// What is formatted: only a device proven blank, or hostd's own.

#[test]
fn a_blank_disk_holding_data_is_never_formatted() {
    let mut host = Fake::default().disk("sdb", "8:16", Contents::Blank);
    host.data_at.insert(SDB.into(), 4096);
    holds_data(
        fs_plan(&host, &case(Path::new(SDB))),
        "no signature, but data at byte 4096",
    );
}

#[test]
fn a_blank_disk_of_zeros_is_formatted() {
    let host = Fake::default().disk("sdb", "8:16", Contents::Blank);
    assert_eq!(
        fs_plan(&host, &case(Path::new(SDB))).unwrap(),
        FsPlan::Format
    );
    assert_eq!(host.samples.get(), 1, "the disk's bytes were sampled");
}

#[test]
fn hostds_own_interrupted_format_is_formatted_again() {
    let mut host = Fake::default().disk("sdb", "8:16", Contents::Blank);
    host.data_at.insert(SDB.into(), 4096);
    let c = FsCase {
        begun: true,
        ..case(Path::new(SDB))
    };
    assert_eq!(fs_plan(&host, &c).unwrap(), FsPlan::Format);
}

#[test]
fn a_read_only_stage_never_formats() {
    for contents in [Contents::Blank, Contents::Unfinished("ext4".into())] {
        let host = Fake::default().disk("sdb", "8:16", contents);
        let c = FsCase {
            read_only: true,
            begun: true,
            ..case(Path::new(SDB))
        };
        refused(fs_plan(&host, &c), "the stage is read-only");
    }
}

#[test]
fn what_is_not_the_filesystem_asked_for_is_refused() {
    for (contents, says) in [
        (fs("xfs"), "a xfs signature"),
        (
            Contents::PartitionTable("gpt".into()),
            "a gpt partition table",
        ),
        (Contents::Ambiguous, "several conflicting signatures"),
        (Contents::Unfinished("xfs".into()), "an unfinished xfs"),
    ] {
        let host = Fake::default().disk("sdb", "8:16", contents);
        let c = FsCase {
            begun: true,
            made_luks: true,
            ..case(Path::new(SDB))
        };
        holds_data(fs_plan(&host, &c), says);
    }
    let host = Fake::default().disk("sdb", "8:16", fs("ext4"));
    assert_eq!(fs_plan(&host, &case(Path::new(SDB))).unwrap(), FsPlan::Keep);
}

#[test]
fn a_claimed_volume_whose_filesystem_is_gone_is_never_formatted() {
    for contents in [
        Contents::Blank,
        Contents::Unfinished("ext4".into()),
        fs("xfs"),
    ] {
        let host = Fake::default().disk("sdb", "8:16", contents);
        let c = FsCase {
            claim: Claim::Held(1 << 30),
            begun: true,
            made_luks: true,
            ..case(Path::new(SDB))
        };
        holds_data(fs_plan(&host, &c), "never formatted again");
    }
}

#[test]
fn an_unfinished_mkfs_is_made_again_only_when_hostd_began_it() {
    let host = Fake::default().disk("sdb", "8:16", Contents::Unfinished("ext4".into()));
    holds_data(
        fs_plan(&host, &case(Path::new(SDB))),
        "an unfinished ext4 that hostd did not begin",
    );
    for (begun, made_luks) in [(true, false), (false, true)] {
        let c = FsCase {
            begun,
            made_luks,
            ..case(Path::new(SDB))
        };
        assert_eq!(fs_plan(&host, &c).unwrap(), FsPlan::Remake);
    }
}

#[test]
fn a_mapping_without_a_filesystem_is_formatted_only_when_this_stage_made_its_header() {
    let mapper = Path::new("/dev/mapper/m");
    let mut host = Fake::default().disk("sdb", "8:16", luks());
    host.contents.insert(mapper.into(), Contents::Blank);
    // The plaintext of an existing LUKS volume: data, whatever it reads as.
    let c = FsCase {
        encrypted: true,
        ..case(mapper)
    };
    holds_data(
        fs_plan(&host, &c),
        "an existing LUKS volume whose contents carry no filesystem signature",
    );
    let made = FsCase {
        made_luks: true,
        ..c
    };
    assert_eq!(fs_plan(&host, &made).unwrap(), FsPlan::Format);
    // The disk under a mapping holds its header: not sampled as data.
    assert_eq!(host.samples.get(), 0);
}

#[test]
fn a_first_stage_formats_after_its_wipe_without_reading_the_disk_again() {
    // What the probe would find is never consulted: the first stage's own
    // checks and wipe decided. A sample would have found the data.
    let mut host = Fake::default().disk("sdb", "8:16", fs("xfs"));
    host.data_at.insert(SDB.into(), 4096);
    let first = FsCase {
        claim: Claim::FirstStage,
        begun: true,
        ..case(Path::new(SDB))
    };
    assert_eq!(fs_plan(&host, &first).unwrap(), FsPlan::Format);
    assert_eq!(host.samples.get(), 0);
    // A mapping this stage did not make, or a read-only stage, goes by the
    // general rules: what the disk holds is looked at.
    let mapper = Path::new("/dev/mapper/m");
    host.contents.insert(mapper.into(), Contents::Blank);
    let not_made = FsCase {
        claim: Claim::FirstStage,
        encrypted: true,
        ..case(mapper)
    };
    holds_data(
        fs_plan(&host, &not_made),
        "an existing LUKS volume whose contents carry no filesystem signature",
    );
    let read_only = FsCase {
        read_only: true,
        ..first
    };
    holds_data(fs_plan(&host, &read_only), "a xfs signature");
}

#[test]
fn a_signature_made_since_allocation_is_what_hostd_did_not_leave() {
    let mut host = Fake::default().disk("sdb", "8:16", Contents::Blank);
    assert!(!formatted_since_allocation(&host, Path::new(SDB)).unwrap());
    host.contents
        .insert(SDB.into(), Contents::Unfinished("xfs".into()));
    assert!(!formatted_since_allocation(&host, Path::new(SDB)).unwrap());
    host.contents.insert(SDB.into(), luks());
    assert!(!formatted_since_allocation(&host, Path::new(SDB)).unwrap());
    host.keyslots.insert(SDB.into());
    assert!(formatted_since_allocation(&host, Path::new(SDB)).unwrap());
    host.contents.insert(SDB.into(), fs("ext4"));
    assert!(formatted_since_allocation(&host, Path::new(SDB)).unwrap());
}

// LUKS: formatted only when blank, reused only on this disk.

fn plan(host: &Fake, claim: Claim, read_only: bool, begun: bool) -> Result<LuksPlan, HostdError> {
    luks_plan(host, Path::new(SDB), "pvecsi-a", claim, read_only, || {
        Ok(begun)
    })
}

#[test]
fn an_open_mapping_is_reused_only_on_this_disk() {
    let host = Fake::default()
        .disk("sdb", "8:16", luks())
        .mapping("pvecsi-a", "dm-0", "253:0", "sdb");
    assert_eq!(
        plan(&host, Claim::Unmarked, false, false).unwrap(),
        LuksPlan::Reuse
    );
    let elsewhere = Fake::default()
        .disk("sdb", "8:16", luks())
        .mapping("pvecsi-a", "dm-0", "253:0", "sdc");
    refused(
        plan(&elsewhere, Claim::Unmarked, false, false),
        "mapping pvecsi-a is open on [\"sdc\"], not on this disk (sdb)",
    );
    assert_eq!(
        mapping_on(&elsewhere, "pvecsi-a", Path::new(SDB)),
        Err("mapping pvecsi-a is open on [\"sdc\"], not on this disk (sdb)".into())
    );
}

#[test]
fn luks_format_only_on_a_disk_proven_blank() {
    let mut host = Fake::default().disk("sdb", "8:16", Contents::Blank);
    assert_eq!(
        plan(&host, Claim::Unmarked, false, false).unwrap(),
        LuksPlan::Format
    );
    // Every byte of the header area is read, not only the samples.
    host.header_data_at.insert(SDB.into(), 8 << 20);
    holds_data(
        plan(&host, Claim::Unmarked, false, false),
        "no signature, but data at byte 8388608",
    );
    // hostd's own interrupted format: its bytes are not someone's data.
    assert_eq!(
        plan(&host, Claim::Unmarked, false, true).unwrap(),
        LuksPlan::Format
    );
    refused(
        plan(&host, Claim::Unmarked, true, true),
        "the stage is read-only",
    );
    host.contents.insert(SDB.into(), fs("ext4"));
    holds_data(
        plan(&host, Claim::Unmarked, false, true),
        "a ext4 signature and encryption was asked for",
    );
}

#[test]
fn a_header_without_a_key_slot_is_made_again_only_when_hostd_began_it() {
    let mut host = Fake::default().disk("sdb", "8:16", luks());
    let slotless = "a LUKS header without a key slot that hostd did not begin";
    holds_data(plan(&host, Claim::Unmarked, false, false), slotless);
    holds_data(plan(&host, Claim::Unmarked, true, true), slotless);
    assert_eq!(
        plan(&host, Claim::Unmarked, false, true).unwrap(),
        LuksPlan::FormatAgain
    );
    // A claimed volume's header lost its slot: damaged, never made again.
    holds_data(
        plan(&host, Claim::Held(1 << 30), false, true),
        "restore a header backup",
    );
    host.keyslots.insert(SDB.into());
    assert_eq!(
        plan(&host, Claim::Held(1 << 30), true, false).unwrap(),
        LuksPlan::Open
    );
}

#[test]
fn the_format_note_is_read_only_where_it_decides() {
    let host = Fake::default().disk("sdb", "8:16", Contents::Blank);
    let reads = Cell::new(0);
    let read = || {
        reads.set(reads.get() + 1);
        Ok(false)
    };
    refused(
        luks_plan(
            &host,
            Path::new(SDB),
            "pvecsi-a",
            Claim::Unmarked,
            true,
            read,
        ),
        "read-only",
    );
    assert_eq!(reads.get(), 0);
}

// What is refused: a LUKS disk as plain, data under an encrypted class, serials.

#[test]
fn a_luks_disk_is_never_handed_out_as_plain() {
    let host = Fake::default().disk("sdb", "8:16", luks());
    holds_data(
        refuse_luks_as_plain(&host, Path::new(SDB)),
        "a LUKS volume, and no encryption passphrase was given",
    );
    let plain = Fake::default().disk("sdb", "8:16", fs("ext4"));
    assert!(refuse_luks_as_plain(&plain, Path::new(SDB)).is_ok());
}

#[test]
fn data_without_a_luks_header_is_staged_unencrypted_only_with_go_takeover() {
    let mut host = Fake::default().disk("sdb", "8:16", Contents::Blank);
    host.data_at.insert(SDB.into(), 512);
    refused(
        plain_data_under(&host, Path::new(SDB), "pvecsi-a", false),
        "holds no signature, but data at byte 512 and no LUKS header",
    );
    assert_eq!(
        plain_data_under(&host, Path::new(SDB), "pvecsi-a", true).unwrap(),
        Some("no signature, but data at byte 512".into())
    );
    host.contents.insert(SDB.into(), luks());
    assert_eq!(
        plain_data_under(&host, Path::new(SDB), "pvecsi-a", false).unwrap(),
        None
    );
    host.data_at.clear();
    host.contents.insert(SDB.into(), Contents::Blank);
    assert_eq!(
        plain_data_under(&host, Path::new(SDB), "pvecsi-a", false).unwrap(),
        None
    );
}

#[test]
fn a_request_naming_another_volumes_serial_is_refused() {
    let own = contract::serial_for(VOL);
    assert!(check_request_serial("", VOL).is_ok());
    assert!(check_request_serial(&own, VOL).is_ok());
    let other = contract::serial_for("vol-b");
    assert!(matches!(
        check_request_serial(&other, VOL),
        Err(HostdError::InvalidArgument {
            field: "device.serial",
            ..
        })
    ));
}

#[test]
fn a_disk_without_this_drivers_serial_needs_a_tie_or_go_takeover() {
    let mut host = Fake::default().disk("sdb", "8:16", fs("ext4"));
    let sdb = Path::new(SDB);
    let untied = || Ok(false);
    refused(
        serial_or_tie(&host, true, false, sdb, VOL, untied),
        "it carries no serial of this driver's",
    );
    assert!(serial_or_tie(&host, true, false, sdb, VOL, || Ok(true)).is_ok());
    assert!(serial_or_tie(&host, true, true, sdb, VOL, untied).is_ok());
    host.serials.insert("sdb".into(), "QEMU HARDDISK".into());
    refused(
        serial_or_tie(&host, true, false, sdb, VOL, untied),
        "no serial",
    );
    host.serials.insert("sdb".into(), contract::serial_for(VOL));
    assert!(serial_or_tie(&host, true, false, sdb, VOL, untied).is_ok());
}

// What is closed: this volume's mappings only, and only when idle.

#[test]
fn unstage_closes_this_volumes_mapping_and_no_other() {
    let own = luks::mapping_name(VOL);
    let other = luks::mapping_name("vol-b");
    let host = Fake::default()
        .mapping(&own, "dm-0", "253:0", "sdb")
        .mapping(&other, "dm-1", "253:1", "sdc")
        .mapping("sdc-encrypted", "dm-2", "253:2", "sdc");
    close_mappings(&host, VOL, None).unwrap();
    assert_eq!(host.closed(), [(own, false)]);
}

#[test]
fn unstage_forces_the_close_of_a_mapping_whose_disk_is_gone() {
    let own = luks::mapping_name(VOL);
    let mut host = Fake::default().mapping(&own, "dm-0", "253:0", "sdb");
    host.backing_gone.insert(own.clone());
    close_mappings(&host, VOL, None).unwrap();
    assert_eq!(host.closed(), [(own, true)]);
}

#[test]
fn only_the_go_drivers_mapping_of_the_disk_is_taken_for_its_own() {
    let own = luks::mapping_name(VOL);
    let host = Fake::default()
        .mapping(&own, "dm-0", "253:0", "sdb")
        .mapping("sdc-encrypted", "dm-1", "253:1", "sdc");
    let go = Some(("sdc-encrypted".to_string(), "sdc".to_string()));
    assert_eq!(go_mapping_of(&host, go.clone()), go);
    assert_eq!(go_mapping_of(&host, Some((own, "sdb".into()))), None);
    // A Go-named mapping of another disk is not this disk's.
    assert_eq!(
        go_mapping_of(&host, Some(("sdc-encrypted".into(), "sdb".into()))),
        None
    );
}

#[test]
fn the_go_drivers_mapping_is_closed_only_when_nothing_uses_it() {
    let go = || Some(("sdc-encrypted".to_string(), "sdc".to_string()));
    let idle = Fake::default().mapping("sdc-encrypted", "dm-1", "253:1", "sdc");
    close_mappings(&idle, VOL, go()).unwrap();
    assert_eq!(idle.closed(), [("sdc-encrypted".to_string(), false)]);

    let mounted = Fake::default()
        .mapping("sdc-encrypted", "dm-1", "253:1", "sdc")
        .mounted("253:1", "/elsewhere");
    close_mappings(&mounted, VOL, go()).unwrap();
    assert_eq!(mounted.closed(), []);

    let mut held = Fake::default().mapping("sdc-encrypted", "dm-1", "253:1", "sdc");
    held.held.insert("dm-1".into());
    close_mappings(&held, VOL, go()).unwrap();
    assert_eq!(held.closed(), []);
}

#[test]
fn a_stage_closes_the_go_drivers_idle_mapping_of_its_own_disk_only() {
    let table = |h: &Fake| h.table.clone();
    let host = Fake::default()
        .disk("sdb", "8:16", luks())
        .mapping("sdb-encrypted", "dm-1", "253:1", "sdb")
        .mapping("sdc-encrypted", "dm-2", "253:2", "sdc");
    let closed = close_idle_go_mapping(&host, Path::new(SDB), &table(&host)).unwrap();
    assert_eq!(
        closed.as_deref(),
        Some("closed the Go driver's mapping sdb-encrypted")
    );
    assert_eq!(host.closed(), [("sdb-encrypted".to_string(), false)]);

    // Bound into a pod (devtmpfs, the node's own number): in use.
    let mut bound = Fake::default().disk("sdb", "8:16", luks()).mapping(
        "sdb-encrypted",
        "dm-1",
        "253:1",
        "sdb",
    );
    bound.nodes.insert("/pods/x/dev".into(), "253:1".into());
    bound.table.push(entry("0:5", "/pods/x/dev", "devtmpfs"));
    assert_eq!(
        close_idle_go_mapping(&bound, Path::new(SDB), &table(&bound)).unwrap(),
        None
    );
    assert_eq!(bound.closed(), []);
}

#[test]
fn a_half_made_mapping_is_closed_only_when_unopened_and_unused() {
    let own = luks::mapping_name(VOL);
    let mut half = Fake::default().mapping(&own, "dm-0", "253:0", "sdb");
    half.open.clear();
    close_half_made(&half, &own, &[]).unwrap();
    assert_eq!(half.closed(), [(own.clone(), true)]);

    let open = Fake::default().mapping(&own, "dm-0", "253:0", "sdb");
    close_half_made(&open, &own, &[]).unwrap();
    let mut mounted = Fake::default().mapping(&own, "dm-0", "253:0", "sdb");
    mounted.open.clear();
    close_half_made(&mounted, &own, &[entry("253:0", "/somewhere", "ext4")]).unwrap();
    assert_eq!(open.closed(), []);
    assert_eq!(mounted.closed(), []);
}

#[test]
fn unstage_sees_the_volume_published_through_its_mapping_or_its_disk() {
    let own = luks::mapping_name(VOL);
    let staging = Path::new("/staging");
    let mut host = Fake::default()
        .mapping(&own, "dm-0", "253:0", "sdb")
        .mapping(&luks::mapping_name("vol-b"), "dm-1", "253:1", "sdc")
        .mounted("253:0", "/staging")
        .mounted("253:0", "/pods/a/mount")
        .mounted("253:1", "/pods/b/mount");
    host.nodes.insert("/pods/c/dev".into(), "253:0".into());
    host.table.push(entry("0:5", "/pods/c/dev", "devtmpfs"));
    let found = still_published(&host, &host.table, VOL, Some("253:0"), &[staging]);
    assert_eq!(
        found,
        [PathBuf::from("/pods/a/mount"), "/pods/c/dev".into()]
    );
    let none = still_published(&host, &host.table, "vol-c", Some("8:48"), &[staging]);
    assert!(none.is_empty());
}
