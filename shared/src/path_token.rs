//! The webhook's path token: the secret in the path the webhook
//! configuration names (`/mutate/<token>`), shared by `nodegate-certs`,
//! which makes it, and `nodegate-webhook`, which accepts it.

/// The authenticated route's prefix.
pub const PATH_PREFIX: &str = "/mutate/";
/// Shortest token accepted: 128 bits in base64url.
pub const MIN_LEN: usize = 22;

/// A token file's contents, whitespace around it ignored; `Err` says why it
/// is no token.
pub fn parse(contents: &str) -> Result<&str, String> {
    let t = contents.trim();
    if t.len() < MIN_LEN {
        return Err(format!(
            "a token of {} characters; at least {MIN_LEN} are needed",
            t.len()
        ));
    }
    if !t
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err("a token must be base64url (A-Z, a-z, 0-9, - and _)".into());
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_long_and_url_safe() {
        assert!(parse("short").is_err());
        assert!(parse("k3XJ9d_Qm2-vN8pL4sT6wY0zA1bC5eF7/..").is_err());
        assert_eq!(
            parse("  k3XJ9d_Qm2-vN8pL4sT6wY0zA1bC5eF7\n"),
            Ok("k3XJ9d_Qm2-vN8pL4sT6wY0zA1bC5eF7")
        );
    }
}
