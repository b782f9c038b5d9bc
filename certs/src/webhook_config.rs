//! Reading and editing the MutatingWebhookConfiguration YAML: its caBundle,
//! the Services its lines call and the path token in their paths.

use base64::Engine;

use crate::error::CertError;

/// Sets `clientConfig.caBundle` (base64 of `ca_pem`) on every webhook of a
/// MutatingWebhookConfiguration given as YAML (or JSON), and returns the YAML.
pub fn inject_ca_bundle(webhook_config_yaml: &str, ca_pem: &str) -> Result<String, CertError> {
    use serde_yaml::Value;
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    for (i, hook) in webhooks_mut(&mut doc)?.iter_mut().enumerate() {
        let hook = hook.as_mapping_mut().ok_or_else(|| {
            CertError::NotWebhookConfig(format!("webhooks[{i}] is not a mapping"))
        })?;
        let client = hook
            .entry("clientConfig".into())
            .or_insert_with(|| Value::Mapping(Default::default()));
        let client = client.as_mapping_mut().ok_or_else(|| {
            CertError::NotWebhookConfig(format!("webhooks[{i}].clientConfig is not a mapping"))
        })?;
        client.insert("caBundle".into(), Value::String(bundle.clone()));
    }
    Ok(serde_yaml::to_string(&doc)?)
}

/// A new path token: 192 random bits, lowercase hex (what the API server
/// accepts in a webhook path).
pub fn path_token() -> String {
    let bytes: [u8; 24] = rand::random();
    nodegate_shared::path_token::encode(&bytes)
}

/// A strategic merge patch (`kubectl patch mutatingwebhookconfiguration NAME
/// --patch-file`) that sets `clientConfig.caBundle` on every webhook of the
/// given configuration, by webhook name (the list's merge key), and with a
/// `token`, `clientConfig.service.path` to `/mutate/<token>` on every webhook
/// that calls a Service: only the API server, which reads the path from the
/// configuration, then calls the route whose reviews may write Nodes.
///
/// A patch, not a whole configuration for `kubectl apply`: client-side apply
/// removes any field its last-applied configuration had and the next one
/// lacks, so applying the install again (without the caBundle) after applying
/// a configuration with it would silently empty `caBundle`. A patched field is
/// never in the last-applied configuration, so re-applying keeps it.
pub fn ca_bundle_patch(
    webhook_config_yaml: &str,
    ca_pem: &str,
    token: Option<&str>,
) -> Result<String, CertError> {
    use serde_yaml::{Mapping, Value};
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut hooks = Vec::new();
    for (i, hook) in webhooks_mut(&mut doc)?.iter().enumerate() {
        let name = hook
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| CertError::NotWebhookConfig(format!("webhooks[{i}] has no name")))?;
        let mut client = Mapping::new();
        client.insert("caBundle".into(), Value::String(bundle.clone()));
        let calls_service = hook
            .get("clientConfig")
            .and_then(|c| c.get("service"))
            .is_some();
        if let (Some(t), true) = (token, calls_service) {
            let mut service = Mapping::new();
            service.insert(
                "path".into(),
                Value::String(format!("{}{t}", nodegate_shared::path_token::PATH_PREFIX)),
            );
            client.insert("service".into(), Value::Mapping(service));
        }
        let mut entry = Mapping::new();
        entry.insert("name".into(), Value::String(name.to_owned()));
        entry.insert("clientConfig".into(), Value::Mapping(client));
        hooks.push(Value::Mapping(entry));
    }
    let mut patch = Mapping::new();
    patch.insert("webhooks".into(), Value::Sequence(hooks));
    Ok(serde_yaml::to_string(&Value::Mapping(patch))?)
}

/// Every Service the configuration's webhooks call, `(name, namespace)`, in
/// order and once each: the names one serving certificate must carry.
pub fn webhook_services(webhook_config_yaml: &str) -> Result<Vec<(String, String)>, CertError> {
    use serde_yaml::Value;
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let mut out = Vec::new();
    for hook in webhooks_mut(&mut doc)?.iter() {
        let Some(svc) = hook.get("clientConfig").and_then(|c| c.get("service")) else {
            continue;
        };
        let field = |k: &str| svc.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let pair = (field("name"), field("namespace"));
        if !pair.0.is_empty() && !out.contains(&pair) {
            out.push(pair);
        }
    }
    Ok(out)
}

