//! The users the emulator knows, and the bearer tokens that name them.
//!
//! A token is `emu.` + the user name in base64url, so any user name works
//! without registration; a token issued by the TokenRequest API adds `.` +
//! the user's extra (JSON, base64url), as a real token's claims carry them.
//! Anything else is answered with 401.
//!
//! Follows `k8s.io/apiserver/pkg/authentication/user/user.go` (`DefaultInfo`) and
//! `k8s.io/apiserver/pkg/authentication/serviceaccount/util.go` (`MakeUsername`).

use std::collections::BTreeMap;
use std::ops::Deref;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

pub const ADMIN: &str = "admin";
pub const NODE_CONTROLLER: &str = "system:serviceaccount:kube-system:node-controller";
pub const AGENT: &str = "system:serviceaccount:nodegate:nodegate-agent";
pub const WEBHOOK: &str = "system:serviceaccount:nodegate:nodegate-webhook";
pub const ROSTER: &str = "system:serviceaccount:nodegate:nodegate-roster";
pub const SCHEDULER: &str = "system:kube-scheduler";

const TOKEN_PREFIX: &str = "emu.";

/// The user extra a ServiceAccount token bound to a Pod on a node carries
/// (k8s.io/apiserver `pkg/authentication/serviceaccount/util.go`).
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
pub const NODE_UID_EXTRA: &str = "authentication.kubernetes.io/node-uid";
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// `UserInfo.Extra`.
pub type Extra = BTreeMap<String, Vec<String>>;

/// Who a request acts as: the user name (what most of the emulator needs,
/// hence `Deref<Target = str>`) and the user's extra.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Identity {
    pub name: String,
    pub extra: Extra,
}

impl Identity {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            extra: Extra::new(),
        }
    }
}

impl Deref for Identity {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// A token for `user` with an extra, as the TokenRequest API issues.
pub fn token_with_extra(user: &str, extra: &Extra) -> String {
    let json = serde_json::to_vec(extra).unwrap_or_default();
    format!("{}.{}", token(user), URL_SAFE_NO_PAD.encode(json))
}

/// The identity a token names, or `None` (401).
pub fn identity_of_token(token: &str) -> Option<Identity> {
    let (user, extra) = match token.rsplit_once('.') {
        Some((u, e)) if u.starts_with(TOKEN_PREFIX) && u.len() > TOKEN_PREFIX.len() => {
            let bytes = URL_SAFE_NO_PAD.decode(e).ok()?;
            (u, serde_json::from_slice::<Extra>(&bytes).ok()?)
        }
        _ => (token, Extra::new()),
    };
    Some(Identity {
        name: user_of_token(user)?,
        extra,
    })
}

/// The user name the API server gives the kubelet of node `name`.
pub fn node(name: &str) -> String {
    format!("{}{name}", nodegate_shared::keys::NODE_USER_PREFIX)
}

/// The bearer token that authenticates as `user`.
pub fn token(user: &str) -> String {
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(user))
}

/// The user a token names, or `None` (401).
pub fn user_of_token(token: &str) -> Option<String> {
    let enc = token.strip_prefix(TOKEN_PREFIX)?;
    let bytes = URL_SAFE_NO_PAD.decode(enc).ok()?;
    String::from_utf8(bytes).ok().filter(|u| !u.is_empty())
}

/// The node a kubelet user speaks for.
pub fn node_name_of(user: &str) -> Option<&str> {
    user.strip_prefix(nodegate_shared::keys::NODE_USER_PREFIX)
        .filter(|n| !n.is_empty())
}

/// The groups the real authenticators give `user` (`system:authenticated` last).
pub fn groups(user: &str) -> Vec<String> {
    let mut groups: Vec<String> = Vec::new();
    if node_name_of(user).is_some() {
        groups.push("system:nodes".into());
    } else if let Some(rest) = user.strip_prefix("system:serviceaccount:") {
        groups.push("system:serviceaccounts".into());
        if let Some((ns, _)) = rest.split_once(':') {
            groups.push(format!("system:serviceaccounts:{ns}"));
        }
    } else if user == ADMIN {
        groups.push("system:masters".into());
    }
    groups.push("system:authenticated".into());
    groups
}

/// `authentication.k8s.io/v1` UserInfo with the groups the real authenticators add.
/// `request.userInfo` of an AdmissionReview, extra included as the API
/// server copies it (k8s.io/apiserver `pkg/admission/plugin/webhook/request`
/// `CreateV1AdmissionReview`: `Extra` from the authenticated user).
pub fn user_info(user: &str, extra: &Extra) -> Value {
    let mut info = json!({"username": user, "groups": groups(user)});
    if !extra.is_empty() {
        info["extra"] = json!(extra);
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_reject_garbage() {
        for u in [ADMIN, AGENT, &node("n-1")] {
            assert_eq!(user_of_token(&token(u)).as_deref(), Some(u));
        }
        assert_eq!(user_of_token("emu.!!!"), None);
        assert_eq!(user_of_token("admin"), None);
        assert_eq!(user_of_token("emu."), None);
        assert_eq!(node_name_of(&node("n1")), Some("n1"));
        assert_eq!(node_name_of(ADMIN), None);
        assert_eq!(
            user_info(&node("a"), &Extra::new())["groups"][0],
            "system:nodes"
        );
        let extra = Extra::from([(NODE_NAME_EXTRA.to_string(), vec!["n1".to_string()])]);
        let id = identity_of_token(&token_with_extra(AGENT, &extra)).unwrap();
        assert_eq!((id.name.as_str(), &id.extra), (AGENT, &extra));
        assert_eq!(
            identity_of_token(&token(AGENT)).unwrap(),
            Identity::new(AGENT)
        );
        assert_eq!(identity_of_token(&format!("{}.!!", token(AGENT))), None);
    }
}
