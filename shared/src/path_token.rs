//! The webhook's path token: the secret in the path the webhook
//! configuration names (`/mutate/<token>`), shared by `nodegate-certs`,
//! which makes it, and `nodegate-webhook`, which accepts it.
//!
//! The API server accepts a webhook path only if each segment is a lowercase
//! DNS-1123 subdomain (`ValidateWebhookService` in
//! `pkg/apis/admissionregistration/validation`), so a token is lowercase hex
//! in one label: at most 63 characters.

/// The authenticated route's prefix.
pub const PATH_PREFIX: &str = "/mutate/";
/// Shortest token accepted: 128 bits in hex.
pub const MIN_LEN: usize = 32;
/// Longest: one DNS-1123 label.
pub const MAX_LEN: usize = 63;

/// A token file's contents, whitespace around it ignored; `Err` says why it
/// is no token.
pub fn parse(contents: &str) -> Result<&str, String> {
    let t = contents.trim();
    if !(MIN_LEN..=MAX_LEN).contains(&t.len()) {
        return Err(format!(
            "a token of {} characters; {MIN_LEN} to {MAX_LEN} are needed",
            t.len()
        ));
    }
    if !t
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err("a token must be lowercase hex (0-9, a-f)".into());
    }
    Ok(t)
}

/// Encodes random bytes as a token.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_long_lowercase_hex_in_one_label() {
        let good = encode(&[0xab; 24]);
        assert_eq!(good.len(), 48);
        assert_eq!(parse(&format!("  {good}\n")), Ok(good.as_str()));
        assert!(parse("0123456789abcdef").is_err(), "too short");
        assert!(
            parse(&encode(&[1; 32])).is_err(),
            "64 characters: longer than a label"
        );
        assert!(
            parse(&good.to_uppercase()).is_err(),
            "the API server refuses uppercase"
        );
        assert!(parse(&format!("{}_x", &good[..40])).is_err());
    }
}
