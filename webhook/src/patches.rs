//! The patched answers, built once.
//!
//! Everything nodegate can send besides the uid is known when the taints are
//! configured: the patch depends only on the node's shape (no `spec`, no
//! `spec.taints`, or an array to append to) and on which configured taints
//! are missing; the warnings only on the reason and the missing set. With
//! few configured taints (the usual case is one) every combination is
//! serialized, base64-encoded and wrapped in the answer's JSON in
//! [`Patches::new`]; with more, the answer is concatenated from
//! pre-serialized taints per request. The semantic reference is
//! `nodegate_shared::patch::add_taints`: the tests prove both produce its
//! exact bytes.

use std::borrow::Cow;

use base64::Engine;
use nodegate_shared::TaintSpec;

use crate::rules::Reason;
use crate::wire::{Node, write_json_str};

/// Up to this many configured taints, every answer is prepared up front
/// (2 reasons × 3 shapes × 2^n missing-sets: 96 answers at 4).
pub const MAX_CACHED: usize = 4;

/// Where the taints go, which decides the patch (the API server fails a
/// request whose patch does not apply, whatever the failurePolicy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// No `spec`: add `/spec` with the taints.
    NoSpec,
    /// `spec` without `taints` (or `taints: null`): add the array.
    NoTaints,
    /// Append to the existing array.
    Append,
}

impl Shape {
    pub const ALL: [Shape; 3] = [Shape::NoSpec, Shape::NoTaints, Shape::Append];

