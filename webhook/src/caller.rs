//! Which reviews may move the webhook to act beyond its answer.
//!
//! An answer only changes the request it answers, so anyone may get one. Two
//! rules also write the **stored** Node: the re-registration re-taint (a
//! Node create whose boot ID shows a reboot) and the background patch after a
//! status write. The node name and boot ID come from the review body, which
//! anyone who reaches a replica's port (host network) or has
//! `services/proxy` in the namespace can write. So those writes follow only
//! reviews that came the way the API server sends them: to the path in the
//! webhook configuration, `/mutate/<token>`, where the token is a secret
//! shared with the configuration (`nodegate-certs` makes it) and mounted from
//! a Secret. The API server's call is TLS-verified against the caBundle, so
//! the token travels only between the two. Pure: no I/O but [`Authority::load`].

use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use nodegate_shared::path_token;

/// Who may trigger the side effects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// No `--path-token-file`: every review may, as before tokens existed.
    Open,
    /// Only a review posted to `/mutate/<token>` with one of these tokens.
    /// During a rotation the file holds the new token and the old one, so
    /// the API server's reviews act whichever the lines call.
    Token(Vec<String>),
    /// `--path-token-file` is set but unusable (no Secret behind it, or a
    /// bad token): no review may, so a forged one never acts; why.
    Missing(String),
}

impl Authority {
    /// From the flag: unset is [`Authority::Open`]; a file that cannot be
    /// read or holds a token too short to be a secret is
    /// [`Authority::Missing`].
    pub fn load(path: Option<&Path>) -> Authority {
        let Some(path) = path else {
            return Authority::Open;
        };
        match std::fs::read_to_string(path) {
            Ok(s) => Authority::from_contents(&s)
                .unwrap_or_else(|why| Authority::Missing(format!("{}: {why}", path.display()))),
            Err(e) => Authority::Missing(format!("{}: {e}", path.display())),
        }
    }

    /// A token file's contents ([`path_token::parse_file`]).
    pub fn from_contents(s: &str) -> Result<Authority, String> {
        path_token::parse_file(s)
            .map(|tokens| Authority::Token(tokens.into_iter().map(str::to_owned).collect()))
    }

    /// Whether a review posted with `presented` (the path's last segment
    /// after `/mutate/`, `None` on `/mutate` or `/`) may act.
    pub fn admits(&self, presented: Option<&str>) -> bool {
        match (self, presented) {
            (Authority::Open, _) => true,
            // Every token is compared, so the time tells nothing about which matched.
            (Authority::Token(want), Some(got)) => want.iter().fold(false, |any, w| {
                constant_time_eq(w.as_bytes(), got.as_bytes()) | any
            }),
            _ => false,
        }
    }
}

/// The `--path-token-file`, read again while the webhook runs
/// ([`TokenFile::reload`]): a rotated token reaches the volume at the
/// kubelet's next sync, after the container started.
#[derive(Debug)]
pub struct TokenFile {
    path: Option<PathBuf>,
    now: RwLock<Authority>,
}

impl TokenFile {
    /// Read once now; no path is [`Authority::Open`] for good.
    pub fn load(path: Option<PathBuf>) -> TokenFile {
        let now = RwLock::new(Authority::load(path.as_deref()));
        TokenFile { path, now }
    }

    /// Whether a review posted with `presented` may act.
    pub fn admits(&self, presented: Option<&str>) -> bool {
        self.now
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .admits(presented)
    }

    pub fn current(&self) -> Authority {
        self.now
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the file again; the new authority when it changed.
    pub fn reload(&self) -> Option<Authority> {
        let path = self.path.as_deref()?;
        let fresh = Authority::load(Some(path));
        let mut now = self.now.write().unwrap_or_else(PoisonError::into_inner);
        if *now == fresh {
            return None;
        }
        *now = fresh.clone();
        Some(fresh)
    }
}

/// Equal in time independent of where the two differ, so the answer time
/// tells nothing about a guessed prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0f3a9d2c4e6b8a1f0c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f";
    const NEW: &str = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f";

    /// A rotation's file: the new token and the old; anything else unusable.
    #[test]
    fn a_file_holds_one_or_two_tokens() {
        assert_eq!(
            Authority::from_contents(&format!("\n {NEW} \n\n{TOKEN}\n")),
            Ok(Authority::Token(vec![NEW.into(), TOKEN.into()]))
        );
        for bad in [
            String::new(),
            "\n\n".to_string(),
            format!("{NEW}\n{TOKEN}\n{TOKEN}"),
            format!("{NEW}\nnot-a-token"),
        ] {
            assert!(Authority::from_contents(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn who_may_act() {
        let token = Authority::from_contents(&format!("{TOKEN}\n")).unwrap();
        let both = Authority::from_contents(&format!("{NEW}\n{TOKEN}\n")).unwrap();
        let cases = [
            (&Authority::Open, None, true),
            (&Authority::Open, Some("anything"), true),
            (&token, Some(TOKEN), true),
            (&token, None, false),
            (&token, Some(""), false),
            (&token, Some(&TOKEN[..TOKEN.len() - 1]), false),
            (
                &token,
                Some("0f3a9d2c4e6b8a1f0c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0e"),
                false,
            ),
        ];
        for (authority, presented, want) in cases {
            assert_eq!(
                authority.admits(presented),
                want,
                "{authority:?} {presented:?}"
            );
        }
        for presented in [TOKEN, NEW] {
            assert!(both.admits(Some(presented)), "{presented}");
        }
        assert!(!both.admits(None));
        assert!(!both.admits(Some(&NEW[..NEW.len() - 1])));
        let missing = Authority::Missing("no file".into());
        assert!(!missing.admits(Some(TOKEN)));
        assert!(!missing.admits(None));
    }

    /// A Secret that reaches the volume after the container started (or a
    /// rotated token) takes effect at the next reload.
    #[test]
    fn a_token_written_after_start_is_picked_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let file = TokenFile::load(Some(path.clone()));
        assert!(matches!(file.current(), Authority::Missing(_)));
        assert!(!file.admits(Some(TOKEN)));
        assert_eq!(file.reload(), None, "still missing: no change");
        std::fs::write(&path, TOKEN).unwrap();
        assert_eq!(file.reload(), Some(Authority::Token(vec![TOKEN.into()])));
        assert!(file.admits(Some(TOKEN)));
        assert_eq!(file.reload(), None);
        let open = TokenFile::load(None);
        assert!(open.admits(None));
        assert_eq!(open.reload(), None);
    }

    #[test]
    fn the_flag_unset_is_open_and_an_unreadable_file_is_missing() {
        assert_eq!(Authority::load(None), Authority::Open);
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("token");
        assert!(matches!(
            Authority::load(Some(&absent)),
            Authority::Missing(_)
        ));
        std::fs::write(&absent, TOKEN).unwrap();
        assert_eq!(
            Authority::load(Some(&absent)),
            Authority::Token(vec![TOKEN.into()])
        );
    }
}
