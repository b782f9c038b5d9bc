//! `Impersonate-User` / `Impersonate-Group`, as kube-apiserver's filter
//! applies them (k8s.io/apiserver `pkg/endpoints/filters/impersonation.go`,
//! `WithImpersonation` and `buildImpersonationRequests`): each impersonated
//! thing is authorized as verb `impersonate` on `users`, `serviceaccounts`
//! (namespace + name) or `groups`; a service account impersonated without
//! groups gets its fixed groups; `system:authenticated` is added unless
//! given (or `system:unauthenticated` is).
//!
//! This is what lets the real-cluster mode of the end-to-end tests (`--as`,
//! kubeconfig `as:`) run against `nodegate-sim serve`. The emulator derives a
//! user's groups from its name ([`users::user_info`]); impersonation that
//! would produce other groups (e.g. `system:node:x` without `system:nodes`,
//! which the real Node authorizer would not recognise as a node) and user
//! uids are refused with a 400 that says so, never approximated. Extras
//! (`Impersonate-Extra-<key>`, the key lower-cased and path-unescaped) are
//! authorized as `impersonate` on `userextras/<key>` in
//! `authentication.k8s.io`, named by the value, and become the user's extra.

use http::HeaderMap;

use crate::rbac::{self, Policy};
use crate::status::ApiError;
use crate::users;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const EXTRA_PREFIX: &str = "impersonate-extra-";
const UID: &str = "impersonate-uid";
const AUTHENTICATED: &str = "system:authenticated";
const UNAUTHENTICATED: &str = "system:unauthenticated";
const ANONYMOUS: &str = "system:anonymous";

/// `serviceaccount.SplitUsername`: `system:serviceaccount:<ns>:<name>`.
fn split_service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// The user a request acts as: `requester` itself when no impersonation is
/// asked for, else the impersonated user once every part is authorized.
/// `policy` is the emulator's RBAC (`None`: allow-all, as for every other
/// request); kubelets may never impersonate (the Node authorizer has no
/// opinion and no RBAC binds `system:nodes`).
pub fn resolve(
    headers: &HeaderMap,
    requester: &users::Identity,
    policy: Option<&Policy>,
) -> Result<users::Identity, ApiError> {
    let user = headers
        .get(USER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let groups: Vec<String> = headers
        .get_all(GROUP)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let mut extra = users::Extra::new();
    for (k, v) in headers {
        if let Some(key) = k.as_str().strip_prefix(EXTRA_PREFIX)
            && let Ok(v) = v.to_str()
        {
            extra.entry(unescape(key)).or_default().push(v.to_string());
        }
    }
    if user.is_empty() {
        if !groups.is_empty() || !extra.is_empty() || headers.contains_key(UID) {
            // buildImpersonationRequests: groups/extras need a user (an internal error upstream).
            return Err(ApiError::internal(format!(
                "requested impersonation of {groups:?} without impersonating a user"
            )));
        }
        return Ok(requester.clone());
    }
    if headers.contains_key(UID) {
        return Err(ApiError::bad_request(
            "the emulator does not model impersonated user uids",
        ));
    }

    let mut checks: Vec<(&str, &str, &str)> = Vec::new();
    let sa = split_service_account(&user);
    match sa {
        Some((ns, name)) => checks.push(("serviceaccounts", ns, name)),
        None => checks.push(("users", "", &user)),
    }
    for g in &groups {
        checks.push(("groups", "", g));
    }
    for (resource, namespace, name) in checks {
        authorize(requester, policy, "", resource, namespace, name)?;
    }
    for (key, values) in &extra {
        for v in values {
            authorize(
                requester,
                policy,
                "authentication.k8s.io",
                &format!("userextras/{key}"),
                "",
                v,
            )?;
        }
    }

    let mut effective = groups.clone();
    if groups.is_empty()
        && let Some((ns, _)) = sa
    {
        effective = vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
        ];
    }
    if user != ANONYMOUS {
        if !effective
            .iter()
            .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
        {
            effective.push(AUTHENTICATED.to_string());
        }
    } else if !effective.iter().any(|g| g == UNAUTHENTICATED) {
        effective.push(UNAUTHENTICATED.to_string());
    }

    let derived: Vec<String> = users::groups(&user);
    let (mut a, mut b) = (effective.clone(), derived.clone());
    a.sort();
    b.sort();
    if a != b {
        return Err(ApiError::bad_request(format!(
            "impersonating {user:?} with groups {effective:?}: the emulator gives this user the groups {derived:?} and cannot represent others"
        )));
    }
    Ok(users::Identity { name: user, extra })
}

