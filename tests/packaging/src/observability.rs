//! The chart's Grafana dashboard and alerts against what the binaries
//! really expose: every metric a query names must be a series some binary
//! served, every label it matches or groups by one that series carries.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::parser::{self, Expr, LabelModifier};

/// Labels Prometheus attaches to every scraped series (Prometheus docs,
/// "Jobs and instances": `job` and `instance`).
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Series names and the label names each was seen with, from `/metrics`
/// answers in the OpenMetrics text format.
#[derive(Debug, Default)]
pub struct Exposed {
    series: BTreeMap<String, BTreeSet<String>>,
    /// Each sample's labels with their values, by series name.
    samples: BTreeMap<String, Vec<BTreeMap<String, String>>>,
}

impl Exposed {
    /// Adds one scrape's samples (comment lines carry no series).
    pub fn add(&mut self, text: &str) -> Result<(), String> {
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name, labels) = sample(line).ok_or_else(|| format!("not a sample: {line}"))?;
            self.series
                .entry(name.clone())
                .or_default()
                .extend(labels.iter().map(|(k, _)| k.clone()));
            self.samples
                .entry(name)
                .or_default()
                .push(labels.into_iter().collect());
        }
        Ok(())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.series.keys().map(String::as_str)
    }

    /// Whether a served sample matches `vs`'s equality matchers (other
    /// matchers and the target labels are not judged).
    fn matches(&self, vs: &promql_parser::parser::VectorSelector) -> bool {
        let Some(name) = &vs.name else { return false };
        self.samples.get(name).into_iter().flatten().any(|labels| {
            vs.matchers.matchers.iter().all(|m| {
                m.name == "__name__"
                    || TARGET_LABELS.contains(&m.name.as_str())
                    || !matches!(m.op, promql_parser::label::MatchOp::Equal)
                    || labels.get(&m.name) == Some(&m.value)
            })
        })
    }

    /// Whether any series of `name` was served.
    pub fn has(&self, name: &str) -> bool {
        self.series.contains_key(name)
    }

    /// Served labels that a scrape through prometheus-operator would rename
    /// (`exported_<name>`), each as `series: label`.
    pub fn target_label_clashes(&self) -> Vec<String> {
        self.series
            .iter()
            .flat_map(|(name, labels)| {
                labels
                    .iter()
                    .filter(|l| OPERATOR_TARGET_LABELS.contains(&l.as_str()))
                    .map(move |l| format!("{name}: {l}"))
            })
            .collect()
    }
}

/// The labels prometheus-operator puts on the targets of a PodMonitor or
/// ServiceMonitor (prometheus-operator pkg/prometheus/promcfg.go,
/// generatePodMonitorConfig and generateServiceMonitorConfig: namespace,
/// container, pod, job, endpoint, service), and Prometheus's instance. With
/// `honorLabels` off, the default, Prometheus renames a served label of the
/// same name to `exported_<name>`, so a query on it reads the target's.
pub const OPERATOR_TARGET_LABELS: [&str; 7] = [
    "namespace",
    "container",
    "pod",
    "job",
    "endpoint",
    "service",
    "instance",
];

/// `GET /metrics` on 127.0.0.1:`port`: the body of a 200 answer.
pub fn scrape(port: u16) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("metrics on port {port}: {e}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer on port {port}: {answer}"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!("metrics on port {port}: {head}"));
    }
    Ok(body.to_string())
}

/// A sample's labels in the order served (values as written, escapes kept).
pub type Labels = Vec<(String, String)>;

/// One served sample: its name, labels and value.
pub type Sample = (String, Labels, String);

/// Every sample of a `/metrics` answer in the OpenMetrics text format.
pub fn samples(text: &str) -> Result<Vec<Sample>, String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (name, labels, rest) =
                sample_with_rest(line).ok_or_else(|| format!("not a sample: {line}"))?;
            let value = rest
                .split_whitespace()
                .next()
                .ok_or_else(|| format!("a sample without a value: {line}"))?;
            Ok((name, labels, value.to_string()))
        })
        .collect()
}

/// `name{a="x",b="y\"z"} 1` → (`name`, [(a, x), (b, y\"z)]).
fn sample(line: &str) -> Option<(String, Labels)> {
    sample_with_rest(line).map(|(name, labels, _)| (name, labels))
}

