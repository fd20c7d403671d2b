//! CSI mount flags as single options, read the same way by the node plugin
//! (which checks them) and hostd (which mounts with them).

/// Splits CSI mount flags into single options: one entry may hold several
/// (`"noatime,discard"`, as mount(8) and the Go driver take a
/// StorageClass's `mountOptions`), but not inside double quotes
/// (`context="system_u:object_r:container_file_t:s0:c1,c2"`). Empty options
/// are dropped.
pub fn split(flags: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for f in flags {
        let (mut cur, mut quoted) = (String::new(), false);
        for c in f.chars() {
            match c {
                '"' => {
                    quoted = !quoted;
                    cur.push(c);
                }
                ',' if !quoted => out.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        out.push(cur);
    }
    out.into_iter()
        .map(|o| o.trim().to_string())
        .filter(|o| !o.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_split_outside_quotes_only() {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            split(&v(&["noatime,discard", "", "context=\"a:b:c1,c2\",ro,"])),
            v(&["noatime", "discard", "context=\"a:b:c1,c2\"", "ro"])
        );
    }
}
