//! CEL text shared by the generated manifests (the admission policy and the
//! webhook configuration's backup lines), so both decide
//! [`Rule::NodeCreate`], [`Rule::UpdateAfterReboot`] and [`Rule::Excluded`]
//! with the same expressions.
//!
//! Every optional field is read behind `has()`: the API server binds
//! `object`, `oldObject` and `request` with empty `omitempty` fields absent,
//! and an evaluation error under `failurePolicy: Ignore` skips the policy or
//! webhook silently.

use std::fmt::Write as _;

use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{EXCLUDE_LABEL, NODE_USER_PREFIX, READY_BOOT_ID_ANNOTATION};

#[cfg(doc)]
use crate::rules::Rule;

/// A CEL single-quoted string literal.
pub fn string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `{'key': …, 'value': …, 'effect': …}` for one configured taint: a plain
/// map, because variables and match conditions are compiled without the
/// `Object.*` types (those exist only where mutations are compiled). A
/// JSONPatch `value` takes any JSON-shaped value, so a mutation can add it as
/// it is.
pub fn taint_literal(t: &TaintSpec) -> String {
    let mut s = format!("{{'key': {}", string(t.key()));
    if let Some(v) = t.value() {
        let _ = write!(s, ", 'value': {}", string(v));
    }
    let _ = write!(s, ", 'effect': {}}}", string(t.effect().as_str()));
    s
}

/// `[{…}, {…}]`: the configured taints as a CEL list of maps.
pub fn taint_list(taints: &[TaintSpec]) -> String {
    let literals: Vec<String> = taints.iter().map(taint_literal).collect();
    format!("[{}]", literals.join(", "))
}

/// [`Rule::Excluded`] on the new object (an objectSelector matches the old
/// or the new).
pub fn not_excluded() -> String {
    let exclude = string(EXCLUDE_LABEL);
    format!(
        "!has(object.metadata.labels) || !({exclude} in object.metadata.labels)\n\
         || object.metadata.labels[{exclude}] != 'true'"
    )
}

/// [`Rule::NodeCreate`] (every CREATE) or [`Rule::UpdateAfterReboot`] (an
/// UPDATE by anyone but the node itself, whose ready-boot-id annotation
/// differs from the stored, non-empty bootID).
pub fn create_or_update_after_reboot() -> String {
    let ready = string(READY_BOOT_ID_ANNOTATION);
    let node_user = string(NODE_USER_PREFIX);
    format!(
        "request.operation == 'CREATE'\n\
         || (!(has(request.userInfo.username)\n      \
               && request.userInfo.username == {node_user} + object.metadata.name)\n    \
             && has(object.metadata.annotations) && {ready} in object.metadata.annotations\n    \
             && has(oldObject.status) && has(oldObject.status.nodeInfo)\n    \
             && has(oldObject.status.nodeInfo.bootID) && oldObject.status.nodeInfo.bootID != ''\n    \
             && object.metadata.annotations[{ready}] != oldObject.status.nodeInfo.bootID)"
    )
}

/// Not an UPDATE by the node's own agent (`nodegate-agent`'s token bound to
/// a pod on this node): it opens its gates one at a time, and a gate it
/// removes before the last one records the boot must stand
/// (`Rules::update_after_reboot`).
pub fn not_the_nodes_own_agent() -> String {
    let claim = string(crate::rules::NODE_CLAIM);
    let sa = string(&format!(":{}", crate::rules::AGENT_SERVICE_ACCOUNT));
    format!(
        "request.operation == 'CREATE'\n\
         || !(has(request.userInfo.username)\n      \
              && request.userInfo.username.startsWith('system:serviceaccount:')\n      \
              && request.userInfo.username.endsWith({sa})\n      \
              && has(request.userInfo.extra) && {claim} in request.userInfo.extra\n      \
              && request.userInfo.extra[{claim}] == [object.metadata.name])"
    )
}

/// `t` (a taint map) is not on the object under review, by key and effect.
pub fn lacks(t: &str) -> String {
    format!(
        "!has(object.spec) || !has(object.spec.taints)\n\
         || !object.spec.taints.exists(x, x.key == {t}.key && x.effect == {t}.effect)"
    )
}

/// Indents every line after the first by `n` spaces (YAML folded blocks).
pub fn indent(text: &str, n: usize) -> String {
    text.replace('\n', &format!("\n{}", " ".repeat(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    #[test]
    fn taints_become_cel_literals_with_and_without_value() {
        let t: TaintSpec = DEFAULT_TAINT.parse().unwrap();
        assert_eq!(
            taint_literal(&t),
            "{'key': 'nodegate.dev/agent-not-ready', 'value': 'true', 'effect': 'NoSchedule'}"
        );
        let t: TaintSpec = "example.com/gate:NoExecute".parse().unwrap();
        assert_eq!(
            taint_literal(&t),
            "{'key': 'example.com/gate', 'effect': 'NoExecute'}"
        );
        assert_eq!(string(r"a'b\c"), r"'a\'b\\c'");
    }
}
