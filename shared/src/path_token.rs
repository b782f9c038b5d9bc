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

/// Tokens a token file (the Secret's `token` key) may hold: the one the
/// lines call, and during a rotation the one it replaces.
pub const MAX_TOKENS: usize = 2;

/// A token file's tokens, one a line (blank lines and whitespace around each
/// ignored), the one the lines call first: 1 to [`MAX_TOKENS`]. One bad line
/// makes the whole file unusable, so a typo never silently drops a token the
/// lines still call.
pub fn parse_file(contents: &str) -> Result<Vec<&str>, String> {
    let tokens = contents
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse)
        .collect::<Result<Vec<_>, _>>()?;
    match tokens.len() {
        0 => Err("no token".into()),
        n if n > MAX_TOKENS => Err(format!(
            "{n} tokens; at most {MAX_TOKENS} (the current one and the one it replaces)"
        )),
        _ => Ok(tokens),
    }
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

    #[test]
    fn a_file_holds_one_token_or_two_during_a_rotation() {
        let (a, b) = (encode(&[0xab; 24]), encode(&[0xcd; 24]));
        assert_eq!(parse_file(&format!("{a}\n")), Ok(vec![a.as_str()]));
        assert_eq!(
            parse_file(&format!("\n {b} \n\n{a}\n")),
            Ok(vec![b.as_str(), a.as_str()])
        );
        for bad in [
            String::new(),
            "\n".into(),
            format!("{a}\n{b}\n{a}"),
            format!("{a}\nnope"),
        ] {
            assert!(parse_file(&bad).is_err(), "{bad:?}");
        }
    }
}