/// The name and labels of a sample line, and the text after them.
fn sample_with_rest(line: &str) -> Option<(String, Labels, &str)> {
    let end = line.find(['{', ' '])?;
    let name = line[..end].to_string();
    let mut labels = Vec::new();
    let mut rest = &line[end..];
    if rest.starts_with('{') {
        rest = &rest[1..];
        while !rest.starts_with('}') {
            let eq = rest.find('=')?;
            let label = rest[..eq].trim_start_matches(',').to_string();
            rest = rest[eq + 1..].strip_prefix('"')?;
            // The value ends at the first quote not escaped by a backslash.
            let mut escaped = false;
            let close = rest.char_indices().find_map(|(i, c)| {
                let end = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                end.then_some(i)
            })?;
            labels.push((label, rest[..close].to_string()));
            rest = &rest[close + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
        rest = &rest[1..];
    }
    Some((name, labels, rest))
}

/// One query of the dashboard or the alerts, and where it is.
#[derive(Debug, Clone)]
pub struct Query {
    pub place: String,
    pub expr: String,
}

/// The queries of the dashboard's panels. Grafana's `$__rate_interval` is
/// read as the range it stands for.
pub fn dashboard_queries(json: &str) -> Result<Vec<Query>, String> {
    let d: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for panel in d["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().ok_or("a target without expr")?;
            out.push(Query {
                place: format!("panel {:?} {}", panel["title"], target["refId"]),
                expr: expr.replace("$__rate_interval", "5m"),
            });
        }
    }
    Ok(out)
}

/// The chart's dashboard and alerts, as it ships them.
pub fn chart_queries() -> Result<Vec<Query>, String> {
    let files = crate::repo_root().join("deploy/helm/proxmox-csi-plugin/files");
    let read = |f: &str| {
        std::fs::read_to_string(files.join(f))
            .map_err(|e| format!("{}: {e}", files.join(f).display()))
    };
    let mut out = dashboard_queries(&read("grafana-dashboard.json")?)?;
    out.extend(alert_queries(&read("alerts.yaml")?)?);
    Ok(out)
}

/// The alerts' expressions, from the rule groups file.
pub fn alert_queries(yaml: &str) -> Result<Vec<Query>, String> {
    let v: serde_norway::Value = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for group in v["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            let expr = rule["expr"].as_str().ok_or("a rule without expr")?;
            out.push(Query {
                place: format!("alert {}", rule["alert"].as_str().unwrap_or("?")),
                expr: expr.to_string(),
            });
        }
    }
    Ok(out)
}

/// What is wrong with `q` against `exposed`: nothing when every name and
/// label it reads was served.
pub fn problems(q: &Query, exposed: &Exposed) -> Vec<String> {
    let expr = match parser::parse(&q.expr) {
        Ok(e) => e,
        Err(e) => return vec![format!("{}: not PromQL: {e}", q.place)],
    };
    let mut out = Vec::new();
    walk(&expr, exposed, &mut out);
    out.into_iter()
        .map(|p| format!("{}: {p}", q.place))
        .collect()
}

