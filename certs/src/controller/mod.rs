//! `nodegate-certs controller`: keeps, inside the cluster, what an install
//! needs so that no one runs a binary on a laptop: the CA (a Secret no Pod
//! mounts), the webhook's serving certificate (the Secret its replicas
//! mount and reload), the path token, the caBundle of every line, and each
//! line's `/mutate/<token>` path. With cert-manager (`--certificates
//! external`) it keeps only the token and the paths.
//!
//! Each round reads everything, takes at most one step ([`plan`]) and reads
//! again: the next step always sees the previous one's result, so a CA is
//! trusted by every line before a leaf it signed is written. Writes are
//! guarded by resourceVersion, so two controllers (a rollout's old and new
//! Pod) never undo each other. Nothing here depends on the cluster's size:
//! four GETs a round, a round a minute once everything is in place.

pub mod plan;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cert_info::{CertInfo, parse_pem_certs};
use crate::{Ca, ServingRequest, path_token};
use plan::{CaStep, LeafStep};

/// Whose certificates the webhook serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Certificates {
    /// This controller's CA and leaf, and the caBundle.
    Own,
    /// Someone else's (cert-manager and its cainjector): only the token and
    /// the paths are kept here.
    External,
}

/// What the controller keeps, and where.
#[derive(Debug, Clone)]
pub struct Options {
    pub namespace: String,
    pub ca_secret: String,
    pub tls_secret: String,
    pub token_secret: String,
    pub statefulset: String,
    pub webhook_config: String,
    pub certificates: Certificates,
    pub ca_days: u32,
    pub serving_days: u32,
}

/// How a round ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// Everything in place.
    Converged,
    /// One step taken, or one waited for: what (logged).
    Step(String),
}

/// Keys of the CA Secret.
pub const CA_CERT_KEY: &str = "ca.crt";
pub const CA_KEY_KEY: &str = "ca.key";
/// CAs replaced by a rotation, certificates only, kept trusted until they expire.
pub const PREVIOUS_KEY: &str = "previous.crt";
/// The token Secret's key (what the webhook's `--path-token-file` reads).
pub const TOKEN_KEY: &str = crate::rotate::SECRET_KEY;

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn data<'a>(s: &'a Secret, key: &str) -> Option<&'a [u8]> {
    s.data.as_ref()?.get(key).map(|b| b.0.as_slice())
}

fn secret(
    name: &str,
    namespace: &str,
    type_: &str,
    entries: &[(&str, &[u8])],
    resource_version: Option<String>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".into(), "nodegate-webhook".into()),
                ("app.kubernetes.io/part-of".into(), "nodegate".into()),
            ])),
            resource_version,
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(
            entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Creates `s`, or replaces the stored one at its resourceVersion.
async fn write(api: &Api<Secret>, s: &Secret) -> anyhow::Result<()> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let r = if s.metadata.resource_version.is_some() {
        api.replace(&name, &PostParams::default(), s).await
    } else {
        api.create(&PostParams::default(), s).await
    };
    r.map(|_| ())
        .with_context(|| format!("writing Secret {name}"))
}

/// The stored CA: current certificate and key, earlier certificates.
struct StoredCa {
    ca: Ca,
    current: CertInfo,
    previous: Vec<CertInfo>,
}

