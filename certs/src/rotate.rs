//! `nodegate-certs rotate-path-token`: a new path token, with no review of
//! the API server refused its side effect and no line left calling a token
//! the replicas do not accept.
//!
//! 1. The Secret holds the new token and the old (the webhook accepts every
//!    token its file holds).
//! 2. The StatefulSet rolls, so every replica has read both: a Secret
//!    volume is filled at the Pod's start, while a running Pod sees an update
//!    only at its kubelet's next sync.
//! 3. Every line that called `/mutate/<old>` calls `/mutate/<new>` (a JSON
//!    patch guarded by `test` on each path).
//! 4. The Secret holds the new token alone, and the StatefulSet rolls again:
//!    the old one then acts on nothing.
//!
//! Interrupted, it resumes: a Secret holding two tokens is a rotation under
//! way. The token is never printed, logged, or put in a URL.
//!
//! The pure steps (what the Secret holds, the lines' patch, whether a
//! rollout is done) are separate from the thin I/O loop.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use nodegate_shared::path_token::{PATH_PREFIX, parse_file};
use serde_json::{Value, json};

/// Where the install keeps what the rotation touches.
#[derive(Debug, Clone)]
pub struct Target {
    pub namespace: String,
    pub secret: String,
    pub statefulset: String,
    pub webhook_config: String,
    /// How long one rollout may take.
    pub rollout_timeout: Duration,
}

/// The Secret's key holding the token(s).
pub const SECRET_KEY: &str = "token";
/// The StatefulSet template annotation a rollout sets.
pub const RESTART_ANNOTATION: &str = "nodegate.dev/path-token-rotated-at";

/// The tokens a Secret's `token` holds, the one the lines call first.
pub fn tokens_of(contents: &str) -> anyhow::Result<Vec<String>> {
    parse_file(contents)
        .map(|t| t.into_iter().map(str::to_owned).collect())
        .map_err(|why| anyhow::anyhow!("the Secret's token: {why}"))
}

/// The JSON patch moving every line that calls `/mutate/<old>` to
/// `/mutate/<new>`, each guarded by a `test` of its path; `None` when no
/// line calls `old`.
pub fn lines_patch(
    config: &MutatingWebhookConfiguration,
    old: &str,
    new: &str,
) -> Option<Vec<Value>> {
    let (old_path, new_path) = (format!("{PATH_PREFIX}{old}"), format!("{PATH_PREFIX}{new}"));
    let mut ops = Vec::new();
    for (i, w) in config.webhooks.iter().flatten().enumerate() {
        let calls_old = w
            .client_config
            .service
            .as_ref()
            .and_then(|s| s.path.as_deref())
            == Some(old_path.as_str());
        if calls_old {
            let at = format!("/webhooks/{i}/clientConfig/service/path");
            ops.push(json!({"op": "test", "path": at, "value": old_path}));
            ops.push(json!({"op": "replace", "path": at, "value": new_path}));
        }
    }
    (!ops.is_empty()).then_some(ops)
}

/// Whether the StatefulSet has rolled past `before` (its `updateRevision`
/// when the rollout was asked for): a new revision, every replica updated and
/// ready.
pub fn rolled_out(sts: &StatefulSet, before: Option<&str>) -> bool {
    let want = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(st) = &sts.status else {
        return false;
    };
    let generation = sts.metadata.generation.unwrap_or(0);
    st.observed_generation.unwrap_or(0) >= generation
        && st.update_revision.as_deref().is_some()
        && st.update_revision.as_deref() != before
        && st.current_revision == st.update_revision
        && st.updated_replicas.unwrap_or(0) == want
        && st.ready_replicas.unwrap_or(0) == want
}

/// Runs the rotation; `say` gets one line per step (never a token).
pub async fn rotate(
    client: Client,
    t: &Target,
    new_token: String,
    mut say: impl FnMut(&str),
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &t.namespace);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &t.namespace);
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client);

    let secret = secrets
        .get(&t.secret)
        .await
        .with_context(|| format!("reading Secret {}/{}", t.namespace, t.secret))?;
    let held = secret_tokens(&secret)?;
    let (new, old) = match held.as_slice() {
        [old] => (new_token, old.clone()),
        [new, old] => {
            say("a rotation was under way: resuming it");
            (new.clone(), old.clone())
        }
        _ => anyhow::bail!("the Secret holds no token"),
    };
    if held.len() == 1 {
        write_secret(&secrets, &t.secret, &[&new, &old]).await?;
        say("1/4 the Secret holds the new token and the old");
    }
    restart(&sets, t, &mut say).await?;
    say("2/4 every webhook replica accepts both tokens");

    let config = configs
        .get(&t.webhook_config)
        .await
        .with_context(|| format!("reading MutatingWebhookConfiguration {}", t.webhook_config))?;
    match lines_patch(&config, &old, &new) {
        Some(ops) => {
            let patch: json_patch::Patch =
                serde_json::from_value(Value::Array(ops)).context("the lines' patch")?;
            configs
                .patch(
                    &t.webhook_config,
                    &PatchParams::default(),
                    &Patch::<()>::Json(patch),
                )
                .await
                .context("pointing the lines at the new token")?;
            say("3/4 every line calls the new token");
        }
        None => say("3/4 no line calls the old token any more"),
    }

    write_secret(&secrets, &t.secret, &[&new]).await?;
    restart(&sets, t, &mut say).await?;
    say("4/4 the old token is gone from the Secret and every replica");
    Ok(())
}

