//! Latency histograms, error classes and the check of each answer.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::Engine;
use hdrhistogram::Histogram;
use serde::Deserialize;

/// Highest latency tracked: anything slower is clamped (the request timeout is 10 s).
const MAX_MICROS: u64 = 60_000_000;

/// A latency histogram in microseconds, 3 significant digits.
#[derive(Debug, Clone)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Self {
        Latencies(
            Histogram::new_with_bounds(1, MAX_MICROS, 3)
                .expect("constant histogram bounds are valid"),
        )
    }

    pub fn record(&mut self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(MAX_MICROS);
        self.0.saturating_record(micros.clamp(1, MAX_MICROS));
    }

    pub fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// Latency at quantile `q` (0.5 = median), zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_micros(self.0.value_at_quantile(q))
    }

    pub fn max(&self) -> Duration {
        Duration::from_micros(self.0.max())
    }

    pub fn summary(&self) -> Summary {
        Summary {
            count: self.count(),
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            max: if self.0.is_empty() {
                Duration::ZERO
            } else {
                self.max()
            },
        }
    }
}

/// The percentiles a report prints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {} p99 {} p99.9 {} max {}",
            ms(self.p50),
            ms(self.p99),
            ms(self.p999),
            ms(self.max)
        )
    }
}

/// A duration in milliseconds with microsecond precision, e.g. `0.412ms`.
pub fn ms(d: Duration) -> String {
    format!("{:.3}ms", d.as_secs_f64() * 1e3)
}

/// Why a request did not count as a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failure {
    /// TCP connect or TLS handshake failed.
    Connect,
    /// The connection broke while sending or receiving.
    Transport,
    /// No answer within the request timeout.
    Timeout,
    /// HTTP status other than 200.
    Status(u16),
    /// Body is not an `admission.k8s.io/v1` AdmissionReview with a response.
    BadReview,
    /// `response.allowed` is false.
    NotAllowed,
    /// `response.uid` differs from the request's uid.
    BadUid,
    /// A patch was expected (a taint is missing) but none came, or it is not a JSON patch.
    MissingPatch,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Connect => f.write_str("connect"),
            Failure::Transport => f.write_str("transport"),
            Failure::Timeout => f.write_str("timeout"),
            Failure::Status(s) => write!(f, "http-{s}"),
            Failure::BadReview => f.write_str("bad-review"),
            Failure::NotAllowed => f.write_str("not-allowed"),
            Failure::BadUid => f.write_str("bad-uid"),
            Failure::MissingPatch => f.write_str("missing-patch"),
        }
    }
}

/// Failure counts by class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failures(BTreeMap<Failure, u64>);

impl Failures {
    pub fn add(&mut self, f: Failure) {
        *self.0.entry(f).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Failures) {
        for (k, v) in &other.0 {
            *self.0.entry(*k).or_default() += v;
        }
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn get(&self, f: Failure) -> u64 {
        self.0.get(&f).copied().unwrap_or(0)
    }
}

impl fmt::Display for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut first = true;
        for (k, v) in &self.0 {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// How strictly an answer is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Baseline: any AdmissionReview that allows (it does not echo the uid).
    Transport,
    /// Webhook: uid echoed, allowed, and a JSON patch when `patch` is true.
    Webhook { patch: bool },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'a str,
    kind: &'a str,
    response: Option<ResponseOut<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    #[serde(borrow)]
    uid: std::borrow::Cow<'a, str>,
    allowed: bool,
    #[serde(default)]
    patch: Option<&'a str>,
    #[serde(default)]
    patch_type: Option<&'a str>,
}

/// Checks one 200 answer to the request with `uid`.
pub fn check_review(body: &[u8], uid: &str, expect: Expect) -> Result<(), Failure> {
    Checker::default().check(body, uid, expect)
}

/// Checks answers, remembering the last patch it decoded and found to be a
/// non-empty JSON patch: an answer carrying the same bytes is then checked
/// by comparison. The load generator shares the cores with the server, and
/// decoding every patch (base64, then JSON into `Value`s) made each webhook
/// answer cost the generator several µs more than a baseline answer, which
/// lowered the webhook's measured rate for work that was not the webhook's.
#[derive(Debug, Default)]
pub struct Checker {
    verified_patch: Option<String>,
}

impl Checker {
    pub fn check(&mut self, body: &[u8], uid: &str, expect: Expect) -> Result<(), Failure> {
        let review: ReviewOut<'_> = serde_json::from_slice(body).map_err(|_| Failure::BadReview)?;
        if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
            return Err(Failure::BadReview);
        }
        let resp = review.response.ok_or(Failure::BadReview)?;
        if !resp.allowed {
            return Err(Failure::NotAllowed);
        }
        let Expect::Webhook { patch } = expect else {
            return Ok(());
        };
        if resp.uid != uid {
            return Err(Failure::BadUid);
        }
        if patch {
            let (Some(p), Some("JSONPatch")) = (resp.patch, resp.patch_type) else {
                return Err(Failure::MissingPatch);
            };
            if self.verified_patch.as_deref() != Some(p) {
                let ok = base64::engine::general_purpose::STANDARD
                    .decode(p)
                    .ok()
                    .and_then(|raw| serde_json::from_slice::<Vec<serde_json::Value>>(&raw).ok())
                    .is_some_and(|ops| !ops.is_empty());
                if !ok {
                    return Err(Failure::MissingPatch);
                }
                self.verified_patch = Some(p.to_owned());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn percentiles_of_a_uniform_spread() {
        let mut h = Latencies::new();
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        assert_eq!(s.count, 10_000);
        // 3 significant digits: within 0.1 % of the exact rank value.
        let near = |d: Duration, want: u64| {
            let got = d.as_micros() as f64;
            assert!(
                (got - want as f64).abs() <= want as f64 * 0.001 + 1.0,
                "{got} vs {want}"
            );
        };
        near(s.p50, 5_000);
        near(s.p99, 9_900);
        near(s.p999, 9_990);
        near(s.max, 10_000);
    }

    #[test]
    fn tail_is_not_hidden_by_the_median() {
        let mut h = Latencies::new();
        for _ in 0..990 {
            h.record(Duration::from_micros(300));
        }
        for _ in 0..10 {
            h.record(Duration::from_millis(50));
        }
        assert_eq!(h.quantile(0.5), Duration::from_micros(300));
        // 99 % of samples are ≤ 300 µs; the 99.9th falls in the slow tail.
        assert_eq!(h.quantile(0.99), Duration::from_micros(300));
        assert!(h.quantile(0.999) >= Duration::from_micros(49_950));
    }

    #[test]
    fn merge_adds_counts_and_extremes_clamp() {
        let mut a = Latencies::new();
        let mut b = Latencies::new();
        a.record(Duration::from_micros(100));
        b.record(Duration::from_secs(3600));
        b.record(Duration::ZERO);
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert!(a.max() >= Duration::from_secs(59));
        assert_eq!(Latencies::new().summary().p99, Duration::ZERO);
    }

    #[test]
    fn failures_count_by_class() {
        let mut f = Failures::default();
        f.add(Failure::Status(500));
        f.add(Failure::Status(500));
        f.add(Failure::BadUid);
        let mut g = Failures::default();
        g.add(Failure::BadUid);
        f.merge(&g);
        assert_eq!(f.total(), 4);
        assert_eq!(f.get(Failure::BadUid), 2);
        assert_eq!(f.to_string(), "http-500=2, bad-uid=2");
        assert_eq!(Failures::default().to_string(), "none");
    }

    fn answer(uid: &str, allowed: bool, patch: Option<&str>) -> Vec<u8> {
        let mut resp = serde_json::json!({"uid": uid, "allowed": allowed});
        if let Some(p) = patch {
            resp["patch"] = base64::engine::general_purpose::STANDARD.encode(p).into();
            resp["patchType"] = "JSONPatch".into();
        }
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp
        }))
        .unwrap()
    }