/// A CA Secret this controller cannot read is reported and left alone: a
/// new CA would strand the replicas serving leaves of the old one.
fn stored_ca(s: &Secret) -> anyhow::Result<StoredCa> {
    let name = s.metadata.name.as_deref().unwrap_or_default();
    let corrupt = |why: String| {
        anyhow::anyhow!(
            "Secret {name} does not hold a CA this controller can use ({why}); it is left as it is. \
             Delete it to make a new CA"
        )
    };
    let cert = std::str::from_utf8(data(s, CA_CERT_KEY).unwrap_or_default())
        .map_err(|_| corrupt(format!("{CA_CERT_KEY} is not text")))?;
    let key = std::str::from_utf8(data(s, CA_KEY_KEY).unwrap_or_default())
        .map_err(|_| corrupt(format!("{CA_KEY_KEY} is not text")))?;
    let current = match parse_pem_certs(cert.as_bytes())
        .map_err(&corrupt)?
        .as_slice()
    {
        [c] if c.is_ca => c.clone(),
        _ => return Err(corrupt(format!("{CA_CERT_KEY} is not one CA certificate"))),
    };
    let ca = Ca::from_pem(cert, key).map_err(|e| corrupt(e.to_string()))?;
    let previous = parse_pem_certs(data(s, PREVIOUS_KEY).unwrap_or_default())
        .map_err(|why| corrupt(format!("{PREVIOUS_KEY}: {why}")))?;
    Ok(StoredCa {
        ca,
        current,
        previous,
    })
}

/// Every line's caBundle (an unreadable one as none: it is rewritten).
fn line_bundles(config: &MutatingWebhookConfiguration) -> Vec<Vec<CertInfo>> {
    config
        .webhooks
        .iter()
        .flatten()
        .map(|w| {
            w.client_config
                .ca_bundle
                .as_ref()
                .and_then(|b| parse_pem_certs(&b.0).ok())
                .unwrap_or_default()
        })
        .collect()
}

/// Every line's path: `None` for a line that calls a URL.
fn line_paths(config: &MutatingWebhookConfiguration) -> Vec<Option<Option<String>>> {
    config
        .webhooks
        .iter()
        .flatten()
        .map(|w| w.client_config.service.as_ref().map(|s| s.path.clone()))
        .collect()
}

/// The Services the lines call, first line's first: the names the leaf carries.
fn wanted_request(config: &MutatingWebhookConfiguration, days: u32) -> Option<ServingRequest> {
    let mut services: Vec<(String, String)> = Vec::new();
    for w in config.webhooks.iter().flatten() {
        if let Some(s) = &w.client_config.service {
            let pair = (s.name.clone(), s.namespace.clone());
            if !services.contains(&pair) {
                services.push(pair);
            }
        }
    }
    let mut it = services.into_iter();
    let (service, namespace) = it.next()?;
    Some(ServingRequest {
        service,
        namespace,
        also_services: it.collect(),
        ips: Vec::new(),
        days,
    })
}

/// A JSON patch of the configuration, guarded by its resourceVersion: a
/// configuration changed since it was read is not overwritten.
async fn patch_config(
    api: &Api<MutatingWebhookConfiguration>,
    config: &MutatingWebhookConfiguration,
    mut ops: Vec<Value>,
) -> anyhow::Result<()> {
    let name = config.metadata.name.clone().unwrap_or_default();
    let rv = config.metadata.resource_version.clone().unwrap_or_default();
    ops.insert(
        0,
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
    );
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).context("the configuration's patch")?;
    api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .with_context(|| format!("patching MutatingWebhookConfiguration {name}"))?;
    Ok(())
}

/// Whether every replica of the webhook runs and is ready.
fn webhooks_ready(sts: &StatefulSet) -> bool {
    let want = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(st) = &sts.status else {
        return false;
    };
    st.observed_generation.unwrap_or(0) >= sts.metadata.generation.unwrap_or(0)
        && st.ready_replicas.unwrap_or(0) >= want
        && want > 0
}

/// The CA Secret: `ca`'s certificate and key, and the earlier CAs still
/// trusted (certificates only); a replacement at `resource_version`.
async fn write_ca(
    secrets: &Api<Secret>,
    o: &Options,
    ca: &Ca,
    previous: &str,
    resource_version: Option<String>,
) -> anyhow::Result<()> {
    let key = ca.key_pem();
    let s = secret(
        &o.ca_secret,
        &o.namespace,
        "Opaque",
        &[
            (CA_CERT_KEY, ca.cert_pem().as_bytes()),
            (CA_KEY_KEY, key.as_bytes()),
            (PREVIOUS_KEY, previous.as_bytes()),
        ],
        resource_version,
    );
    write(secrets, &s).await
}

