//! The flags both harnesses give each control-plane binary, from
//! `e2e/control-plane/<binary>.flags` (the real-nodes harness's bash reads
//! the same files; their README says why each harness adds its own extras).
//! One argument a line; a line whose first non-blank character is `#`, and
//! a blank line, are skipped; `${NAME}` is replaced by the caller's value
//! for NAME. Nothing else is interpreted: a placeholder without a value, or
//! a `$` that starts no `${NAME}`, is an error rather than a flag sent half
//! filled.

pub const ETCD: &str = include_str!("../control-plane/etcd.flags");
pub const KUBE_APISERVER: &str = include_str!("../control-plane/kube-apiserver.flags");
pub const KUBE_CONTROLLER_MANAGER: &str =
    include_str!("../control-plane/kube-controller-manager.flags");
pub const KUBE_SCHEDULER: &str = include_str!("../control-plane/kube-scheduler.flags");

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("no value for ${{{name}}} in {line:?}")]
    Unknown { name: String, line: String },
    #[error("a $ that starts no ${{NAME}} in {line:?}")]
    Stray { line: String },
}

/// The arguments of `text` (a `.flags` file) with every placeholder filled
/// from `values` (name, value).
pub fn render<V: AsRef<str>>(text: &str, values: &[(&str, V)]) -> Result<Vec<String>, Error> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| fill(l, values))
        .collect()
}

/// `line` with each `${NAME}` replaced by its value; values are not scanned
/// again, so a `$` in one is kept as it is.
fn fill<V: AsRef<str>>(line: &str, values: &[(&str, V)]) -> Result<String, Error> {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let name = after
            .strip_prefix('{')
            .and_then(|s| s.split_once('}'))
            .map(|(name, _)| name)
            .filter(|n| is_name(n))
            .ok_or_else(|| Error::Stray { line: line.into() })?;
        let value = values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_ref())
            .ok_or_else(|| Error::Unknown {
                name: name.into(),
                line: line.into(),
            })?;
        out.push_str(value);
        rest = &after[name.len() + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A shell variable's name, as the bash side matches it.
fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every placeholder any file uses, as a harness would fill them.
    const ALL: &[(&str, &str)] = &[
        ("STATE", "/s"),
        ("PKI", "/s/pki"),
        ("LOG", "/s/log"),
        ("ETCD_NAME", "n"),
        ("ETCD_PORT", "1"),
        ("ETCD_PEER_PORT", "2"),
        ("API_IP", "10.0.0.1"),
        ("API_PORT", "3"),
        ("SECURE_PORT", "4"),
    ];

    const FILES: [(&str, &str); 4] = [
        ("etcd", ETCD),
        ("kube-apiserver", KUBE_APISERVER),
        ("kube-controller-manager", KUBE_CONTROLLER_MANAGER),
        ("kube-scheduler", KUBE_SCHEDULER),
    ];

    #[test]
    fn every_placeholder_of_every_file_is_filled() {
        for (name, text) in FILES {
            let args = render(text, ALL).unwrap();
            assert!(!args.is_empty(), "{name}");
            for a in &args {
                assert!(a.starts_with("--") && !a.contains('$'), "{name}: {a}");
            }
        }
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_and_lines_trimmed() {
        let text = "# a reason\n\n  --a=${STATE}/x  \n   # indented comment\n--b\n";
        assert_eq!(render(text, ALL).unwrap(), ["--a=/s/x", "--b"]);
    }

    #[test]
    fn several_placeholders_in_one_line_and_values_left_as_they_are() {
        let text = "--initial-cluster=${ETCD_NAME}=http://h:${ETCD_PEER_PORT}";
        assert_eq!(
            render(text, ALL).unwrap(),
            ["--initial-cluster=n=http://h:2"]
        );
        assert_eq!(
            render("--x=${V}${V}", &[("V", "$1{")]).unwrap(),
            ["--x=$1{$1{"]
        );
    }

    #[test]
    fn a_placeholder_without_a_value_is_an_error() {
        assert_eq!(
            render("--a=${STATE}\n--b=${NOPE}", ALL),
            Err(Error::Unknown {
                name: "NOPE".into(),
                line: "--b=${NOPE}".into()
            })
        );
        assert!(render(KUBE_APISERVER, &[("STATE", "/s")]).is_err());
    }

    #[test]
    fn a_dollar_outside_a_placeholder_is_an_error() {
        for line in ["--a=$STATE", "--a=${STATE", "--a=${}", "--a=${1X}", "--a=$"] {
            assert_eq!(
                render(line, ALL),
                Err(Error::Stray { line: line.into() }),
                "{line}"
            );
        }
    }
}
