//! Clients with credentials other than the kubeconfig's own: a bound
//! ServiceAccount token alone, or the admin impersonating someone.

use std::path::Path;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;

/// A TokenRequest for a token bound to the object `kind`/`name`/`uid`
/// (a Pod, or a Node), valid for an hour.
pub fn bound_token_request(kind: &str, name: Option<String>, uid: Option<String>) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
                name,
                uid,
            }),
            expiration_seconds: Some(3600),
        },
        ..Default::default()
    }
}

/// A client of the API server `kubeconfig` names that authenticates with
/// `token` only: no client certificate, plugin or impersonation.
pub async fn token_client(kubeconfig: &Path, token: String) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    kube::Client::try_from(cfg).unwrap()
}

/// A client acting as `user` with the user extras `extra`, impersonated by
/// the admin (both modes: the emulator honours `Impersonate-Extra-*` too).
pub async fn impersonating(c: &Cluster, user: &str, extra: &[(&str, &str)]) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig(users::ADMIN).unwrap()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(
        users::groups(user)
            .into_iter()
            .filter(|g| g != "system:authenticated")
            .collect(),
    );
    cfg.auth_info.impersonate_user_extra = Some(
        extra
            .iter()
            .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
            .collect(),
    );
    kube::Client::try_from(cfg).unwrap()
}
