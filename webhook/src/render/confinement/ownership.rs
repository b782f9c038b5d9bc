//! The managedFields check of both policies: what the API server's field
//! manager can make of `metadata.managedFields` on a write that changes
//! only some fields, so that anything else is refused as a forgery.

use std::collections::{BTreeMap, BTreeSet};

use crate::render::cel::string as q;

/// The manager the API server merges the oldest update entries into once an
/// object has more than `DefaultMaxUpdateManagers` of them (apimachinery
/// `pkg/util/managedfields/internal/capmanagers.go`, `fieldmanager.go`).
const BUCKET_MANAGER: &str = "ancient-changes";
const MAX_UPDATE_MANAGERS: usize = 10;
/// Key levels of a FieldsV1 map the bucket check follows: labels,
/// annotations, taints and every spec field are within them (a Node's
/// deepest path, `f:status.f:conditions.k:{…}.f:reason`, has four). Deeper
/// keys are not compared: each level is a nested comprehension, and CEL
/// parsers recurse per level.
const FIELDS_DEPTH: usize = 3;

/// A field whose ownership a confined write may change: its FieldsV1 path,
/// and the CEL variable that is true when this write changed the field.
pub(super) struct Touched {
    pub(super) path: Vec<String>,
    pub(super) changed: &'static str,
}

/// Every FieldsV1 map on the way to a touched field (by its path from the
/// root), with its keys that are touched or lead to one.
fn prefixes(touched: &[Touched]) -> BTreeMap<Vec<String>, BTreeSet<String>> {
    let mut out: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for t in touched {
        for (i, key) in t.path.iter().enumerate() {
            out.entry(t.path[..i].to_vec())
                .or_default()
                .insert(key.clone());
        }
    }
    out
}

fn quoted_list<'a>(keys: impl IntoIterator<Item = &'a String>) -> String {
    let keys: Vec<String> = keys.into_iter().map(|k| q(k)).collect();
    format!("[{}]", keys.join(", "))
}

/// CEL: the value at `path` of map `f` (which must have it).
fn get(f: &str, path: &[String]) -> String {
    let mut m = f.to_string();
    for key in path {
        m = format!("{m}[{}]", q(key));
    }
    m
}

/// CEL: map `f` has `path` (for a FieldsV1 map: owns the field, or some of
/// its children).
fn has_path(f: &str, path: &[String]) -> String {
    let parts: Vec<String> = (0..path.len())
        .map(|i| format!("{} in {}", q(&path[i]), get(f, &path[..i])))
        .collect();
    if parts.is_empty() {
        return "true".into();
    }
    format!("({})", parts.join(" && "))
}

/// CEL: but for the touched fields, FieldsV1 map `y` owns what `x` owns,
/// with the same subtrees. The expressions stay shallow: a CEL parser's
/// recursion grows with nesting, not with length.
fn kept_in(x: &str, y: &str, touched: &[Touched]) -> String {
    let checks: Vec<String> = prefixes(touched)
        .iter()
        .map(|(p, keys)| {
            let (gx, gy) = (get(x, p), get(y, p));
            let all = format!(
                "{gx}.all(k, k in {keys} || {hy} && k in {gy} && {gy}[k] == {gx}[k])",
                keys = quoted_list(keys),
                hy = has_path(y, p),
            );
            if p.is_empty() {
                all
            } else {
                format!("(!{} || {all})", has_path(x, p))
            }
        })
        .collect();
    checks.join("\n          && ")
}

/// CEL: FieldsV1 map `x` owns nothing but (parts of) touched fields.
fn only_touched(x: &str, touched: &[Touched]) -> String {
    let checks: Vec<String> = prefixes(touched)
        .iter()
        .map(|(p, keys)| {
            let all = format!("{}.all(k, k in {})", get(x, p), quoted_list(keys));
            if p.is_empty() {
                all
            } else {
                format!("(!{} || {all})", has_path(x, p))
            }
        })
        .collect();
    checks.join(" && ")
}

