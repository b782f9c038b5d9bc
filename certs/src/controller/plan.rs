//! The in-cluster controller's decisions, pure: what the CA, the serving
//! certificate, the caBundle and the lines' paths should be, given what the
//! cluster holds now. The I/O loop (`super`) reads, asks, writes, and reads
//! again on its next round, so each decision only ever takes one step.
//!
//! The order is what keeps every call verifiable: a CA enters the caBundle
//! before any leaf it signed is served, and leaves the caBundle only when it
//! expires (its key is gone once replaced, so trusting its certificate a
//! little longer costs nothing). A line calls `/mutate/<token>` only once
//! every webhook replica runs, so no call reaches a replica that does not
//! exist (the API server logs such a call's URL, token included).

use nodegate_shared::path_token::PATH_PREFIX;

use crate::cert_info::CertInfo;

/// Renew a certificate when less than this share of its lifetime is left
/// (cert-manager's default is the same third).
pub const RENEW_AT_LIFE_LEFT: f64 = 1.0 / 3.0;

/// What to do with the CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaStep {
    Keep,
    /// None stored: make one.
    Create,
    /// A third of its life or less is left: a new CA, the old one kept
    /// trusted (its certificate only) until it expires.
    Rotate,
}

pub fn ca_step(ca: Option<&CertInfo>, now: i64) -> CaStep {
    match ca {
        None => CaStep::Create,
        Some(c) if c.life_left(now) < RENEW_AT_LIFE_LEFT => CaStep::Rotate,
        Some(_) => CaStep::Keep,
    }
}

/// How long an earlier CA stays trusted after the current one's leaf was
/// written: a replica serves a Secret's new leaf only after its kubelet
/// synced the volume (about a minute) and the webhook reloaded it (10 s).
pub const TRUST_OVERLAP_SECS: i64 = 600;
/// Leaves are backdated this much (`ca.rs`), so issued = notBefore + this.
pub const BACKDATE_SECS: i64 = 300;

/// The CAs the caBundle should hold: the current one first, then every
/// earlier one (a rotated CA, or the CA of an install this controller took
/// over) until it expires or every replica has had time to serve a leaf
/// of the current CA, whichever comes first.
pub fn wanted_bundle<'a>(
    current: &'a CertInfo,
    previous: &'a [CertInfo],
    leaf: Option<&CertInfo>,
    now: i64,
) -> Vec<&'a CertInfo> {
    let settled = leaf.is_some_and(|l| {
        current.signed(l) && now >= l.not_before + BACKDATE_SECS + TRUST_OVERLAP_SECS
    });
    std::iter::once(current)
        .chain(
            previous
                .iter()
                .filter(|p| !settled && p.not_after > now && p.der != current.der),
        )
        .collect()
}

/// The CAs a new CA keeps trusted when it takes over an install: every
/// unexpired CA certificate the lines trust now (the replicas may be
/// serving a leaf of any of them), once each.
pub fn adopted(lines: &[Vec<CertInfo>], now: i64) -> Vec<&CertInfo> {
    let mut out: Vec<&CertInfo> = Vec::new();
    for c in lines.iter().flatten() {
        if c.is_ca && c.not_after > now && !out.iter().any(|o| o.der == c.der) {
            out.push(c);
        }
    }
    out
}

/// Whether a line's caBundle (its certificates' DER, in order) is the
/// wanted one.
pub fn bundle_is(line: &[Vec<u8>], wanted: &[&CertInfo]) -> bool {
    line.len() == wanted.len() && line.iter().zip(wanted).all(|(a, b)| *a == b.der)
}