    #[test]
    fn checks_answers_like_the_api_server() {
        let patch =
            r#"[{"op":"add","path":"/spec/taints/-","value":{"key":"a","effect":"NoSchedule"}}]"#;
        let want = Expect::Webhook { patch: true };
        assert_eq!(
            check_review(&answer("u1", true, Some(patch)), "u1", want),
            Ok(())
        );
        assert_eq!(
            check_review(&answer("u2", true, Some(patch)), "u1", want),
            Err(Failure::BadUid)
        );
        assert_eq!(
            check_review(&answer("u1", true, None), "u1", want),
            Err(Failure::MissingPatch)
        );
        assert_eq!(
            check_review(&answer("u1", true, Some("[]")), "u1", want),
            Err(Failure::MissingPatch)
        );
        assert_eq!(
            check_review(&answer("u1", false, None), "u1", want),
            Err(Failure::NotAllowed)
        );
        assert_eq!(
            check_review(
                &answer("u1", true, None),
                "u1",
                Expect::Webhook { patch: false }
            ),
            Ok(())
        );
        assert_eq!(
            check_review(&answer("fixed", true, None), "u1", Expect::Transport),
            Ok(())
        );
        assert_eq!(
            check_review(b"{\"kind\":", "u1", want),
            Err(Failure::BadReview)
        );
        let wrong = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"u1","allowed":true}}"#;
        assert_eq!(check_review(wrong, "u1", want), Err(Failure::BadReview));
    }

    /// A remembered patch only spares decoding the same bytes again: every
    /// other patch is still decoded, and the uid is always checked.
    #[test]
    fn checker_remembers_only_the_patch_it_verified() {
        let good =
            r#"[{"op":"add","path":"/spec/taints/-","value":{"key":"a","effect":"NoSchedule"}}]"#;
        let want = Expect::Webhook { patch: true };
        let mut c = Checker::default();
        assert_eq!(
            c.check(&answer("u1", true, Some("[]")), "u1", want),
            Err(Failure::MissingPatch)
        );
        assert_eq!(c.check(&answer("u1", true, Some(good)), "u1", want), Ok(()));
        assert_eq!(c.check(&answer("u2", true, Some(good)), "u2", want), Ok(()));
        assert_eq!(
            c.check(&answer("u3", true, Some(good)), "u1", want),
            Err(Failure::BadUid)
        );
        assert_eq!(
            c.check(&answer("u1", true, Some("[]")), "u1", want),
            Err(Failure::MissingPatch)
        );
        assert_eq!(
            c.check(&answer("u1", true, Some("{")), "u1", want),
            Err(Failure::MissingPatch)
        );
        assert_eq!(c.check(&answer("u1", true, Some(good)), "u1", want), Ok(()));
    }
}
