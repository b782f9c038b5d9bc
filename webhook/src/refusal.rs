//! Answers to requests refused by a limit, kept small.
//!
//! An oversized body whose start still names a review uid gets an
//! AdmissionReview: allowed, untouched, with a 413 status and a warning that
//! reaches the client. Denying instead would make a kubelet retry its
//! registration forever (the reason for `failurePolicy: Ignore`); allowing
//! untouched is what every other unusable review gets. Without a uid there is
//! nobody to answer, so a plain 413.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Longest uid taken from a body prefix (the API server sends a 36-byte UUID).
const MAX_UID: usize = 128;

/// The `request.uid` near the start of a body, as the API server writes it
/// (`{"kind":…,"apiVersion":…,"request":{"uid":"…"`). Only the prefix is
/// available, so this is a plain search, not a parse.
pub fn sniff_uid(prefix: &[u8]) -> Option<&str> {
    const REQUEST: &[u8] = b"\"request\":";
    const UID: &[u8] = b"\"uid\":\"";
    let after_request = find(prefix, REQUEST)? + REQUEST.len();
    let rest = &prefix[after_request..];
    let start = find(rest, UID)? + UID.len();
    let rest = &rest[start..];
    let end = rest.iter().position(|&b| b == b'"')?;
    let uid = &rest[..end];
    let plausible = !uid.is_empty()
        && uid.len() <= MAX_UID
        && uid
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    plausible.then(|| std::str::from_utf8(uid).ok()).flatten()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The answer to a body over `limit` bytes.
pub fn too_large(uid: Option<&str>, limit: usize) -> Response {
    let message = format!("AdmissionReview over the webhook's {limit}-byte limit; not inspected");
    match uid {
        Some(uid) => {
            let review = json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": uid,
                    "allowed": true,
                    "status": {"code": 413, "reason": "RequestEntityTooLarge", "message": message},
                    "warnings": [format!("nodegate: {message}: the Node was admitted without its taints")],
                },
            });
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                review.to_string(),
            )
                .into_response()
        }
        None => plain(StatusCode::PAYLOAD_TOO_LARGE, &message),
    }
}

/// A short text answer for refusals that have no review to answer.
pub fn plain(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_uid_the_api_server_writes_first() {
        let p = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"0f3c-11","kind":{"#;
        assert_eq!(sniff_uid(p), Some("0f3c-11"));
        // Cut inside the uid, no request, a uid that is not one: nothing.
        assert_eq!(sniff_uid(br#"{"request":{"uid":"0f3c"#), None);
        assert_eq!(sniff_uid(br#"{"uid":"x"}"#), None);
        assert_eq!(sniff_uid(br#"{"request":{"uid":"a\"b"}}"#), None);
        assert_eq!(sniff_uid(br#"{"request":{"uid":"<script>"}}"#), None);
        assert_eq!(sniff_uid(b"     "), None);
    }
}
