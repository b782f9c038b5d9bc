//! The serving certificate, re-read when its files change.
//!
//! Kubernetes updates a mounted Secret by writing a new timestamped directory
//! and swapping the `..data` symlink, so the *directory* is watched (a watch
//! on the file would follow the old inode). A periodic re-check covers
//! platforms and volume types where events do not arrive. A pair that fails to
//! parse or whose key does not match the certificate is refused and the
//! previous pair stays in use: a bad rotation never takes the webhook down.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::Notify;

use crate::metrics::Metrics;

/// Why a certificate/key pair was refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("cannot parse {path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("key {key} does not fit certificate {cert}: {source}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// Serves the current pair to every handshake; swaps it when the files change.
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    files: Mutex<Files>,
}

/// File contents last seen, so an unchanged re-check costs two reads and a
/// refused pair is reported once, not on every tick.
#[derive(Default)]
struct Files {
    loaded: (Vec<u8>, Vec<u8>),
    refused: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse(
    cert_path: &Path,
    key_path: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_owned(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: key_path.to_owned(),
        reason: e.to_string(),
    })?;
    let ck = CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsError::Mismatch {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })?;
    // from_der tolerates an "unknown" consistency result; we want a definite match.
    ck.keys_match().map_err(|source| TlsError::Mismatch {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })?;
    Ok(ck)
}

impl CertReloader {
    /// Loads the initial pair; fails when it is unusable (nothing to serve yet).
    pub fn load(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let cert_path = cert_path.into();
        let key_path = key_path.into();
        let cert_pem = read(&cert_path)?;
        let key_pem = read(&key_path)?;
        let ck = parse(&cert_path, &key_path, &cert_pem, &key_pem, &provider)?;
        Ok(Self {
            cert_path,
            key_path,
            provider,
            current: RwLock::new(Arc::new(ck)),
            files: Mutex::new(Files {
                loaded: (cert_pem, key_pem),
                refused: None,
            }),
        })
    }

    /// The pair handshakes get now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Re-reads the files (blocking I/O): `Ok(true)` when a new pair is in
    /// use, `Ok(false)` when nothing changed (or the same bad pair was already
    /// refused), `Err` when the new pair is bad (the old one stays).
    pub fn reload(&self) -> Result<bool, TlsError> {
        let cert_pem = read(&self.cert_path)?;
        let key_pem = read(&self.key_path)?;
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let pair = (cert_pem, key_pem);
        if files.loaded == pair || files.refused.as_ref() == Some(&pair) {
            return Ok(false);
        }
        match parse(
            &self.cert_path,
            &self.key_path,
            &pair.0,
            &pair.1,
            &self.provider,
        ) {
            Ok(ck) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(ck);
                files.loaded = pair;
                files.refused = None;
                Ok(true)
            }
            Err(err) => {
                files.refused = Some(pair);
                Err(err)
            }
        }
    }

    /// Watches the files' directories and re-checks every `interval` until
    /// `shutdown`; reloads on change. Without a usable file watch (e.g. the
    /// inotify limit is reached) it says so and relies on the re-check.
    pub fn spawn_watcher(
        self: Arc<Self>,
        interval: Duration,
        metrics: Arc<Metrics>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let changed = Arc::new(Notify::new());
        let watcher = match self.watch_dirs(changed.clone()) {
            Ok(w) => Some(w),
            Err(err) => {
                tracing::warn!(%err, every = ?interval, "cannot watch the certificate directory; re-checking periodically only");
                None
            }
        };
        tokio::spawn(async move {
            let _watcher = watcher; // dropping it stops the watch
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            tokio::pin!(shutdown);
            loop {
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = changed.notified() => {
                        // Let a burst of events (several renames) settle first.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    _ = tick.tick() => {}
                }
                let this = self.clone();
                match tokio::task::spawn_blocking(move || this.reload()).await {
                    Ok(Ok(true)) => {
                        metrics.tls_reload(true);
                        tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(err)) => {
                        metrics.tls_reload(false);
                        tracing::warn!(%err, "new serving certificate refused; keeping the previous one");
                    }
                    Err(err) => tracing::error!(%err, "certificate reload task failed"),
                }
            }
        })
    }

    /// A watch on the directories holding the cert and key that pokes `changed`.
    fn watch_dirs(&self, changed: Arc<Notify>) -> notify::Result<notify::RecommendedWatcher> {
        // notify's callback runs on its own thread; Notify is safe to poke from there.
        let mut watcher =
            notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                if res.is_ok() {
                    changed.notify_one();
                }
            })?;
        let mut dirs: Vec<PathBuf> = [&self.cert_path, &self.key_path]
            .iter()
            .map(|p| match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => PathBuf::from("."),
            })
            .collect();
        dirs.dedup();
        for dir in &dirs {
            watcher.watch(dir, RecursiveMode::NonRecursive)?;
        }
        Ok(watcher)
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use nodegate_certs::{Ca, ServingRequest};

    use super::*;

    fn write(dir: &Path, cert: &str, key: &str) {
        std::fs::write(dir.join("tls.crt"), cert).unwrap();
        std::fs::write(dir.join("tls.key"), key).unwrap();
    }

    #[test]
    fn reload_swaps_good_pairs_and_reports_a_bad_pair_once() {
        let ca = Ca::generate(1).unwrap();
        let req = ServingRequest {
            also_services: vec![],
            service: "s".into(),
            namespace: "n".into(),
            ips: vec![],
            days: 1,
        };
        let (a, b) = (ca.issue(&req).unwrap(), ca.issue(&req).unwrap());
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &a.cert_pem, &a.key_pem);
        let r = CertReloader::load(
            dir.path().join("tls.crt"),
            dir.path().join("tls.key"),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .unwrap();
        let first = r.current();
        assert!(!r.reload().unwrap(), "unchanged files are not a reload");

        write(dir.path(), &a.cert_pem, &b.key_pem);
        let err = r.reload().unwrap_err();
        assert!(matches!(err, TlsError::Mismatch { .. }), "{err}");
        assert!(!r.reload().unwrap(), "the same bad pair is reported once");
        assert!(Arc::ptr_eq(&first, &r.current()), "old pair kept");

        write(dir.path(), "garbage", "garbage");
        assert!(r.reload().is_err());
        assert!(Arc::ptr_eq(&first, &r.current()));

        write(dir.path(), &b.cert_pem, &b.key_pem);
        assert!(r.reload().unwrap());
        assert!(!Arc::ptr_eq(&first, &r.current()));

        std::fs::remove_file(dir.path().join("tls.key")).unwrap();
        assert!(matches!(r.reload(), Err(TlsError::Read { .. })));
    }

    #[test]
    fn initial_load_fails_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let err = CertReloader::load(dir.path().join("x.crt"), dir.path().join("x.key"), provider)
            .unwrap_err();
        assert!(err.to_string().contains("x.crt"), "{err}");
    }
}