/// The path token the configuration's lines already call
/// (`service.path` `/mutate/<token>`), so a rotation that lost its
/// `path-token` file keeps the path the running replicas accept: `None` when
/// no line names one (a configuration never patched); an error when lines
/// disagree or a token is malformed, which a user must resolve.
pub fn live_path_token(webhook_config_yaml: &str) -> Result<Option<String>, CertError> {
    use serde_yaml::Value;
    let mut doc: Value = serde_yaml::from_str(webhook_config_yaml)?;
    let mut found: Option<String> = None;
    for hook in webhooks_mut(&mut doc)?.iter() {
        let Some(path) = hook
            .get("clientConfig")
            .and_then(|c| c.get("service"))
            .and_then(|s| s.get("path"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        // A path without a token (an older release's `/mutate`) names none.
        let Some(t) = path.strip_prefix("/mutate/") else {
            continue;
        };
        let token = nodegate_shared::path_token::parse(t)
            .map_err(|why| CertError::NotWebhookConfig(format!("a line calls {path:?}: {why}")))?
            .to_string();
        match &found {
            Some(f) if *f != token => {
                return Err(CertError::NotWebhookConfig(
                    "its lines call different path tokens".into(),
                ));
            }
            _ => found = Some(token),
        }
    }
    Ok(found)
}

/// The non-empty `webhooks` list of a v1 MutatingWebhookConfiguration.
fn webhooks_mut(doc: &mut serde_yaml::Value) -> Result<&mut Vec<serde_yaml::Value>, CertError> {
    use serde_yaml::Value;
    let root = doc.as_mapping_mut().ok_or_else(|| {
        CertError::NotWebhookConfig("expected a single YAML mapping (one document)".into())
    })?;
    let kind = root.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "MutatingWebhookConfiguration" {
        return Err(CertError::NotWebhookConfig(format!(
            "expected kind MutatingWebhookConfiguration, found {:?}",
            kind
        )));
    }
    let api = root.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api != "admissionregistration.k8s.io/v1" {
        return Err(CertError::NotWebhookConfig(format!(
            "expected apiVersion admissionregistration.k8s.io/v1, found {api:?}"
        )));
    }
    root.get_mut("webhooks")
        .and_then(Value::as_sequence_mut)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| CertError::NotWebhookConfig("it has no webhooks".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::Ca;

    fn config_with_paths(paths: &[Option<&str>]) -> String {
        let hooks: Vec<serde_json::Value> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut svc = serde_json::json!({"name": format!("s{i}"), "namespace": "nodegate"});
                if let Some(p) = p {
                    svc["path"] = serde_json::json!(p);
                }
                serde_json::json!({"name": format!("l{i}.nodegate.dev"), "clientConfig": {"service": svc}})
            })
            .collect();
        serde_yaml::to_string(&serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "nodegate"},
            "webhooks": hooks,
        }))
        .unwrap()
    }

    #[test]
    fn the_live_path_token_is_the_one_every_line_calls() {
        let t = "0123456789abcdef0123456789abcdef0123456789abcdef";
        let path = format!("/mutate/{t}");
        type Case<'a> = (&'a [Option<&'a str>], Result<Option<&'a str>, &'a str>);
        let cases: [Case; 5] = [
            (&[None, None], Ok(None)),
            (&[Some(&path), Some(&path)], Ok(Some(t))),
            (
                &[
                    Some(&path),
                    Some("/mutate/0123456789abcdef0123456789abcdef0"),
                ],
                Err("different path tokens"),
            ),
            (&[Some("/mutate"), None], Ok(None)),
            (&[Some("/mutate/NOT-A-TOKEN")], Err("a line calls")),
        ];
        for (paths, want) in cases {
            let got = live_path_token(&config_with_paths(paths));
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g.as_deref(), w, "{paths:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{paths:?}: {e}"),
                (g, w) => panic!("{paths:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    const CONFIG: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: nodegate
webhooks:
  - name: nodes.nodegate.dev
    clientConfig:
      service: {name: nodegate-webhook, namespace: nodegate, path: /mutate}
    failurePolicy: Ignore
  - name: status.nodegate.dev
    clientConfig:
      caBundle: b2xk
      service: {name: nodegate-webhook, namespace: nodegate, path: /mutate}
"#;

    #[test]
    fn inject_sets_ca_bundle_on_every_webhook() {
        let ca = Ca::generate(1).unwrap();
        let out = inject_ca_bundle(CONFIG, ca.cert_pem()).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        let hooks = doc["webhooks"].as_sequence().unwrap();
        assert_eq!(hooks.len(), 2);
        for hook in hooks {
            let b64 = hook["clientConfig"]["caBundle"].as_str().unwrap();
            let pem = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            assert_eq!(pem, ca.cert_pem().as_bytes());
            assert_eq!(hook["clientConfig"]["service"]["path"], "/mutate");
        }
        assert_eq!(hooks[0]["failurePolicy"], "Ignore");
        // Round trip: injecting again replaces, never duplicates.
        let again = inject_ca_bundle(&out, ca.cert_pem()).unwrap();
        assert_eq!(again, out);
    }

    #[test]
    fn patch_names_every_webhook_and_carries_only_its_ca_bundle() {
        let ca = Ca::generate(1).unwrap();
        let patch = ca_bundle_patch(CONFIG, ca.cert_pem(), None).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&patch).unwrap();
        let hooks = doc["webhooks"].as_sequence().unwrap();
        let names: Vec<_> = hooks.iter().map(|h| h["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["nodes.nodegate.dev", "status.nodegate.dev"]);
        for hook in hooks {
            // Only the merge key and the bundle: a patch must not reset the
            // rest of the configuration.
            assert_eq!(hook.as_mapping().unwrap().len(), 2, "{hook:?}");
            assert_eq!(hook["clientConfig"].as_mapping().unwrap().len(), 1);
            let pem = base64::engine::general_purpose::STANDARD
                .decode(hook["clientConfig"]["caBundle"].as_str().unwrap())
                .unwrap();
            assert_eq!(pem, ca.cert_pem().as_bytes());
        }
        assert_eq!(doc.as_mapping().unwrap().len(), 1, "only webhooks");
        let nameless = "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: [{clientConfig: {}}]\n";
        let err = ca_bundle_patch(nameless, "pem", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("webhooks[0] has no name"), "{err}");
        let err = ca_bundle_patch("apiVersion: v1\nkind: ConfigMap\n", "pem", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ConfigMap"), "{err}");
    }

    /// With a token every line's Service path becomes `/mutate/<token>`,
    /// and nothing else of the Service is in the patch (the merge keeps
    /// name, namespace and port); tokens are long, URL-safe and fresh.
    #[test]
    fn patch_points_every_line_at_the_token_path() {
        let token = path_token();
        assert_eq!(
            nodegate_shared::path_token::parse(&token),
            Ok(token.as_str())
        );
        assert_ne!(token, path_token());
        let patch = ca_bundle_patch(CONFIG, "pem", Some(&token)).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&patch).unwrap();
        for hook in doc["webhooks"].as_sequence().unwrap() {
            let service = hook["clientConfig"]["service"].as_mapping().unwrap();
            assert_eq!(service.len(), 1, "{service:?}");
            assert_eq!(
                hook["clientConfig"]["service"]["path"].as_str().unwrap(),
                format!("/mutate/{token}")
            );
        }
        let url_hook = "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: [{name: a, clientConfig: {url: 'https://x/mutate'}}]\n";
        let patch = ca_bundle_patch(url_hook, "pem", Some(&token)).unwrap();
        assert!(
            !patch.contains(&token),
            "a url line is left as it is: {patch}"
        );
    }

    #[test]
    fn inject_refuses_what_is_not_a_webhook_config() {
        let cases = [
            ("webhooks: [unclosed", "not valid YAML"),
            ("- a\n- b\n", "single YAML mapping"),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
                "found \"ConfigMap\"",
            ),
            (
                "apiVersion: admissionregistration.k8s.io/v1beta1\nkind: MutatingWebhookConfiguration\nwebhooks: [{name: a}]\n",
                "apiVersion",
            ),
            (
                "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: []\n",
                "no webhooks",
            ),
            (
                "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nwebhooks: [{name: a, clientConfig: 3}]\n",
                "clientConfig is not a mapping",
            ),
        ];
        for (input, want) in cases {
            let err = inject_ca_bundle(input, "pem").unwrap_err().to_string();
            assert!(err.contains(want), "{input:?}: {err} should mention {want}");
        }
    }
}