    pub fn of(node: &Node<'_>) -> Self {
        if node.has_taints_array() {
            Shape::Append
        } else if node.has_spec() {
            Shape::NoTaints
        } else {
            Shape::NoSpec
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One patched answer, without its uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The JSON patch (before base64).
    patch: Vec<u8>,
    /// The answer after `"uid":"…"`: allowed, patch, patchType, warnings.
    answer_tail: Vec<u8>,
    /// Number of taints the patch adds.
    added: usize,
}

impl Prepared {
    pub fn patch(&self) -> &[u8] {
        &self.patch
    }
    pub fn answer_tail(&self) -> &[u8] {
        &self.answer_tail
    }
    pub fn added(&self) -> usize {
        self.added
    }
}

/// The pieces every answer is made of, and the prepared answers.
#[derive(Debug, Clone)]
pub struct Patches {
    /// Each configured taint as the API serializes it.
    taint_json: Vec<Vec<u8>>,
    /// Warning per configured taint, JSON-quoted: `[create, reboot]`.
    warnings: Vec<[Vec<u8>; 2]>,
    /// Indexed by [`Patches::slot`] when there are at most [`MAX_CACHED`] taints.
    cache: Vec<Prepared>,
}

fn reason_index(reason: Reason) -> usize {
    match reason {
        Reason::Create => 0,
        Reason::Reboot => 1,
    }
}

impl Patches {
    pub fn new(taints: &[TaintSpec]) -> Self {
        let taint_json = taints
            .iter()
            .map(|t| serde_json::to_vec(&t.to_json()).unwrap_or_default())
            .collect();
        let warnings = taints
            .iter()
            .map(|t| {
                let quoted = |s: String| {
                    let mut out = Vec::new();
                    write_json_str(&mut out, &s);
                    out
                };
                [
                    quoted(format!(
                        "nodegate: added taint {t}: new node, its network agent is not ready yet"
                    )),
                    quoted(format!(
                        "nodegate: added taint {t}: node rebooted since its network agent was last ready"
                    )),
                ]
            })
            .collect();
        let mut patches = Self {
            taint_json,
            warnings,
            cache: Vec::new(),
        };
        let n = taints.len();
        if n <= MAX_CACHED {
            let mut cache = Vec::with_capacity((2 * 3) << n);
            for reason in [Reason::Create, Reason::Reboot] {
                for shape in Shape::ALL {
                    for mask in 0..1usize << n {
                        debug_assert_eq!(cache.len(), Self::slot(n, reason, shape, mask));
                        cache.push(patches.build(reason, shape, |i| mask & (1 << i) != 0));
                    }
                }
            }
            patches.cache = cache;
        }
        patches
    }

    fn slot(n: usize, reason: Reason, shape: Shape, mask: usize) -> usize {
        ((reason_index(reason) * 3 + shape.index()) << n) + mask
    }

    /// The answer adding the configured taints `i` for which `missing(i)`.
    pub fn get(
        &self,
        reason: Reason,
        shape: Shape,
        missing: impl Fn(usize) -> bool,
    ) -> Cow<'_, Prepared> {
        let n = self.taint_json.len();
        if n <= MAX_CACHED {
            let mask = (0..n).filter(|&i| missing(i)).fold(0, |m, i| m | 1 << i);
            if let Some(p) = self.cache.get(Self::slot(n, reason, shape, mask)) {
                return Cow::Borrowed(p);
            }
        }
        Cow::Owned(self.build(reason, shape, missing))
    }

    /// Concatenates the pre-serialized pieces; the same bytes
    /// `serde_json::to_vec(&add_taints(..))` gives (see tests).
    fn build(&self, reason: Reason, shape: Shape, missing: impl Fn(usize) -> bool) -> Prepared {
        let missing: Vec<usize> = (0..self.taint_json.len()).filter(|&i| missing(i)).collect();
        let values = |out: &mut Vec<u8>, before: &[u8], after: &[u8]| {
            for (n, &i) in missing.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(before);
                out.extend_from_slice(&self.taint_json[i]);
                out.extend_from_slice(after);
            }
        };
        let mut patch = Vec::with_capacity(128);
        match shape {
            Shape::Append => {
                patch.push(b'[');
                values(
                    &mut patch,
                    br#"{"op":"add","path":"/spec/taints/-","value":"#,
                    b"}",
                );
                patch.push(b']');
            }
            Shape::NoTaints => {
                patch.extend_from_slice(br#"[{"op":"add","path":"/spec/taints","value":["#);
                values(&mut patch, b"", b"");
                patch.extend_from_slice(b"]}]");
            }
            Shape::NoSpec => {
                patch.extend_from_slice(br#"[{"op":"add","path":"/spec","value":{"taints":["#);
                values(&mut patch, b"", b"");
                patch.extend_from_slice(b"]}}]");
            }
        }
        let mut tail = Vec::with_capacity(256);
        tail.extend_from_slice(br#","allowed":true,"patch":""#);
        tail.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(&patch)
                .as_bytes(),
        );
        tail.extend_from_slice(br#"","patchType":"JSONPatch","warnings":["#);
        for (n, &i) in missing.iter().enumerate() {
            if n > 0 {
                tail.push(b',');
            }
            tail.extend_from_slice(&self.warnings[i][reason_index(reason)]);
        }
        tail.extend_from_slice(b"]}}");
        Prepared {
            patch,
            answer_tail: tail,
            added: missing.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use nodegate_shared::NodeView;
    use nodegate_shared::patch::{Guard, add_taints};
    use serde_json::{Value, json};

    use super::*;

    fn specs(n: usize) -> Vec<TaintSpec> {
        [
            "node.cilium.io/agent-not-ready=true:NoSchedule",
            "example.com/gate:NoExecute",
            "example.com/gate:NoSchedule",
            "a.example/b=c-d_e.f:PreferNoSchedule",
            "x/y=1:NoSchedule",
            "x/z:NoExecute",
        ][..n]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect()
    }

    /// A node of each shape, as JSON.
    fn node(shape: Shape) -> Value {
        match shape {
            Shape::NoSpec => json!({"metadata": {"name": "n"}}),
            Shape::NoTaints => {
                json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24"}})
            }
            Shape::Append => json!({"metadata": {"name": "n"},
                "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}}),
        }
    }

    /// For every shape, reason and missing-set, the prepared (or built) bytes
    /// are exactly what the shared reference serializes, and the answer tail
    /// carries them base64-encoded with one warning per added taint.
    #[test]
    fn every_answer_equals_the_reference_patch() {
        // 3 taints use the cache, 6 the per-request concatenation.
        for n in [1, 3, 6] {
            let specs = specs(n);
            let patches = Patches::new(&specs);
            assert_eq!(patches.cache.is_empty(), n > MAX_CACHED);
            for shape in Shape::ALL {
                let json = node(shape);
                let view: NodeView = serde_json::from_value(json.clone()).unwrap();
                let text = json.to_string();
                let wire_node: Node<'_> = serde_json::from_str(&text).unwrap();
                assert_eq!(Shape::of(&wire_node), shape);
                for mask in 1..1usize << n {
                    let missing: Vec<&TaintSpec> = (0..n)
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| &specs[i])
                        .collect();
                    let want =
                        serde_json::to_vec(&add_taints(&view, &missing, Guard::None)).unwrap();
                    for reason in [Reason::Create, Reason::Reboot] {
                        let got = patches.get(reason, shape, |i| mask & (1 << i) != 0);
                        assert!(matches!(got, Cow::Borrowed(_)) == (n <= MAX_CACHED));
                        assert_eq!(
                            String::from_utf8_lossy(got.patch()),
                            String::from_utf8_lossy(&want),
                            "n={n} {shape:?} mask={mask:b}"
                        );
                        assert_eq!(got.added(), missing.len());
                        let mut answer = br#"{"uid":"u""#.to_vec();
                        answer.extend_from_slice(got.answer_tail());
                        answer.truncate(answer.len() - 1);
                        let answer: Value = serde_json::from_slice(&answer).unwrap();
                        let b64 = base64::engine::general_purpose::STANDARD.encode(&want);
                        assert_eq!(answer["patch"], b64.as_str());
                        assert_eq!(answer["patchType"], "JSONPatch");
                        assert_eq!(answer["allowed"], true);
                        let warnings = answer["warnings"].as_array().unwrap();
                        assert_eq!(warnings.len(), missing.len());
                        for (w, t) in warnings.iter().zip(&missing) {
                            let w = w.as_str().unwrap();
                            assert!(w.contains(&t.to_string()), "{w}");
                            let why = match reason {
                                Reason::Create => "new node",
                                Reason::Reboot => "rebooted",
                            };
                            assert!(w.contains(why), "{w}");
                        }
                        // And the patch applies to a node of that shape.
                        let patch: json_patch::Patch = serde_json::from_slice(got.patch()).unwrap();
                        let mut doc = json.clone();
                        json_patch::patch(&mut doc, &patch).unwrap();
                        let after: NodeView = serde_json::from_value(doc).unwrap();
                        assert!(after.missing(&specs).len() == n - missing.len());
                    }
                }
            }
        }
    }
}