/// One round: at most one step.
pub async fn reconcile(client: &Client, o: &Options) -> anyhow::Result<Round> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &o.namespace);
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(config) = configs
        .get_opt(&o.webhook_config)
        .await
        .with_context(|| format!("reading MutatingWebhookConfiguration {}", o.webhook_config))?
    else {
        return Ok(Round::Step(format!(
            "waiting for MutatingWebhookConfiguration {}",
            o.webhook_config
        )));
    };

    if o.certificates == Certificates::Own
        && let Some(step) = certificates(&secrets, &configs, &config, o).await?
    {
        return Ok(Round::Step(step));
    }

    let tokens = match secrets.get_opt(&o.token_secret).await? {
        None => {
            let t = path_token();
            let body = format!("{t}\n");
            let s = secret(
                &o.token_secret,
                &o.namespace,
                "Opaque",
                &[(TOKEN_KEY, body.as_bytes())],
                None,
            );
            write(&secrets, &s).await?;
            return Ok(Round::Step(format!(
                "made the path token (Secret {})",
                o.token_secret
            )));
        }
        Some(s) => {
            let text =
                std::str::from_utf8(data(&s, TOKEN_KEY).unwrap_or_default()).unwrap_or_default();
            crate::rotate::tokens_of(text).map_err(|why| {
                anyhow::anyhow!(
                    "Secret {}: {why}; it is left as it is (delete it to make a new token)",
                    o.token_secret
                )
            })?
        }
    };

    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &o.namespace);
    let ready = sets
        .get_opt(&o.statefulset)
        .await?
        .is_some_and(|s| webhooks_ready(&s));
    let paths = line_paths(&config);
    match plan::paths_step(&paths, &tokens, ready) {
        Some(moves) => {
            let ops = moves
                .iter()
                .map(|(i, p)| {
                    json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/service/path"), "value": p})
                })
                .collect();
            patch_config(&configs, &config, ops).await?;
            Ok(Round::Step(format!(
                "{} line(s) now call /mutate/<token>",
                moves.len()
            )))
        }
        None if !ready
            && paths.iter().flatten().any(|p| {
                !p.as_deref()
                    .is_some_and(|p| p.starts_with(nodegate_shared::path_token::PATH_PREFIX))
            }) =>
        {
            Ok(Round::Step(format!(
                "waiting for every replica of StatefulSet {} to be ready before the lines call the token",
                o.statefulset
            )))
        }
        None => Ok(Round::Converged),
    }
}

