//! Our `csi.proto` must match the published CSI v1.12 definitions on the
//! wire: every message, field (name, number, type, label, oneof, options),
//! enum value, extension, service and method. The reference copy lives in
//! `../shared/proto/csi.proto` beside the repository (override with
//! `CSI_REFERENCE_PROTO`).

// Test code: a failed unwrap is the test failing, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use prost_reflect::{
    Cardinality, DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor,
};

fn reference_path() -> PathBuf {
    std::env::var_os("CSI_REFERENCE_PROTO")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/proto/csi.proto")
        })
}

/// Compiles `file` (found in `dir`) and returns its pool.
fn compile(dir: &Path, file: &str) -> DescriptorPool {
    let mut c = protox::Compiler::new([dir]).expect("protox include path");
    c.include_imports(true);
    c.open_file(file)
        .unwrap_or_else(|e| panic!("compiling {}: {e:?}", dir.join(file).display()));
    c.descriptor_pool()
}

fn render_options(opts: &DynamicMessage) -> String {
    let mut parts: Vec<String> = opts
        .fields()
        .map(|(f, v)| format!("{}={v:?}", f.name()))
        .chain(
            opts.extensions()
                .map(|(e, v)| format!("({})={v:?}", e.full_name())),
        )
        .collect();
    parts.sort();
    format!("[{}]", parts.join(","))
}

fn render_kind(k: &Kind) -> String {
    match k {
        Kind::Message(m) => format!("message {}", m.full_name()),
        Kind::Enum(e) => format!("enum {}", e.full_name()),
        scalar => format!("{scalar:?}"),
    }
}

fn render_field(f: &FieldDescriptor) -> String {
    let label = match f.cardinality() {
        Cardinality::Optional => "optional",
        Cardinality::Required => "required",
        Cardinality::Repeated => "repeated",
    };
    let oneof = f
        .containing_oneof()
        .map(|o| o.name().to_string())
        .unwrap_or_else(|| "-".into());
    format!(
        "field {}.{} = {} {} {} oneof={} presence={} json={} {}",
        f.parent_message().full_name(),
        f.name(),
        f.number(),
        label,
        render_kind(&f.kind()),
        oneof,
        f.supports_presence(),
        f.json_name(),
        render_options(&f.options()),
    )
}

fn describe_message(m: &MessageDescriptor, out: &mut BTreeSet<String>) {
    out.insert(format!(
        "message {} map_entry={} {}",
        m.full_name(),
        m.is_map_entry(),
        render_options(&m.options())
    ));
    for o in m.oneofs() {
        out.insert(format!("oneof {}.{}", m.full_name(), o.name()));
    }
    for f in m.fields() {
        out.insert(render_field(&f));
    }
}

/// One line per descriptor element of the file `name` in `pool`.
fn describe(pool: &DescriptorPool, name: &str) -> BTreeSet<String> {
    let file = pool
        .get_file_by_name(name)
        .unwrap_or_else(|| panic!("{name} not in the pool"));
    let mut out = BTreeSet::new();
    out.insert(format!("package {}", file.package_name()));
    out.insert(format!(
        "syntax {:?}",
        file.file_descriptor_proto().syntax()
    ));
    for dep in file.dependencies() {
        out.insert(format!("import {}", dep.name()));
    }
    out.insert(format!("file options {}", render_options(&file.options())));
    let package = file.package_name().to_string();
    for m in pool.all_messages().filter(|m| m.parent_file() == file) {
        describe_message(&m, &mut out);
    }
    for e in pool.all_enums().filter(|e| e.parent_file() == file) {
        out.insert(format!(
            "enum {} {}",
            e.full_name(),
            render_options(&e.options())
        ));
        for v in e.values() {
            out.insert(format!(
                "value {} = {} {}",
                v.full_name(),
                v.number(),
                render_options(&v.options())
            ));
        }
    }
    for x in file.extensions() {
        out.insert(format!(
            "extension {} extends {} = {} {} {:?}",
            x.full_name(),
            x.containing_message().full_name(),
            x.number(),
            render_kind(&x.kind()),
            x.cardinality()
        ));
    }
    for s in file.services() {
        out.insert(format!(
            "service {} {}",
            s.full_name(),
            render_options(&s.options())
        ));
        for m in s.methods() {
            out.insert(format!(
                "method {} ({}{}) returns ({}{}) {}",
                m.full_name(),
                if m.is_client_streaming() {
                    "stream "
                } else {
                    ""
                },
                m.input().full_name(),
                if m.is_server_streaming() {
                    "stream "
                } else {
                    ""
                },
                m.output().full_name(),
                render_options(&m.options())
            ));
        }
    }
    assert!(
        out.iter().any(|l| l.starts_with("message ")),
        "{package}: no messages"
    );
    out
}

