//! The error corpus (`pve::errors::CORPUS`) and pvesim agree: every
//! Proxmox text the controller reacts to is one pvesim can answer (or is
//! listed below with why not), and every pvesim text the controller
//! classifies is classified on purpose. pvesim's sources are read as text:
//! its string literals, placeholders filled, are the texts it can answer.

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proxmox_csi_controller::pve::errors::ErrorKind::{self, *};
use proxmox_csi_controller::pve::errors::{CORPUS, Origin, classify};

/// Corpus texts pvesim does not imitate, by their first part, with why.
/// Empty today: pvesim answers every text of the corpus.
const NOT_IMITATED: &[(&str, &str)] = &[];

/// The calls and tasks the controller reads errors from (endpoint templates
/// as `pve::metrics::template` renders them; task types from UPIDs).
const CALLS: &[(&str, &str)] = &[
    ("GET", "/nodes/{node}/storage/{storage}/content/{volume}"),
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"),
    ("GET", "/nodes/{node}/storage/{storage}/content"),
    ("POST", "/nodes/{node}/storage/{storage}/content"),
    ("GET", "/nodes/{node}/storage/{storage}/status"),
    ("GET", "/storage/{storage}"),
    ("GET", "/cluster/resources"),
    ("GET", "/cluster/nextid"),
    ("POST", "/nodes/{node}/qemu"),
    ("DELETE", "/nodes/{node}/qemu/{vmid}"),
    ("GET", "/nodes/{node}/qemu/{vmid}/config"),
    ("POST", "/nodes/{node}/qemu/{vmid}/config"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config"),
    ("GET", "/nodes/{node}/qemu/{vmid}/pending"),
    ("PUT", "/nodes/{node}/qemu/{vmid}/resize"),
];
const TASKS: &[&str] = &[
    "qmconfig",
    "qmcreate",
    "qmdestroy",
    "resize",
    "qmigrate",
    "qmmove",
    "imgdel",
];

/// Every origin, with the status its answer comes with (a task's exit
/// status has none).
fn origins() -> Vec<(Option<u16>, Origin<'static>)> {
    let calls = CALLS
        .iter()
        .map(|&(method, endpoint)| (Some(500), Origin::Call { method, endpoint }));
    let tasks = TASKS.iter().map(|&t| (None, Origin::Task(t)));
    calls.chain(tasks).collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The string literals of a Rust source, escapes resolved (a `\` at the
/// end of a line joins it to the next as rustc does); comments skipped.
fn literals(src: &str) -> Vec<String> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            '/' if b.get(i + 1) == Some(&'/') => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            // A char literal ('"', '\'', 'x'); otherwise a lifetime.
            '\'' if b.get(i + 1) == Some(&'\\') && b.get(i + 3) == Some(&'\'') => i += 4,
            '\'' if b.get(i + 2) == Some(&'\'') => i += 3,
            'r' if (i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_'))
                && matches!(b.get(i + 1), Some('"' | '#')) =>
            {
                let mut j = i + 1;
                while b.get(j) == Some(&'#') {
                    j += 1;
                }
                if b.get(j) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', j - i - 1))
                    .collect();
                let rest: String = b[j + 1..].iter().collect();
                let end = rest.find(&close).expect("unterminated raw string");
                out.push(rest[..end].to_string());
                i = j + 1 + rest[..end].chars().count() + close.chars().count();
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                while b[i] != '"' {
                    if b[i] == '\\' {
                        i += 1;
                        match b[i] {
                            'n' => s.push('\n'),
                            't' => s.push('\t'),
                            '\n' => {
                                while b[i + 1].is_whitespace() {
                                    i += 1;
                                }
                            }
                            c => s.push(c),
                        }
                    } else {
                        s.push(b[i]);
                    }
                    i += 1;
                }
                out.push(s);
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// A format string with each placeholder (`{vmid}`, `{}`) filled.
fn render(literal: &str) -> String {
    let mut out = String::new();
    let mut chars = literal.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push_str("x1");
            }
            c => out.push(c),
        }
    }
    out
}

/// pvesim's texts: its literals, rendered, by file.
fn pvesim_texts() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/pvesim/src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 10,
        "pvesim's sources not found under {root:?}"
    );
    let mut out = Vec::new();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        let name = f.strip_prefix(&root).unwrap().display().to_string();
        for l in literals(&src) {
            out.push((name.clone(), render(&l)));
        }
    }
    out
}

#[test]
fn the_literal_reader_reads_rust_strings() {
    let src = r##"let a = "x \"q\" {y}"; // "not this"
        let c = '"'; let d = '\''; fn f<'a>(_: &'a str) {}
        let b = r#"raw "one""#; let e = "joined \
            here";"##;
    assert_eq!(literals(src), ["x \"q\" {y}", "raw \"one\"", "joined here"]);
    assert_eq!(render("VM {vmid} is {{x}} {}"), "VM x1 is {x} x1");
}

/// Every corpus text is one pvesim answers, and classified as its entry
/// says where the entry believes it.
#[test]
fn every_corpus_text_is_one_pvesim_answers() {
    let texts = pvesim_texts();
    let origins = origins();
    for k in CORPUS {
        if NOT_IMITATED.iter().any(|(first, _)| *first == k.parts[0]) {
            continue;
        }
        let found: Vec<&(String, String)> = texts
            .iter()
            .filter(|(_, t)| origins.iter().any(|(_, o)| k.matches(t, o)))
            .collect();
        assert!(
            !found.is_empty(),
            "no pvesim text holds {:?} ({}); imitate it in pvesim or list it in NOT_IMITATED",
            k.parts,
            k.source
        );
        for (file, text) in found {
            for (status, o) in origins.iter().filter(|(_, o)| k.matches(text, o)) {
                assert_eq!(
                    classify(*status, text, *o),
                    k.kind,
                    "pvesim {file}: {text:?} at {o:?}: an earlier corpus entry takes it"
                );
            }
        }
    }
    for (first, why) in NOT_IMITATED {
        assert!(
            CORPUS.iter().any(|k| k.parts[0] == *first) && !why.is_empty(),
            "NOT_IMITATED names {first:?}, which is not in the corpus, or says no why"
        );
    }
}

/// What pvesim answers that the controller classifies, text by text: a new
/// pvesim text a corpus entry takes (rightly or by accident) shows up here
/// and is added on purpose. The keys are the rendered texts (placeholders
/// are `x1`); a text may take different kinds at different origins.
const CLASSIFIED: &[(&str, &[ErrorKind])] = &[
    // Missing objects.
    (
        "Configuration file 'nodes/x1/qemu-server/x1.conf' does not exist",
        &[NotFound],
    ),
    ("storage 'x1' does not exist", &[NotFound]),
    (
        "can't activate LV '/dev/x1/x1':   Failed to find logical volume \"x1/x1\"",
        &[NotFound],
    ),
    (
        "can't get size of '/dev/x1/x1':   Failed to find logical volume \"x1/x1\"",
        &[NotFound],
    ),
    ("no such logical volume x1/x1", &[NotFound]),
    (
        "zfs error: cannot open 'rpool/data/x1': dataset does not exist",
        &[NotFound],
    ),
    (
        "rbd error: rbd: error opening image x1: (2) No such file or directory",
        &[NotFound],
    ),
    // Locks.
    ("VM is locked (x1)", &[Busy]),
    (
        "can't lock file '/var/lock/pve-manager/pve-storage-x1' - got timeout",
        &[Busy],
    ),
    (
        "can't lock file '/var/lock/qemu-server/lock-x1.conf' - got timeout",
        &[Busy],
    ),
    (
        "cfs-lock 'storage-x1' error: got lock request timeout",
        &[Busy],
    ),
    // Races and live changes.
    (
        "checksum mismatch (file change by other user?)",
        &[DigestMismatch],
    ),
    (
        "detected modified configuration - file changed by other user? Try again.",
        &[DigestMismatch],
    ),
    ("hotplug problem - x1", &[HotplugFailed]),
    (
        "hotplug problem - error on hot-unplugging device 'x1'x1",
        &[HotplugFailed],
    ),
    // pvesim's own test of a task's exit status, before and after it is
    // made one line.
    (
        "400 Parameter verification failed.\nscsi1: hotplug problem - x\n",
        &[HotplugFailed],
    ),
    (
        "400 Parameter verification failed. scsi1: hotplug problem - x",
        &[HotplugFailed],
    ),
    // Existing objects.
    (
        "disk image '/var/lib/vz-x1/images/x1/x1' already exists",
        &[AlreadyExists],
    ),
    (
        "unable to create VM x1 - VM x1 already exists on node 'x1'",
        &[AlreadyExists],
    ),
    // pvesim's parameter error of /cluster/nextid (api/cluster.rs): the
    // corpus's "VM … already exists" takes it only at a VM's creation, where
    // pvesim does not answer it; it is listed because the origins here are
    // every origin, not the one pvesim answers it at.
    ("VM x1 already exists", &[AlreadyExists]),
    // Privileges.
    ("Permission check failed", &[PermissionDenied]),
    ("Permission check failed (x1, x1)", &[PermissionDenied]),
    (
        "Permission check failed (user != root@pam)",
        &[PermissionDenied],
    ),
    // The cluster.
    ("cluster not ready - no quorum?", &[Transient]),
    ("cfs-lock 'storage-x1' error: no quorum!", &[Transient]),
    (
        "unable to open file '/etc/pve/nodes/x1/qemu-server/x1.conf.tmp.x1' - Permission denied",
        &[Transient],
    ),
];

/// Every pvesim text `classify` gives a kind is matched by a corpus entry
/// of that kind at that origin (nothing is classified but by the corpus),
/// and is one of the texts listed in `CLASSIFIED`.
#[test]
fn every_pvesim_text_classified_is_classified_on_purpose() {
    let origins = origins();
    let mut seen: BTreeMap<String, Vec<ErrorKind>> = BTreeMap::new();
    for (file, text) in pvesim_texts() {
        for (status, o) in &origins {
            let kind = classify(*status, &text, *o);
            if kind == Other {
                continue;
            }
            assert!(
                CORPUS.iter().any(|k| k.kind == kind && k.matches(&text, o)),
                "pvesim {file}: {text:?} at {o:?} is {kind:?} by no corpus entry"
            );
            let kinds = seen.entry(text.clone()).or_default();
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
    }
    let expected: BTreeMap<String, Vec<ErrorKind>> = CLASSIFIED
        .iter()
        .map(|(t, k)| (t.to_string(), k.to_vec()))
        .collect();
    assert_eq!(seen, expected);
}
