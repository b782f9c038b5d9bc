//! Only the API server's reviews may make the webhook write a stored Node
//! (the re-taint of a re-registering node, the patch after a status write
//! showing a reboot): the webhook runs with `--path-token-file`, every line
//! of the configuration calls `/mutate/<token>`, and the token is the one in
//! the Secret the webhook mounts. Without it, anyone who reaches a replica's
//! port (host network) or may proxy to its Service can re-gate any node, and
//! in strict mode evict its pods.
//!
//! [`verdict`] decides from what was read; [`check`] only reads.

use std::path::Path;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use nodegate_shared::path_token::{PATH_PREFIX, parse_file};

use crate::container_flags::container_flag;
use crate::installed::Installed;
use crate::report::{Report, Status};
use crate::webhook_config::Hook;

pub const CHECK: &str = "forged reviews";
/// The Secret the shipped StatefulSet mounts the token from.
pub const SECRET: &str = "nodegate-webhook-path";
const SECRET_KEY: &str = "token";

/// What [`verdict`] decides on.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// Each line's entry name and `clientConfig.service.path`.
    pub paths: Vec<(String, Option<String>)>,
    /// The webhook's `--path-token-file`; `None` when it runs without one.
    pub flag: Option<String>,
    /// The Secret's tokens (the one the lines call first; two while a
    /// rotation runs), or why they could not be read.
    pub secret: Result<Vec<String>, String>,
    /// Strict mode is on: a forged review would add the evicting gate.
    pub strict: bool,
}

pub fn verdict(i: &Inputs) -> (Status, String) {
    let fix = "run the README's certificate step (nodegate-certs writes path-token and a patch that points every line at /mutate/<token>), create Secret nodegate/nodegate-webhook-path from it and apply the patch";
    // A failure in both modes: re-gating a node stops scheduling onto it,
    // which anyone who reaches a replica's port could do to every node.
    if i.flag.is_none() {
        let what = if i.strict {
            "re-gate any node and, in strict mode, evict its pods"
        } else {
            "re-gate any node"
        };
        return (
            Status::Fail,
            format!(
                "the webhook runs without --path-token-file: anyone who reaches a replica's port or may proxy to its Service can post a review that makes it {what}; {fix}"
            ),
        );
    }
    let secret = match &i.secret {
        Ok(t) => t,
        Err(why) => {
            return (
                Status::Fail,
                format!(
                    "the webhook reads its path token from Secret {SECRET}, which {why}: it then writes no stored Node, so a rebooted node is not re-gated when its kubelet re-registers; {fix}"
                ),
            );
        }
    };
    let wrong: Vec<String> = i
        .paths
        .iter()
        .filter(|(_, p)| {
            p.as_deref()
                .and_then(|p| p.strip_prefix(PATH_PREFIX))
                .is_none_or(|t| !secret.iter().any(|s| s == t))
        })
        .map(|(name, p)| match p {
            None => format!("{name} (no path)"),
            Some(p) if p.starts_with(PATH_PREFIX) => format!("{name} (another token)"),
            Some(p) => format!("{name} ({p})"),
        })
        .collect();
    if !wrong.is_empty() {
        return (
            Status::Fail,
            format!(
                "lines {} do not call /mutate/<the token of Secret {SECRET}>: the webhook answers them but writes no stored Node, so a rebooted node is not re-gated when its kubelet re-registers; {fix}",
                wrong.join(", ")
            ),
        );
    }
    if secret.len() > 1 {
        return (
            Status::Warn,
            format!(
                "a path token rotation is under way: Secret {SECRET} holds two tokens and the webhook accepts both; run `nodegate-certs rotate-path-token` again to finish it"
            ),
        );
    }
    (
        Status::Pass,
        format!(
            "every line calls /mutate/<token> and the webhook holds that token: only the API server's reviews can make it write a Node; forged ones are answered and change nothing{}",
            if i.strict {
                " (strict mode's evicting gate included)"
            } else {
                ""
            }
        ),
    )
}

fn paths(entries: &[MutatingWebhook]) -> Vec<(String, Option<String>)> {
    entries
        .iter()
        .map(|e| {
            let path = e
                .client_config
                .service
                .as_ref()
                .and_then(|s| s.path.clone());
            (e.name.clone(), path)
        })
        .collect()
}

fn tokens(text: &str) -> Result<Vec<String>, String> {
    parse_file(text)
        .map(|t| t.into_iter().map(str::to_string).collect())
        .map_err(|why| format!("holds no usable token ({why})"))
}

/// The Secret's key as mounted in the check's Pod: the same tokens, read
/// without permission to get the Secret.
async fn mounted(path: &Path) -> Result<Vec<String>, String> {
    let shown = path.display();
    match tokio::fs::read_to_string(path).await {
        Ok(text) => tokens(&text).map_err(|why| format!("(mounted at {shown}) {why}")),
        Err(e) => Err(format!(
            "cannot be read where --path-token-file says it is mounted, {shown} ({e})"
        )),
    }
}