/// What to do with the serving certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafStep {
    Keep,
    /// Issue a new one from the current CA, for this reason (logged).
    Issue(&'static str),
    /// It must be replaced, but the API server does not trust the current
    /// CA yet on every line: serving a leaf it signed would fail every call.
    WaitForTrust(&'static str),
}

pub fn leaf_step(
    leaf: Option<&CertInfo>,
    ca: &CertInfo,
    every_line_trusts_ca: bool,
    wanted_dns: &[String],
    now: i64,
) -> LeafStep {
    let why = match leaf {
        None => Some("none stored"),
        Some(l) if !ca.signed(l) => Some("signed by another CA"),
        Some(l) if l.life_left(now) < RENEW_AT_LIFE_LEFT => Some("a third of its life left"),
        Some(l) if wanted_dns.iter().any(|d| !l.dns_names.contains(d)) => {
            Some("a Service the lines call is missing from its names")
        }
        Some(_) => None,
    };
    match why {
        None => LeafStep::Keep,
        Some(w) if every_line_trusts_ca => LeafStep::Issue(w),
        Some(w) => LeafStep::WaitForTrust(w),
    }
}

/// The path each line that calls a Service should call, by index: `None`
/// when nothing is to change. Lines already calling one of the tokens the
/// Secret holds are left alone (a rotation under way moves them itself);
/// the others, no path or a stale token, move to the first token, but only
/// once every webhook replica runs.
pub fn paths_step(
    line_paths: &[Option<Option<String>>],
    tokens: &[String],
    webhooks_ready: bool,
) -> Option<Vec<(usize, String)>> {
    let first = tokens.first()?;
    if !webhooks_ready {
        return None;
    }
    let accepted = |p: &str| {
        p.strip_prefix(PATH_PREFIX)
            .is_some_and(|t| tokens.iter().any(|k| k == t))
    };
    let moves: Vec<(usize, String)> = line_paths
        .iter()
        .enumerate()
        // `None`: the line calls a URL, not a Service; never ours to move.
        .filter_map(|(i, p)| p.as_ref().map(|p| (i, p)))
        .filter(|(_, p)| !p.as_deref().is_some_and(accepted))
        .map(|(i, _)| (i, format!("{PATH_PREFIX}{first}")))
        .collect();
    (!moves.is_empty()).then_some(moves)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    fn cert(
        id: u8,
        from: i64,
        days: i64,
        ski: Option<u8>,
        aki: Option<u8>,
        dns: &[&str],
    ) -> CertInfo {
        CertInfo {
            der: vec![id],
            not_before: from,
            not_after: from + days * DAY,
            is_ca: ski.is_some(),
            subject_key_id: ski.map(|k| vec![k]),
            authority_key_id: aki.map(|k| vec![k]),
            dns_names: dns.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn the_ca_is_made_once_and_rotated_with_a_third_of_its_life_left() {
        let ca = cert(1, 0, 3650, Some(1), None, &[]);
        assert_eq!(ca_step(None, 0), CaStep::Create);
        assert_eq!(ca_step(Some(&ca), 10 * DAY), CaStep::Keep);
        assert_eq!(ca_step(Some(&ca), 2400 * DAY), CaStep::Keep);
        assert_eq!(ca_step(Some(&ca), 2500 * DAY), CaStep::Rotate);
        assert_eq!(ca_step(Some(&ca), 4000 * DAY), CaStep::Rotate, "expired");
    }

    #[test]
    fn an_earlier_ca_stays_trusted_until_it_expires() {
        let now = 100 * DAY;
        let current = cert(2, now, 3650, Some(2), None, &[]);
        let old = cert(1, 0, 150, Some(1), None, &[]);
        let expired = cert(3, 0, 50, Some(3), None, &[]);
        let ders = |v: Vec<&CertInfo>| v.iter().map(|c| c.der[0]).collect::<Vec<_>>();
        let old_leaf = cert(8, now - DAY, 90, None, Some(1), &[]);
        assert_eq!(
            ders(wanted_bundle(
                &current,
                std::slice::from_ref(&old),
                None,
                now
            )),
            [2, 1]
        );
        assert_eq!(
            ders(wanted_bundle(
                &current,
                std::slice::from_ref(&old),
                Some(&old_leaf),
                now
            )),
            [2, 1],
            "the replicas still serve the old CA's leaf"
        );
        let both = [old.clone(), expired];
        assert_eq!(
            ders(wanted_bundle(&current, &both, None, 200 * DAY)),
            [2],
            "expired"
        );
        // A leaf of the current CA: the old CA goes once every replica had
        // time to load it.
        let new_leaf = cert(9, now - BACKDATE_SECS, 90, None, Some(2), &[]);
        let prev = std::slice::from_ref(&old);
        assert_eq!(
            ders(wanted_bundle(&current, prev, Some(&new_leaf), now)),
            [2, 1]
        );
        let later = now + TRUST_OVERLAP_SECS - 1;
        assert_eq!(
            ders(wanted_bundle(&current, prev, Some(&new_leaf), later)),
            [2, 1]
        );
        let later = now + TRUST_OVERLAP_SECS;
        assert_eq!(
            ders(wanted_bundle(&current, prev, Some(&new_leaf), later)),
            [2]
        );
        assert!(bundle_is(
            &[vec![2], vec![1]],
            &wanted_bundle(&current, prev, None, now)
        ));
        assert!(!bundle_is(
            &[vec![1]],
            &wanted_bundle(&current, prev, None, now)
        ));
        assert!(!bundle_is(&[], &[&current]));
    }

    #[test]
    fn a_new_ca_keeps_trusting_what_the_lines_trust() {
        let now = 100 * DAY;
        let theirs = cert(1, 0, 365, Some(1), None, &[]);
        let expired = cert(2, 0, 50, Some(2), None, &[]);
        let leaf = cert(3, 0, 365, None, Some(1), &[]);
        let lines = vec![vec![theirs.clone(), expired], vec![theirs.clone(), leaf]];
        let got: Vec<u8> = adopted(&lines, now).iter().map(|c| c.der[0]).collect();
        assert_eq!(got, [1], "once, unexpired, CA certificates only");
    }

    #[test]
    fn a_leaf_is_replaced_only_once_every_line_trusts_its_ca() {
        let now = 10 * DAY;
        let ca = cert(1, 0, 3650, Some(1), None, &[]);
        let names = vec!["w.ng.svc".to_string(), "w-0.ng.svc".to_string()];
        let good = cert(5, now - DAY, 90, None, Some(1), &["w.ng.svc", "w-0.ng.svc"]);
        let foreign = cert(6, now - DAY, 90, None, Some(9), &["w.ng.svc", "w-0.ng.svc"]);
        let old = cert(
            7,
            now - 70 * DAY,
            90,
            None,
            Some(1),
            &["w.ng.svc", "w-0.ng.svc"],
        );
        let narrow = cert(8, now - DAY, 90, None, Some(1), &["w.ng.svc"]);
        let cases: &[(&str, Option<&CertInfo>, bool, LeafStep)] = &[
            ("current", Some(&good), true, LeafStep::Keep),
            ("current, trust pending", Some(&good), false, LeafStep::Keep),
            ("none", None, true, LeafStep::Issue("none stored")),
            (
                "none, CA not yet trusted",
                None,
                false,
                LeafStep::WaitForTrust("none stored"),
            ),
            (
                "another CA's",
                Some(&foreign),
                true,
                LeafStep::Issue("signed by another CA"),
            ),
            (
                "another CA's, new CA not yet trusted",
                Some(&foreign),
                false,
                LeafStep::WaitForTrust("signed by another CA"),
            ),
            (
                "ageing",
                Some(&old),
                true,
                LeafStep::Issue("a third of its life left"),
            ),
            (
                "a replica's Service missing",
                Some(&narrow),
                true,
                LeafStep::Issue("a Service the lines call is missing from its names"),
            ),
        ];
        for (what, leaf, trusted, want) in cases {
            assert_eq!(
                &leaf_step(*leaf, &ca, *trusted, &names, now),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn lines_move_to_the_token_once_every_replica_runs() {
        let (a, b) = ("a".repeat(32), "b".repeat(32));
        let tokens = vec![a.clone()];
        let unset: Vec<Option<Option<String>>> = vec![Some(None), Some(None), None];
        assert_eq!(
            paths_step(&unset, &tokens, false),
            None,
            "replicas not ready"
        );
        assert_eq!(paths_step(&unset, &[], true), None, "no token yet");
        assert_eq!(
            paths_step(&unset, &tokens, true),
            Some(vec![
                (0, format!("/mutate/{a}")),
                (1, format!("/mutate/{a}"))
            ]),
            "a URL line (index 2) is never moved"
        );
        let done = vec![
            Some(Some(format!("/mutate/{a}"))),
            Some(Some(format!("/mutate/{a}"))),
        ];
        assert_eq!(paths_step(&done, &tokens, true), None);
        // A rotation under way: lines on either token stay where they are.
        let mid = vec![
            Some(Some(format!("/mutate/{a}"))),
            Some(Some(format!("/mutate/{b}"))),
        ];
        assert_eq!(paths_step(&mid, &[b.clone(), a.clone()], true), None);
        // A stale token (the Secret was replaced) or `/`: moved.
        let stale = vec![
            Some(Some(format!("/mutate/{b}"))),
            Some(Some("/".to_string())),
        ];
        assert_eq!(
            paths_step(&stale, &tokens, true),
            Some(vec![
                (0, format!("/mutate/{a}")),
                (1, format!("/mutate/{a}"))
            ])
        );
    }
}
