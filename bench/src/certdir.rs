//! Serving certificates for the servers under test, laid out as a
//! Kubernetes Secret volume so rotation looks like it does in a pod.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use nodegate_certs::{CA_FILE, CERT_FILE, Ca, KEY_FILE, ServingRequest, write_files};

/// The symlink kubelet's AtomicWriter swaps on every Secret update.
const DATA_LINK: &str = "..data";

/// How a rotation replaces the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RotateStyle {
    /// As kubelet does for a Secret volume: write a new timestamped directory,
    /// then atomically rename a `..data` symlink onto it (both files change at once).
    Secret,
    /// Plain files (as `nodegate-certs --out-dir` writes them) replaced in
    /// place: `tls.key` then `tls.crt`, each via temp file + rename (for a
    /// moment the pair does not match; the server must keep the old one).
    Files,
}

/// A CA and a directory holding `tls.crt`, `tls.key` and `ca.crt`.
pub struct CertDir {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    ca: Ca,
    generation: u64,
}

impl std::fmt::Debug for CertDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertDir")
            .field("dir", &self.dir)
            .field("generation", &self.generation)
            .finish()
    }
}

fn request() -> ServingRequest {
    ServingRequest {
        also_services: vec![],
        service: "nodegate-webhook".into(),
        namespace: "nodegate".into(),
        ips: vec![IpAddr::from([127, 0, 0, 1])],
        days: 1,
    }
}

impl CertDir {
    /// A fresh CA and first serving certificate in a temporary directory,
    /// laid out for `style` of rotation.
    pub fn new(style: RotateStyle) -> anyhow::Result<CertDir> {
        let tmp = tempfile::tempdir().context("creating a temporary cert directory")?;
        let dir = tmp.path().to_owned();
        let ca = Ca::generate(1).context("generating the CA")?;
        let mut me = CertDir {
            _tmp: tmp,
            dir,
            ca,
            generation: 0,
        };
        if style == RotateStyle::Files {
            let leaf = me.ca.issue(&request()).context("issuing a serving cert")?;
            write_files(&me.dir, me.ca.cert_pem(), &leaf)?;
            return Ok(me);
        }
        let first = me.write_generation()?;
        std::os::unix::fs::symlink(&first, me.dir.join(DATA_LINK))?;
        for f in [CA_FILE, CERT_FILE, KEY_FILE] {
            std::os::unix::fs::symlink(Path::new(DATA_LINK).join(f), me.dir.join(f))?;
        }
        Ok(me)
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.join(KEY_FILE)
    }

    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// How many rotations happened.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Writes a new leaf from the same CA into a new `..gen_N` directory and
    /// returns its name (relative, as kubelet's symlinks are).
    fn write_generation(&mut self) -> anyhow::Result<String> {
        let name = format!("..gen_{}", self.generation);
        let leaf = self
            .ca
            .issue(&request())
            .context("issuing a serving cert")?;
        write_files(self.dir.join(&name), self.ca.cert_pem(), &leaf)?;
        Ok(name)
    }

    /// Replaces the serving certificate with a new leaf from the same CA.
    pub fn rotate(&mut self, style: RotateStyle) -> anyhow::Result<()> {
        match style {
            RotateStyle::Secret => {
                let old = format!("..gen_{}", self.generation);
                self.generation += 1;
                let new = self.write_generation()?;
                let tmp = self.dir.join("..data_tmp");
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&new, &tmp)?;
                std::fs::rename(&tmp, self.dir.join(DATA_LINK)).context("swapping ..data")?;
                std::fs::remove_dir_all(self.dir.join(old))
                    .context("removing the old generation")?;
            }
            RotateStyle::Files => {
                self.generation += 1;
                let leaf = self
                    .ca
                    .issue(&request())
                    .context("issuing a serving cert")?;
                write_files(&self.dir, self.ca.cert_pem(), &leaf)?;
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
    fn rotation_swaps_the_pair_behind_stable_paths() {
        for style in [RotateStyle::Secret, RotateStyle::Files] {
            let mut d = CertDir::new(style).unwrap();
            let cert0 = std::fs::read_to_string(d.cert_path()).unwrap();
            let key0 = std::fs::read_to_string(d.key_path()).unwrap();
            assert!(cert0.contains("BEGIN CERTIFICATE"));
            assert!(key0.contains("PRIVATE KEY"));
            d.rotate(style).unwrap();
            d.rotate(style).unwrap();
            assert_eq!(d.generation(), 2);
            let cert2 = std::fs::read_to_string(d.cert_path()).unwrap();
            let key2 = std::fs::read_to_string(d.key_path()).unwrap();
            assert_ne!(cert0, cert2, "{style:?}");
            assert_ne!(key0, key2, "{style:?}");
            // The server's resolver loads the new pair.
            nodegate_webhook::tls::CertReloader::load(
                d.cert_path(),
                d.key_path(),
                nodegate_webhook::serve::crypto_provider(),
            )
            .unwrap();
            // Same CA throughout.
            let ca = std::fs::read_to_string(d.dir.join(CA_FILE)).unwrap();
            assert_eq!(ca, d.ca_pem());
        }
    }

    #[test]
    fn secret_style_leaves_one_generation() {
        let mut d = CertDir::new(RotateStyle::Secret).unwrap();
        for _ in 0..3 {
            d.rotate(RotateStyle::Secret).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(&d.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["..data", "..gen_3", "ca.crt", "tls.crt", "tls.key"]);
    }
}