/// CEL: every path of `n` keys that FieldsV1 map `o` owns, `b` owns too,
/// but the touched fields this write changed. A key whose value is `{}`
/// owns its path, and so does `.` among a path's keys; at
/// [`FIELDS_DEPTH`] a key in `b` suffices.
fn covered_at(o: &str, b: &str, n: usize, touched: &[Touched]) -> String {
    let k = |i: usize| format!("k{i}");
    let at = |m: &str, upto: usize| -> String {
        (1..=upto).fold(m.to_string(), |acc, i| format!("{acc}[{}]", k(i)))
    };
    let present: Vec<String> = (1..=n)
        .map(|i| format!("{} in {}", k(i), at(b, i - 1)))
        .collect();
    let (vo, vb) = (at(o, n), at(b, n));
    let present = present.join(" && ");
    // A key with children only leads to the paths below (the next level);
    // at the last level its presence stands for them.
    let owned = if n == FIELDS_DEPTH {
        present
    } else {
        format!("size({vo}) > 0 || {present} && (size({vb}) == 0 || '.' in {vb})")
    };
    let mut alternatives: Vec<String> = touched
        .iter()
        .filter(|t| t.path.len() == n)
        .map(|t| {
            let at_path: Vec<String> = t
                .path
                .iter()
                .enumerate()
                .map(|(i, key)| format!("{} == {}", k(i + 1), q(key)))
                .collect();
            format!("{} && variables.{}", at_path.join(" && "), t.changed)
        })
        .collect();
    alternatives.push(owned);
    let mut cel = format!(
        "{}.all({}, {})",
        at(o, n - 1),
        k(n),
        alternatives.join(" || ")
    );
    // Only the maps with keys below lead to level n.
    for i in (1..n).rev() {
        cel = format!(
            "{}.all({}, size({}) == 0 || {cel})",
            at(o, i - 1),
            k(i),
            at(o, i)
        );
    }
    cel
}

/// CEL: entry `e` is an apply entry.
fn is_apply(e: &str) -> String {
    format!("(has({e}.operation) && {e}.operation == 'Apply')")
}

/// CEL: entries `e` and `o` are the same manager's (manager, operation,
/// apiVersion, subresource and fieldsType; not the time or the fields).
fn same_manager(e: &str, o: &str) -> String {
    let fixed = "['time', 'fieldsV1']";
    format!(
        "{e}.all(f, f in {fixed} || f in {o} && {o}[f] == {e}[f]) \
         && {o}.all(f, f in {fixed} || f in {e})"
    )
}

/// CEL: entry `e` is the bucket of merged update entries.
fn is_bucket(e: &str) -> String {
    format!(
        "(has({e}.manager) && {e}.manager == {} && has({e}.operation) && {e}.operation == 'Update' \
         && !has({e}.subresource))",
        q(BUCKET_MANAGER)
    )
}

