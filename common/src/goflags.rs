//! The Go driver's process flags, read before the command line parser so
//! that manifests written for the Go driver (its docs/deploy manifests and
//! Helm chart: `-v=5`, `--metrics-address=:8080`) start this one after an
//! image swap.
//!
//! Go's `flag` package takes `-name` and `--name`, `=value` or the next
//! argument; klog (k8s.io/klog/v2 klog.go `InitFlags`) adds its flags to
//! both Go binaries; `--kubeconfig` and `--metrics-path` are the binaries'
//! own (sergelogvinov/proxmox-csi-plugin cmd/controller/main.go,
//! cmd/node/main.go).

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// klog's flags that take a value; each is accepted and has no effect here.
const KLOG_VALUED: &[&str] = &[
    "log_dir",
    "log_file",
    "log_file_max_size",
    "stderrthreshold",
    "alsologtostderrthreshold",
    "vmodule",
    "log_backtrace_at",
];

/// klog's boolean flags; each is accepted and has no effect here.
const KLOG_BOOL: &[&str] = &[
    "logtostderr",
    "alsologtostderr",
    "add_dir_header",
    "skip_headers",
    "skip_log_headers",
    "one_output",
    "legacy_stderr_threshold_behavior",
];

/// What the Go flags asked for, and what they left unsaid.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GoFlags {
    /// klog's `-v`.
    pub verbosity: Option<u8>,
    /// `--kubeconfig`: the kubeconfig to use instead of the in-cluster one.
    pub kubeconfig: Option<PathBuf>,
    /// One line per Go flag given that has no effect here, saying why.
    pub ignored: Vec<String>,
}

impl GoFlags {
    /// The log level klog's `-v=N` stands for. The Go manifests pass `-v=5`
    /// as their everyday level, so up to 5 is `info`.
    pub fn log_level(&self) -> Option<&'static str> {
        self.verbosity.map(|v| match v {
            0..=5 => "info",
            6..=7 => "debug",
            _ => "trace",
        })
    }
}

/// Splits `args` (the program name first) into what the command line parser
/// reads, with Go's single-dash long flags given two dashes, and the Go
/// flags this module reads. `own_long`: the long flags the binary itself
/// has, which a single dash may spell too.
pub fn translate(
    args: impl IntoIterator<Item = OsString>,
    own_long: &[&str],
) -> Result<(Vec<OsString>, GoFlags), String> {
    let mut args = args.into_iter();
    let mut out: Vec<OsString> = args.next().into_iter().collect();
    let mut go = GoFlags::default();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(args.by_ref());
            break;
        }
        let Some(flag) = text.strip_prefix("--").or_else(|| text.strip_prefix('-')) else {
            out.push(arg);
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => args
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| format!("flag -{what} needs a value")),
            }
        };
        match name {
            "v" => {
                let v = value("v")?;
                go.verbosity = Some(v.parse().map_err(|_| {
                    format!("flag -v={v}: klog's verbosity is a number from 0 to 255")
                })?);
            }
            "kubeconfig" => go.kubeconfig = Some(PathBuf::from(value("kubeconfig")?)),
            "metrics-path" => {
                let v = value("metrics-path")?;
                if v != "/metrics" {
                    go.ignored.push(format!(
                        "--metrics-path={v}: metrics are served at /metrics (the Go driver \
                         served them there too, whatever this flag said)"
                    ));
                }
            }
            "master" => {
                let v = value("master")?;
                go.ignored.push(format!(
                    "--master={v}: the API server is the in-cluster one or the kubeconfig's"
                ));
            }
            n if KLOG_VALUED.contains(&n) => {
                let v = value(n)?;
                go.ignored.push(format!(
                    "-{n}={v}: klog's; logs go to stderr, formatted by --log-format"
                ));
            }
            n if KLOG_BOOL.contains(&n) => {
                go.ignored.push(format!(
                    "-{flag}: klog's; logs go to stderr, formatted by --log-format"
                ));
            }
            n if n.len() > 1 && !text.starts_with("--") && own_long.contains(&n) => {
                out.push(format!("-{text}").into());
            }
            _ => out.push(arg),
        }
    }
    Ok((out, go))
}

/// `A` from this process's arguments, the Go driver's flags read first
/// (`A`'s own long flags may be spelled with one dash, as Go's are).
pub fn parse_args<A: clap::Parser>() -> Result<(A, GoFlags), String> {
    let cmd = A::command();
    let own: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
    let (argv, go) = translate(std::env::args_os(), &own)?;
    Ok((A::parse_from(argv), go))
}

impl GoFlags {
    /// Logs each Go flag that was given and has no effect here.
    pub fn warn_ignored(&self) {
        for flag in &self.ignored {
            tracing::warn!(%flag, "a flag of the Go driver is accepted and has no effect");
        }
    }
}

/// A listen address as Go writes it too: `:8080` is every IPv4 address.
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{s:?}: the port is not a number from 0 to 65535"))?;
        return Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not an address: host:port or :port"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> (Vec<String>, GoFlags) {
        let (out, go) =
            translate(args.iter().map(OsString::from), &["csi-address", "node-id"]).unwrap();
        (
            out.into_iter().map(|a| a.into_string().unwrap()).collect(),
            go,
        )
    }

    #[test]
    fn go_manifest_arguments_become_ours() {
        // docs/deploy/proxmox-csi-plugin-release.yml, the node container.
        let (out, go) = t(&[
            "node",
            "-v=5",
            "--csi-address=unix:///csi/csi.sock",
            "--node-id=worker-1",
        ]);
        assert_eq!(
            out,
            [
                "node",
                "--csi-address=unix:///csi/csi.sock",
                "--node-id=worker-1"
            ]
        );
        assert_eq!(go.verbosity, Some(5));
        assert_eq!(go.log_level(), Some("info"));
        assert!(go.ignored.is_empty());
    }

    #[test]
    fn single_dash_long_flags_and_klog_flags() {
        let (out, go) = t(&[
            "node",
            "-csi-address",
            "unix:///x.sock",
            "-v",
            "8",
            "-logtostderr=true",
            "--vmodule",
            "x=2",
            "--kubeconfig=/etc/kube.conf",
            "--metrics-path=/m",
            "-h",
            "--",
            "-v=1",
        ]);
        assert_eq!(
            out,
            [
                "node",
                "--csi-address",
                "unix:///x.sock",
                "-h",
                "--",
                "-v=1"
            ]
        );
        assert_eq!(go.log_level(), Some("trace"));
        assert_eq!(go.kubeconfig, Some(PathBuf::from("/etc/kube.conf")));
        assert_eq!(go.ignored.len(), 3, "{:?}", go.ignored);
        assert!(go.ignored[0].starts_with("-logtostderr=true: klog's"));
        assert!(go.ignored[2].contains("served at /metrics"));
    }

    #[test]
    fn bad_values_say_which_flag() {
        let e = translate(["x", "-v=loud"].map(OsString::from), &[]).unwrap_err();
        assert!(e.starts_with("flag -v=loud"), "{e}");
        let e = translate(["x", "--kubeconfig"].map(OsString::from), &[]).unwrap_err();
        assert_eq!(e, "flag -kubeconfig needs a value");
    }

    #[test]
    fn listen_addresses_as_go_writes_them() {
        assert_eq!(
            listen_addr(":8080").unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
        assert_eq!(listen_addr("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert!(listen_addr(":http").unwrap_err().contains("port"));
        assert!(listen_addr("8080").is_err());
    }
}