/// The CA, the caBundle and the leaf: `Some(step)` when one was taken or
/// is awaited.
async fn certificates(
    secrets: &Api<Secret>,
    configs: &Api<MutatingWebhookConfiguration>,
    config: &MutatingWebhookConfiguration,
    o: &Options,
) -> anyhow::Result<Option<String>> {
    let now = now();
    let stored = secrets.get_opt(&o.ca_secret).await?;
    let ca = stored.as_ref().map(stored_ca).transpose()?;
    let bundles = line_bundles(config);
    match plan::ca_step(ca.as_ref().map(|c| &c.current), now) {
        CaStep::Create => {
            let ca = Ca::generate(o.ca_days)?;
            // An install made with a CA of its own (nodegate-certs on a
            // laptop) keeps it trusted until the replicas serve this one's.
            let adopted: String = plan::adopted(&bundles, now)
                .iter()
                .map(|c| c.pem())
                .collect();
            write_ca(secrets, o, &ca, &adopted, None).await?;
            return Ok(Some(format!("made the CA (Secret {})", o.ca_secret)));
        }
        CaStep::Rotate => {
            let (Some(old), Some(stored)) = (&ca, &stored) else {
                anyhow::bail!("a rotation without a stored CA");
            };
            let new = Ca::generate(o.ca_days)?;
            // The old certificate stays trusted a while; its key goes.
            let previous: String = plan::wanted_bundle(&old.current, &old.previous, None, now)
                .iter()
                .map(|c| c.pem())
                .collect();
            write_ca(
                secrets,
                o,
                &new,
                &previous,
                stored.metadata.resource_version.clone(),
            )
            .await?;
            return Ok(Some(
                "rotated the CA: the old one stays trusted until the replicas serve the new one's leaf".into(),
            ));
        }
        CaStep::Keep => {}
    }
    let Some(ca) = ca else {
        anyhow::bail!("no CA after CaStep::Keep");
    };

    let stored_leaf = secrets.get_opt(&o.tls_secret).await?;
    let leaf = stored_leaf
        .as_ref()
        .and_then(|s| data(s, "tls.crt"))
        .and_then(|pem| parse_pem_certs(pem).ok())
        .and_then(|certs| certs.into_iter().next());
    let wanted = plan::wanted_bundle(&ca.current, &ca.previous, leaf.as_ref(), now);
    let stale: Vec<usize> = (0..bundles.len())
        .filter(|&i| {
            let ders: Vec<Vec<u8>> = bundles[i].iter().map(|c| c.der.clone()).collect();
            !plan::bundle_is(&ders, &wanted)
        })
        .collect();
    if !stale.is_empty() {
        let pem: String = wanted.iter().map(|c| c.pem()).collect();
        let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
        let ops = stale
            .iter()
            .map(|i| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": b64}))
            .collect();
        patch_config(configs, config, ops).await?;
        return Ok(Some(format!(
            "caBundle of {} line(s) now trusts {} CA(s)",
            stale.len(),
            wanted.len()
        )));
    }

    let Some(request) = wanted_request(config, o.serving_days) else {
        return Ok(Some(
            "no line calls a Service: no serving certificate to make".into(),
        ));
    };
    // Every line holds the wanted bundle here, the current CA first.
    match plan::leaf_step(leaf.as_ref(), &ca.current, true, &request.dns_names(), now) {
        LeafStep::Keep => Ok(None),
        LeafStep::WaitForTrust(why) => Ok(Some(format!(
            "serving certificate to replace ({why}), once every line trusts the CA"
        ))),
        LeafStep::Issue(why) => {
            let leaf = ca.ca.issue(&request)?;
            let s = secret(
                &o.tls_secret,
                &o.namespace,
                "kubernetes.io/tls",
                &[
                    ("tls.crt", leaf.cert_pem.as_bytes()),
                    ("tls.key", leaf.key_pem.as_bytes()),
                    ("ca.crt", ca.current.pem().as_bytes()),
                ],
                stored_leaf.and_then(|s| s.metadata.resource_version),
            );
            write(secrets, &s).await?;
            Ok(Some(format!(
                "issued the serving certificate (Secret {}): {why}",
                o.tls_secret
            )))
        }
    }
}

/// Runs rounds until `shutdown`: the next at once after a step, after
/// `resync` once in place, after `retry` on an error (logged, never fatal:
/// the API server may be away for a while).
pub async fn run(
    client: Client,
    o: Options,
    resync: Duration,
    retry: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut was_converged = false;
    loop {
        let wait = match reconcile(&client, &o).await {
            Ok(Round::Converged) => {
                if !was_converged {
                    tracing::info!("in place: CA, serving certificate, caBundle, token and paths");
                }
                was_converged = true;
                resync
            }
            Ok(Round::Step(what)) => {
                tracing::info!(step = %what, "step");
                was_converged = false;
                // A step's result is read on the next round; a wait is polled.
                Duration::from_secs(1)
            }
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "round failed; retrying");
                was_converged = false;
                retry
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut shutdown => return,
        }
    }
}