async fn secret(client: &Client, ns: &str) -> Result<Vec<String>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    match api.get_opt(SECRET).await {
        Ok(Some(s)) => {
            let bytes = s
                .data
                .and_then(|d| d.get(SECRET_KEY).cloned())
                .ok_or_else(|| format!("has no key {SECRET_KEY}"))?;
            let text = String::from_utf8(bytes.0).map_err(|_| "holds no text".to_string())?;
            tokens(&text)
        }
        Ok(None) => Err("does not exist".into()),
        Err(e) => Err(format!("cannot be read ({e})")),
    }
}

/// Reads the lines' paths, the webhook's flag and the Secret (from
/// `token_file` when given: the Secret mounted); reports [`verdict`].
/// Skipped when the configuration or the webhook could not be read (other
/// lines say why). `namespace`: the webhook's, where its Secret is.
pub async fn check(
    client: &Client,
    namespace: &str,
    token_file: Option<&Path>,
    hook: Option<&Hook>,
    installed: &Installed,
    strict: bool,
    report: &mut Report,
) {
    let (Some(hook), Some(c)) = (hook, installed.webhook.container()) else {
        report.add(
            CHECK,
            Status::Skip,
            "the webhook configuration or the webhook's container could not be read (see above)",
        );
        return;
    };
    let flag = container_flag(c, "--path-token-file", "NODEGATE_PATH_TOKEN_FILE")
        .into_iter()
        .next();
    let inputs = Inputs {
        paths: paths(&hook.entries),
        secret: if flag.is_some() {
            match token_file {
                Some(path) => mounted(path).await,
                None => secret(client, namespace).await,
            }
        } else {
            Err("not read".into())
        },
        flag,
        strict,
    };
    let (status, detail) = verdict(&inputs);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0f3a9d2c4e6b8a1f0c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f";
    const NEW: &str = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f";

    fn inputs(
        paths: &[Option<&str>],
        flag: bool,
        // Comma-separated: two tokens while a rotation runs.
        secret: Result<&str, &str>,
        strict: bool,
    ) -> Inputs {
        Inputs {
            paths: paths
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("line{i}"), p.map(str::to_string)))
                .collect(),
            flag: flag.then(|| "/etc/nodegate/path/token".to_string()),
            secret: secret
                .map(|t| t.split(',').map(str::to_string).collect())
                .map_err(str::to_string),
            strict,
        }
    }

    /// The Secret's key as a Pod mounts it reads as the Secret does.
    #[tokio::test]
    async fn a_mounted_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, format!("{NEW}\n{TOKEN}\n")).unwrap();
        assert_eq!(mounted(&path).await.unwrap(), vec![NEW, TOKEN]);
        std::fs::write(&path, "short\n").unwrap();
        let why = mounted(&path).await.unwrap_err();
        assert!(why.contains("holds no usable token"), "{why}");
        let why = mounted(&dir.path().join("absent")).await.unwrap_err();
        assert!(
            why.contains("cannot be read where --path-token-file says"),
            "{why}"
        );
    }

    #[test]
    fn each_install() {
        let good = format!("/mutate/{TOKEN}");
        let both = format!("{NEW},{TOKEN}");
        let cases = [
            (
                inputs(&[Some(&good), Some(&good)], true, Ok(TOKEN), true),
                Status::Pass,
                "only the API server's reviews",
            ),
            (
                inputs(&[Some("/mutate")], false, Err("not read"), false),
                Status::Fail,
                "anyone who reaches a replica's port or may proxy to its Service can post a review that makes it re-gate any node;",
            ),
            (
                inputs(&[Some("/mutate")], false, Err("not read"), true),
                Status::Fail,
                "makes it re-gate any node and, in strict mode, evict its pods;",
            ),
            (
                inputs(&[Some(&good), Some("/mutate")], true, Ok(TOKEN), false),
                Status::Fail,
                "line1 (/mutate)",
            ),
            (
                inputs(&[None], true, Ok(TOKEN), false),
                Status::Fail,
                "line0 (no path)",
            ),
            (
                inputs(
                    &[Some("/mutate/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")],
                    true,
                    Ok(TOKEN),
                    false,
                ),
                Status::Fail,
                "line0 (another token)",
            ),
            (
                inputs(&[Some(&good)], true, Ok(&both), false),
                Status::Warn,
                "a path token rotation is under way",
            ),
            (
                inputs(&[Some(&format!("/mutate/{NEW}"))], true, Ok(&both), false),
                Status::Warn,
                "run `nodegate-certs rotate-path-token` again",
            ),
            (
                inputs(&[Some(&good)], true, Err("does not exist"), false),
                Status::Fail,
                "which does not exist",
            ),
        ];
        for (i, want, text) in cases {
            let (s, d) = verdict(&i);
            assert_eq!(s, want, "{i:?}: {d}");
            assert!(d.contains(text), "{i:?}: {d}");
        }
    }
}