/// Checks `e`'s selectors and groupings; returns the labels its series may carry.
fn walk(e: &Expr, exposed: &Exposed, out: &mut Vec<String>) -> BTreeSet<String> {
    match e {
        Expr::VectorSelector(vs) => selector(vs, exposed, out),
        Expr::MatrixSelector(m) => selector(&m.vs, exposed, out),
        Expr::Aggregate(a) => {
            let inner = walk(&a.expr, exposed, out);
            if let Some(p) = &a.param {
                walk(p, exposed, out);
            }
            match &a.modifier {
                Some(LabelModifier::Include(by)) => {
                    grouping(&by.labels, &inner, out);
                    by.labels.iter().cloned().collect()
                }
                Some(LabelModifier::Exclude(without)) => {
                    grouping(&without.labels, &inner, out);
                    inner
                        .into_iter()
                        .filter(|l| !without.labels.contains(l))
                        .collect()
                }
                None => BTreeSet::new(),
            }
        }
        Expr::Binary(b) => {
            let mut l = walk(&b.lhs, exposed, out);
            let r = walk(&b.rhs, exposed, out);
            if let Some(m) = &b.modifier
                && let Some(matching) = &m.matching
            {
                let both: BTreeSet<String> = l.intersection(&r).cloned().collect();
                grouping(&matching.labels().labels, &both, out);
            }
            l.extend(r);
            l
        }
        Expr::Unary(u) => walk(&u.expr, exposed, out),
        Expr::Paren(p) => walk(&p.expr, exposed, out),
        Expr::Subquery(s) => walk(&s.expr, exposed, out),
        Expr::Call(c) => {
            // absent(selector) fires while no served sample matches: on a
            // correct install it must match one (Prometheus adds only the
            // target labels, which no matcher here names).
            if c.func.name == "absent"
                && let Some(Expr::VectorSelector(vs)) = c.args.args.first().map(|a| a.as_ref())
                && !exposed.matches(vs)
            {
                out.push(format!("absent({vs}) fires: no served sample matches it"));
            }
            let mut labels = BTreeSet::new();
            for a in &c.args.args {
                labels.extend(walk(a, exposed, out));
            }
            // histogram_quantile consumes the bucket label.
            if c.func.name == "histogram_quantile" {
                if !labels.contains("le") {
                    out.push("histogram_quantile over series without `le`".into());
                }
                labels.remove("le");
            }
            labels
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => BTreeSet::new(),
    }
}

fn selector(
    vs: &promql_parser::parser::VectorSelector,
    exposed: &Exposed,
    out: &mut Vec<String>,
) -> BTreeSet<String> {
    let Some(name) = &vs.name else {
        out.push(format!("a selector without a metric name: {vs}"));
        return BTreeSet::new();
    };
    let Some(labels) = exposed.series.get(name) else {
        out.push(format!("{name} is served by no binary"));
        return BTreeSet::new();
    };
    let matchers = vs
        .matchers
        .matchers
        .iter()
        .chain(vs.matchers.or_matchers.iter().flatten());
    for m in matchers.filter(|m| m.name != "__name__") {
        if !labels.contains(&m.name) && !TARGET_LABELS.contains(&m.name.as_str()) {
            out.push(format!("{name} has no label `{}`", m.name));
        }
    }
    labels
        .iter()
        .cloned()
        .chain(TARGET_LABELS.map(String::from))
        .collect()
}

fn grouping(by: &[String], available: &BTreeSet<String>, out: &mut Vec<String>) {
    for l in by {
        if !available.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
            out.push(format!("grouped by `{l}`, which its series do not carry"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposed() -> Exposed {
        let mut e = Exposed::default();
        e.add(concat!(
            "# TYPE x_requests counter\n",
            "x_requests_total{method=\"A\",code=\"Ok\"} 1\n",
            "x_seconds_bucket{method=\"A\",le=\"0.1\"} 1\n",
            "x_up 1\n",
            "x_odd{v=\"a\\\"b,c=d\"} 2\n",
        ))
        .unwrap();
        e
    }

    fn check(expr: &str) -> Vec<String> {
        problems(
            &Query {
                place: "q".into(),
                expr: expr.into(),
            },
            &exposed(),
        )
    }

    #[test]
    fn a_sample_line_gives_its_name_and_label_names() {
        assert_eq!(
            sample("x_odd{v=\"a\\\"b,c=d\",w=\"\"} 2"),
            Some((
                "x_odd".into(),
                vec![
                    ("v".into(), "a\\\"b,c=d".into()),
                    ("w".into(), String::new())
                ]
            ))
        );
        assert_eq!(sample("x_up 1"), Some(("x_up".into(), vec![])));
        assert_eq!(
            samples(
                "# TYPE x_up gauge\nx_up 1\nx_h_bucket{path=\"/a/{b}\",le=\"+Inf\"} 3 1700000000\n"
            ),
            Ok(vec![
                ("x_up".into(), vec![], "1".into()),
                (
                    "x_h_bucket".into(),
                    vec![
                        ("path".into(), "/a/{b}".into()),
                        ("le".into(), "+Inf".into())
                    ],
                    "3".into()
                )
            ])
        );
    }

    #[test]
    fn names_and_labels_that_exist_pass() {
        assert_eq!(
            check("sum by (method) (rate(x_requests_total{code!=\"Ok\"}[5m]))"),
            Vec::<String>::new()
        );
        assert_eq!(
            check(
                "histogram_quantile(0.99, sum by (le, method, instance) (rate(x_seconds_bucket[5m]))) > 1"
            ),
            Vec::<String>::new()
        );
        assert_eq!(check("absent(x_up)"), Vec::<String>::new());
        assert_eq!(
            check("absent(x_requests_total{method=\"A\"})"),
            Vec::<String>::new()
        );
    }

    /// An absent() alert over a label value no binary serves would fire on
    /// every correct install.
    #[test]
    fn an_absent_alert_that_would_always_fire_is_named() {
        let p = check("absent(x_requests_total{method=\"B\"})");
        assert!(p.len() == 1 && p[0].contains("fires"), "{p:?}");
    }

    #[test]
    fn a_missing_name_or_label_is_named() {
        assert_eq!(check("x_down"), ["q: x_down is served by no binary"]);
        assert_eq!(
            check("x_requests_total{region=\"a\"}"),
            ["q: x_requests_total has no label `region`"]
        );
        assert_eq!(
            check("sum by (phase) (x_requests_total)"),
            ["q: grouped by `phase`, which its series do not carry"]
        );
        assert_eq!(
            check("histogram_quantile(0.5, sum by (method) (rate(x_seconds_bucket[5m])))"),
            ["q: histogram_quantile over series without `le`"]
        );
        assert!(check("sum(")[0].starts_with("q: not PromQL"));
    }
}
