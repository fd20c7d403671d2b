//! Logging setup: human-readable or JSON lines on stderr, level from a flag
//! or `RUST_LOG` (the flag wins when given).

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("log format {other:?} is not one of: text, json")),
        }
    }
}

/// Installs the global subscriber. `level` is an `EnvFilter` directive such as
/// `info` or `proxmox_csi_controller=debug,info`.
pub fn init(format: LogFormat, level: Option<&str>) -> Result<(), String> {
    let filter = match level {
        Some(l) => EnvFilter::try_new(l).map_err(|e| format!("log level {l:?}: {e}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| format!("installing the log subscriber: {e}"))
}
