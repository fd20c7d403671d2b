//! Output that fits a terminal: aligned tables, colour on a TTY, or JSON
//! for scripts (`-o json`).

use std::io::IsTerminal;

use crate::clean::{Orphan, Verdict};
use crate::doctor::{Finding, Severity};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Rows as columns padded to the widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.clone()));
        out.push('\n');
    }
    out
}

fn paint(severity: Severity, text: &str, colour: bool) -> String {
    if !colour {
        return text.to_string();
    }
    let code = match severity {
        Severity::Ok => "32",
        Severity::Info => "36",
        Severity::Warning => "33",
        Severity::Error => "31",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

pub fn findings(list: &[Finding], format: Format) -> String {
    if format == Format::Json {
        return serde_json::to_string_pretty(list).unwrap_or_default();
    }
    let colour = std::io::stdout().is_terminal();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|x| {
            let sev = format!("{:?}", x.severity).to_uppercase();
            vec![
                paint(x.severity, &sev, colour),
                x.check.to_string(),
                x.subject.clone(),
                x.finding.clone(),
                x.remedy.clone(),
            ]
        })
        .collect();
    table(&["STATUS", "CHECK", "SUBJECT", "FINDING", "REMEDY"], &rows)
}

pub fn orphans(list: &[Orphan], format: Format) -> String {
    if format == Format::Json {
        return serde_json::to_string_pretty(list).unwrap_or_default();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|o| {
            vec![
                o.region.clone(),
                o.node.clone(),
                o.volid.clone(),
                format!("{:.1} GiB", o.size as f64 / f64::from(1u32 << 30)),
                o.age_days
                    .map(|d| format!("{d} d"))
                    .unwrap_or_else(|| "?".into()),
                o.cluster_id.clone().unwrap_or_else(|| "-".into()),
                match &o.verdict {
                    Verdict::Delete => "delete".into(),
                    Verdict::Keep(k) => k.to_string(),
                },
            ]
        })
        .collect();
    table(
        &[
            "REGION",
            "NODE",
            "DISK",
            "SIZE",
            "AGE",
            "CLUSTER",
            "WITH --yes",
        ],
        &rows,
    )
}