/// Lines present on one side only, labelled.
fn differences(ours: &BTreeSet<String>, reference: &BTreeSet<String>) -> Vec<String> {
    let mut d: Vec<String> = ours
        .difference(reference)
        .map(|l| format!("only in ours:      {l}"))
        .collect();
    d.extend(
        reference
            .difference(ours)
            .map(|l| format!("only in reference: {l}")),
    );
    d
}

fn ours_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto")
}

/// Returns the reference pool, or `None` (test skipped) outside CI when the
/// reference file is absent.
fn reference_pool() -> Option<DescriptorPool> {
    let path = reference_path();
    if !testkit::skip::present(
        path.is_file(),
        &format!("the CSI reference {}", path.display()),
    ) {
        return None;
    }
    let dir = path.parent().expect("reference has a directory");
    Some(compile(dir, "csi.proto"))
}

#[test]
fn our_csi_proto_matches_the_reference_descriptor_by_descriptor() {
    let Some(reference) = reference_pool() else {
        return;
    };
    let ours = describe(&compile(&ours_dir(), "csi.proto"), "csi.proto");
    let theirs = describe(&reference, "csi.proto");
    let diff = differences(&ours, &theirs);
    assert!(
        diff.is_empty(),
        "csi.proto differs from the CSI v1.12 reference in {} descriptor(s):\n{}",
        diff.len(),
        diff.join("\n")
    );
    // Sanity: the comparison covered the whole surface.
    let count = |p: &str| ours.iter().filter(|l| l.starts_with(p)).count();
    assert!(count("message ") > 100, "messages: {}", count("message "));
    assert!(count("field ") > 250, "fields: {}", count("field "));
    assert_eq!(count("service "), 5);
    assert!(count("method ") >= 30);
}

#[test]
fn the_comparison_catches_a_changed_field_number() {
    let Some(reference) = reference_pool() else {
        return;
    };
    let theirs = describe(&reference, "csi.proto");
    let text = std::fs::read_to_string(ours_dir().join("csi.proto")).expect("our csi.proto");
    let needle = "int64 limit_bytes = 2;";
    assert!(text.contains(needle));
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("csi.proto"),
        text.replacen(needle, "int64 limit_bytes = 3;", 1),
    )
    .expect("write mutant");
    let mutant = describe(&compile(dir.path(), "csi.proto"), "csi.proto");
    let diff = differences(&mutant, &theirs);
    assert_eq!(diff.len(), 2, "{diff:#?}");
    assert!(
        diff[0].contains("csi.v1.CapacityRange.limit_bytes = 3"),
        "{diff:#?}"
    );
    assert!(
        diff[1].contains("csi.v1.CapacityRange.limit_bytes = 2"),
        "{diff:#?}"
    );
}

#[test]
fn secrets_are_marked_in_our_proto() {
    let ours = describe(&compile(&ours_dir(), "csi.proto"), "csi.proto");
    let secret_fields = ours
        .iter()
        .filter(|l| l.starts_with("field ") && l.contains("(csi.v1.csi_secret)=Bool(true)"))
        .count();
    // Every `secrets` map of every request carries the marker.
    assert_eq!(secret_fields, 19, "secret-marked fields: {secret_fields}");
}