/// `unescapeExtraKey`: a header name cannot hold every character of a key,
/// so clients percent-encode it.
fn unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = key
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn authorize(
    requester: &str,
    policy: Option<&Policy>,
    group: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    let denied = |why: String| ApiError::forbidden(resource, "", name, &why);
    if users::node_name_of(requester).is_some() {
        return Err(denied(format!(
            "User \"{requester}\" cannot impersonate resource \"{resource}\" in API group \"\" at the cluster scope"
        )));
    }
    let Some(policy) = policy else {
        return Ok(());
    };
    policy
        .authorize(&rbac::Request {
            user: requester,
            verb: "impersonate",
            group,
            resource: resource.to_string(),
            namespace,
            name: Some(name),
        })
        .map_err(denied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(user: Option<&str>, groups: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(u) = user {
            h.insert(USER, HeaderValue::from_str(u).unwrap());
        }
        for g in groups {
            h.append(GROUP, HeaderValue::from_str(g).unwrap());
        }
        h
    }

    #[test]
    fn service_account_without_groups_gets_its_fixed_groups() {
        let got = resolve(
            &headers(Some(users::AGENT), &[]),
            &users::Identity::new(users::ADMIN),
            None,
        )
        .unwrap();
        assert_eq!(got, users::Identity::new(users::AGENT));
    }

    #[test]
    fn node_user_needs_the_nodes_group() {
        let n = users::node("n1");
        assert_eq!(
            resolve(
                &headers(Some(&n), &["system:nodes"]),
                &users::Identity::new(users::ADMIN),
                None
            )
            .unwrap()
            .name,
            n
        );
        // Upstream this user would lack system:nodes: not a node to the Node authorizer.
        let e = resolve(
            &headers(Some(&n), &[]),
            &users::Identity::new(users::ADMIN),
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, 400, "{}", e.message);
    }

    #[test]
    fn no_headers_is_the_requester_and_groups_alone_are_an_error() {
        assert_eq!(
            resolve(
                &headers(None, &[]),
                &users::Identity::new(users::AGENT),
                None
            )
            .unwrap(),
            users::Identity::new(users::AGENT)
        );
        let e = resolve(
            &headers(None, &["g"]),
            &users::Identity::new(users::ADMIN),
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, 500);
    }

    #[test]
    fn extras_are_impersonated_with_their_own_permission() {
        let mut h = headers(Some(users::AGENT), &[]);
        h.insert(
            "impersonate-extra-authentication.kubernetes.io%2fnode-name",
            HeaderValue::from_static("n1"),
        );
        let got = resolve(&h, &users::Identity::new(users::ADMIN), None).unwrap();
        assert_eq!(got.extra[users::NODE_NAME_EXTRA], ["n1"]);
        // RBAC: impersonating the service account is not enough for its extras.
        let p = Policy::from_documents(&[serde_yaml::from_str(
            "kind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {kind: ClusterRole, name: r}\nsubjects: [{kind: User, name: tester}]",
        )
        .unwrap(), serde_yaml::from_str(
            "kind: ClusterRole\nmetadata: {name: r}\nrules: [{apiGroups: [''], resources: [serviceaccounts], verbs: [impersonate]}]",
        )
        .unwrap()])
        .unwrap();
        let e = resolve(&h, &users::Identity::new("tester"), Some(&p)).unwrap_err();
        assert_eq!(e.code, 403, "{}", e.message);
        assert!(e.message.contains("userextras"), "{}", e.message);
    }

    #[test]
    fn rbac_decides_who_may_impersonate() {
        let p = Policy::from_documents(&[]).unwrap();
        // system:masters may; a service account without a grant may not.
        assert!(
            resolve(
                &headers(Some(users::AGENT), &[]),
                &users::Identity::new(users::ADMIN),
                Some(&p)
            )
            .is_ok()
        );
        let e = resolve(
            &headers(Some(users::AGENT), &[]),
            &users::Identity::new(users::WEBHOOK),
            Some(&p),
        )
        .unwrap_err();
        assert_eq!(e.code, 403);
        assert!(
            e.message
                .contains("serviceaccounts \"nodegate-agent\" is forbidden")
                && e.message
                    .contains("cannot impersonate resource \"serviceaccounts\""),
            "{}",
            e.message
        );
        let n = users::node("n1");
        assert_eq!(
            resolve(
                &headers(Some(users::AGENT), &[]),
                &users::Identity::new(n),
                None
            )
            .unwrap_err()
            .code,
            403
        );
    }
}
