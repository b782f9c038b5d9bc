//! The users the emulator knows, and the bearer tokens that name them.
//!
//! A token is `emu.` + the user name in base64url, so any user name works
//! without registration; anything else is answered with 401.

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
pub fn user_info(user: &str) -> Value {
    json!({"username": user, "groups": groups(user)})
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
        assert_eq!(user_info(&node("a"))["groups"][0], "system:nodes");
    }
}