/// The variables behind [`ownership_rule`]: what the API server's field
/// manager (apimachinery `managedfields/internal`, structured-merge-diff
/// `merge/update.go` `Updater.update`) can make of `metadata.managedFields`
/// on a write that changes only `touched`:
///
/// - the writer's update entry gains the touched fields it changed and
///   loses those it removed (`Updater.Update`), with a new time;
/// - every other entry loses the touched fields the write changed (the
///   conflicts are forced away), and an entry left empty is dropped;
/// - past 10 update entries the oldest are merged into `ancient-changes`
///   (`capUpdateManagers`), which then owns all they owned;
/// - nothing else: apply entries never gain a field on an update, and no
///   entry changes outside the touched fields.
///
/// A caller may send its own managedFields (`decodeLiveOrNew` takes them
/// over the stored ones), so anything else is a forgery: an apply entry
/// that owns `spec.taints` alone makes that manager's next server-side
/// apply delete every taint, and an entry dropped or narrowed lets an
/// applier's omission prune a field others still hold.
pub(super) fn ownership_variables(touched: &[Touched]) -> String {
    // `fieldsV1`, `apiVersion` unguarded: the API server writes them in
    // every entry, and a forged entry without them errors, which
    // failurePolicy Fail refuses.
    let (fe, fo, fb) = ("e.fieldsV1", "o.fieldsV1", "variables.mfBucketFields");
    let same = same_manager("e", "o");
    let not_bucket = format!("!(variables.mfCapped && {})", is_bucket("e"));
    let name = |e: &str| {
        format!(
            "string(has({e}.manager) ? {e}.manager : '') + ' (' + string(has({e}.operation) ? {e}.operation : '') + ')'"
        )
    };
    let per_field = |f: &dyn Fn(&Touched) -> String| -> String {
        let checks: Vec<String> = touched.iter().map(f).collect();
        checks.join("\n          && ")
    };
    // An entry that existed: ownership of a touched field moves only when
    // the write changed it, and never to an apply entry.
    let moved = per_field(&|t| {
        let (of, og) = (has_path(fe, &t.path), has_path(fo, &t.path));
        format!(
            "({of} == {og} || variables.{c} && !({apply} && {of}))",
            c = t.changed,
            apply = is_apply("e")
        )
    });
    // A new entry: only changed touched fields, and no apply entry.
    let gained = per_field(&|t| {
        format!(
            "(!{} || variables.{} && !{})",
            has_path(fe, &t.path),
            t.changed,
            is_apply("e")
        )
    });
    // A dropped entry: only touched fields, each changed by this write.
    let lost = per_field(&|t| format!("(!{} || variables.{})", has_path(fo, &t.path), t.changed));
    let covered: Vec<String> = (1..=FIELDS_DEPTH)
        .map(|n| covered_at(fo, fb, n, touched))
        .collect();
    let list = |obj: &str| {
        format!(
            "request.operation == 'UPDATE' && has({obj}.metadata.managedFields) ? {obj}.metadata.managedFields : []"
        )
    };
    // Several variables, each of them shallow: CEL parsers recurse per
    // level of nesting.
    format!(
        r#"    # Field ownership before and after the write (CREATE and DELETE have none to compare).
    - name: mfNew
      expression: >-
        {new}
    - name: mfOld
      expression: >-
        {old}
    # The API server has merged the oldest update entries into the bucket.
    - name: mfCapped
      expression: >-
        size(variables.mfNew.filter(e, !{apply_e})) == {MAX_UPDATE_MANAGERS}
    # New entries owning more than the touched fields this write changed.
    - name: mfGained
      expression: >-
        variables.mfNew.filter(e, {not_bucket} && !variables.mfOld.exists(o, {same})
          && !({only_e}
          && {gained}))
        .map(e, {name_e})
    # Entries whose ownership changed outside the touched fields.
    - name: mfReshaped
      expression: >-
        variables.mfNew.filter(e, {not_bucket} && variables.mfOld.exists(o, {same}
          && !({kept_eo}
          && {kept_oe})))
        .map(e, {name_e})
    # Entries whose ownership of a touched field moved without a change of it.
    - name: mfMoved
      expression: >-
        variables.mfNew.filter(e, {not_bucket} && variables.mfOld.exists(o, {same}
          && !({moved})))
        .map(e, {name_e})
    # Entries gone that owned more than the touched fields this write changed.
    - name: mfDropped
      expression: >-
        variables.mfOld.filter(o, !variables.mfNew.exists(e, {same})
          && !({only_o}
          && {lost}))
    # The bucket, when the API server has just filled it (one per apiVersion; Nodes have one).
    - name: mfBucket
      expression: >-
        variables.mfCapped ? variables.mfNew.filter(b, {bucket_b}) : []
    - name: mfBucketFields
      expression: >-
        size(variables.mfBucket) == 1 ? variables.mfBucket[0].fieldsV1 : {{}}
    # Of the dropped entries, the ones the bucket did not take in (update entries only).
    - name: mfUncovered
      expression: >-
        variables.mfDropped.filter(o, {apply_o} || size(variables.mfBucket) != 1
          || variables.mfBucket[0].apiVersion != o.apiVersion
          || !({covered}))
        .map(o, {name_o})
    # The entries the field manager could not have left so after this write.
    - name: mfForged
      expression: >-
        variables.mfGained + variables.mfReshaped + variables.mfMoved + variables.mfUncovered
"#,
        new = list("object"),
        old = list("oldObject"),
        apply_e = is_apply("e"),
        apply_o = is_apply("o"),
        only_e = only_touched(fe, touched),
        only_o = only_touched(fo, touched),
        kept_eo = kept_in(fe, fo, touched),
        kept_oe = kept_in(fo, fe, touched),
        bucket_b = is_bucket("b"),
        covered = covered.join("\n          && "),
        name_e = name("e"),
        name_o = name("o"),
    )
}

/// The validation that refuses a forged `metadata.managedFields`;
/// `who` is a CEL string naming the writer.
pub(super) fn ownership_rule(who: &str) -> String {
    format!(
        r#"    - expression: size(variables.mfForged) == 0
      messageExpression: >-
        {who} + " may not rewrite metadata.managedFields of node '" + request.name
        + "' (entries of " + variables.mfForged.join(', ')
        + "): only the API server records who owns a field"
      reason: Forbidden
"#
    )
}
