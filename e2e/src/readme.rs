//! The README's install commands, read from the README itself, and a shell
//! to run them as a user would, so the tests run exactly what a user copies.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, bail};

use crate::process::bin_path;

/// The repository's root directory.
pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The commands of docs/install.md's "Bring your own CA" block (the
/// install with a CA made on the admin's machine), with continuation lines
/// joined, in order.
pub fn install_commands() -> anyhow::Result<Vec<String>> {
    let doc = std::fs::read_to_string(repo_dir().join("docs/install.md"))
        .context("reading docs/install.md")?;
    commands_after(&doc, "## Bring your own CA")
}

/// The README's one-command install (`helm`: its Helm block, else its
/// kustomize block) or removal, as a user copies it.
pub fn readme_command(section: &str, helm: bool) -> anyhow::Result<String> {
    let readme =
        std::fs::read_to_string(repo_dir().join("README.md")).context("reading README.md")?;
    let start = readme
        .find(section)
        .with_context(|| format!("no {section:?} in the README"))?;
    let first = commands_after(&readme[start..], section)?;
    let commands = if helm {
        first
    } else {
        let after_first = readme[start..]
            .find("```sh\n")
            .and_then(|i| {
                readme[start + i + 6..]
                    .find("```")
                    .map(|j| start + i + 6 + j + 3)
            })
            .context("no sh block")?;
        commands_after(&readme[after_first..], "```sh")?
    };
    match commands.as_slice() {
        [one] => Ok(one.clone()),
        other => anyhow::bail!("{section}: one command expected, got {other:?}"),
    }
}

/// The commands of the first ```sh block after `heading`.
pub fn commands_after(text: &str, heading: &str) -> anyhow::Result<Vec<String>> {
    let start = text
        .find(heading)
        .with_context(|| format!("no {heading:?} in the README"))?;
    let block = &text[start..];
    let open = block
        .find("```sh\n")
        .with_context(|| format!("no sh block after {heading:?}"))?
        + "```sh\n".len();
    let close = block[open..].find("```").context("unclosed sh block")?;
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block[open..open + close].lines() {
        let line = line.trim();
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            continue;
        }
        current.push_str(line);
        if !current.trim().is_empty() && !current.trim_start().starts_with('#') {
            commands.push(current.clone());
        }
        current.clear();
    }
    Ok(commands)
}

/// A fresh directory holding the repository's manifests and chart, as a
/// clone has them.
pub fn user_dir() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for d in ["manifests", "charts"] {
        std::os::unix::fs::symlink(repo_dir().join(d), dir.path().join(d))?;
    }
    Ok(dir)
}

/// `bash -euo pipefail -c command` in `dir`, with the workspace's binaries
/// (nodegate-certs, nodegate-check) first on `PATH`, a kubectl cache of its
/// own, and `kubeconfig` as `KUBECONFIG` when given.
pub fn shell(dir: &Path, kubeconfig: Option<&Path>, command: &str) -> anyhow::Result<Output> {
    let certs = bin_path("nodegate-certs");
    let bins = certs.parent().context("no target directory")?;
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", command])
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECACHEDIR", dir.join(".kube-cache"));
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    Ok(cmd.output()?)
}

/// The command's stdout if it succeeded; otherwise an error with both outputs.
pub fn stdout_if_ok(what: &str, out: Output) -> anyhow::Result<String> {
    if !out.status.success() {
        bail!(
            "{what} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn continuation_lines_join_and_comments_drop() {
        let text =
            "x\n**Step**\n\n```sh\n# a comment\nfoo --a \\\n  --b\nbar\n```\n```sh\nbaz\n```\n";
        assert_eq!(
            commands_after(text, "**Step**").unwrap(),
            ["foo --a --b", "bar"]
        );
        assert!(commands_after(text, "**Missing**").is_err());
    }
}