fn secret_tokens(secret: &Secret) -> anyhow::Result<Vec<String>> {
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY))
        .with_context(|| format!("the Secret has no key {SECRET_KEY:?}"))?;
    let text = std::str::from_utf8(&raw.0).context("the token is not text")?;
    tokens_of(text)
}

/// Replaces the Secret's token(s), the first the one lines call.
async fn write_secret(secrets: &Api<Secret>, name: &str, tokens: &[&str]) -> anyhow::Result<()> {
    let mut body = tokens.join("\n");
    body.push('\n');
    let data: BTreeMap<String, ByteString> =
        BTreeMap::from([(SECRET_KEY.to_string(), ByteString(body.into_bytes()))]);
    let patch = json!({"data": data});
    secrets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing Secret {name}"))?;
    Ok(())
}

/// Rolls the StatefulSet (a template annotation, as `kubectl rollout
/// restart` sets one) and waits until every replica runs the new revision.
async fn restart(
    sets: &Api<StatefulSet>,
    t: &Target,
    say: &mut impl FnMut(&str),
) -> anyhow::Result<()> {
    let before = sets
        .get(&t.statefulset)
        .await
        .with_context(|| format!("reading StatefulSet {}", t.statefulset))?
        .status
        .and_then(|s| s.update_revision);
    let at = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .context("formatting the time")?;
    let patch =
        json!({"spec": {"template": {"metadata": {"annotations": {RESTART_ANNOTATION: at}}}}});
    sets.patch(
        &t.statefulset,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .with_context(|| format!("restarting StatefulSet {}", t.statefulset))?;
    say(&format!("   rolling StatefulSet {}…", t.statefulset));
    let deadline = tokio::time::Instant::now() + t.rollout_timeout;
    loop {
        let sts = sets.get(&t.statefulset).await?;
        if rolled_out(&sts, before.as_deref()) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "StatefulSet {} did not roll out within {:?}; run the command again to resume",
                t.statefulset,
                t.rollout_timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "0f3a9d2c4e6b8a1f0c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f";
    const NEW: &str = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f";

    #[test]
    fn the_secret_holds_one_or_two_tokens() {
        assert_eq!(tokens_of(&format!("{OLD}\n")).unwrap(), [OLD]);
        assert_eq!(tokens_of(&format!("{NEW}\n{OLD}\n")).unwrap(), [NEW, OLD]);
        assert!(tokens_of("").is_err());
        assert!(tokens_of(&format!("{NEW}\n{OLD}\n{OLD}")).is_err());
        assert!(tokens_of("nope").is_err());
    }

    #[test]
    fn only_lines_calling_the_old_token_move_each_guarded() {
        let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": "nodegate"},
            "webhooks": [
                {"name": "a", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {"service": {"name": "s", "namespace": "n", "path": format!("/mutate/{OLD}")}}},
                {"name": "b", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {"service": {"name": "s", "namespace": "n", "path": "/"}}},
                {"name": "c", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {"service": {"name": "s", "namespace": "n", "path": format!("/mutate/{OLD}")}}},
            ]
        }))
        .unwrap();
        let ops = lines_patch(&config, OLD, NEW).unwrap();
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(ops[1]["path"], "/webhooks/0/clientConfig/service/path");
        assert_eq!(ops[1]["value"], format!("/mutate/{NEW}"));
        assert_eq!(ops[3]["path"], "/webhooks/2/clientConfig/service/path");
        assert_eq!(lines_patch(&config, NEW, OLD), None);
        // The patch applies, and a line changed meanwhile fails its test.
        let mut v = serde_json::to_value(&config).unwrap();
        let p: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone())).unwrap();
        json_patch::patch(&mut v, &p).unwrap();
        assert_eq!(
            v["webhooks"][2]["clientConfig"]["service"]["path"],
            format!("/mutate/{NEW}")
        );
        assert!(json_patch::patch(&mut v, &p).is_err(), "not applied twice");
    }

    #[test]
    fn a_rollout_is_done_on_a_new_revision_with_every_replica_ready() {
        let sts = |generation: i64,
                   observed: i64,
                   cur: &str,
                   upd: &str,
                   updated: i32,
                   ready: i32| {
            serde_json::from_value::<StatefulSet>(json!({
                "metadata": {"name": "w", "generation": generation},
                "spec": {"replicas": 2, "selector": {}, "serviceName": "w", "template": {}},
                "status": {"replicas": 2, "observedGeneration": observed, "currentRevision": cur,
                           "updateRevision": upd, "updatedReplicas": updated, "readyReplicas": ready}
            }))
            .unwrap()
        };
        assert!(rolled_out(&sts(2, 2, "r2", "r2", 2, 2), Some("r1")));
        assert!(
            !rolled_out(&sts(2, 2, "r1", "r1", 2, 2), Some("r1")),
            "not started"
        );
        assert!(
            !rolled_out(&sts(2, 1, "r2", "r2", 2, 2), Some("r1")),
            "not observed"
        );
        assert!(
            !rolled_out(&sts(2, 2, "r1", "r2", 1, 2), Some("r1")),
            "half way"
        );
        assert!(
            !rolled_out(&sts(2, 2, "r2", "r2", 2, 1), Some("r1")),
            "not ready"
        );
    }
}
