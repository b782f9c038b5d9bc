//! Writing the certificate files atomically, as the webhook's reloader reads them.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::ca::ServingCert;
use crate::error::CertError;

/// File names inside the output directory, as a `kubernetes.io/tls` Secret
/// (plus `ca.crt`) mounts them.
pub const CA_FILE: &str = "ca.crt";
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`, creating it.
///
/// Each file is written to a temporary name and renamed into place, so a
/// reader (the webhook's reloader) never sees a partly written file.
pub fn write_files(
    dir: impl AsRef<Path>,
    ca_pem: &str,
    serving: &ServingCert,
) -> Result<(), CertError> {
    let dir = dir.as_ref();
    fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_owned(),
        source,
    })?;
    write_atomic(&dir.join(CA_FILE), ca_pem.as_bytes(), 0o644)?;
    write_atomic(&dir.join(KEY_FILE), serving.key_pem.as_bytes(), 0o600)?;
    write_atomic(&dir.join(CERT_FILE), serving.cert_pem.as_bytes(), 0o644)?;
    Ok(())
}

/// Writes `data` to `path` with `mode` through a temporary name and a rename.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_owned(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut f = opts.open(&tmp)?;
        // The mode given to open() only applies when the file is created.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{Ca, test_request as request};

    #[test]
    fn writes_files_atomically_with_private_key_mode() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let ca = Ca::generate(1).unwrap();
        let leaf = ca.issue(&request()).unwrap();
        write_files(&out, ca.cert_pem(), &leaf).unwrap();
        assert_eq!(
            fs::read_to_string(out.join(CA_FILE)).unwrap(),
            ca.cert_pem()
        );
        assert_eq!(
            fs::read_to_string(out.join(CERT_FILE)).unwrap(),
            leaf.cert_pem
        );
        assert_eq!(
            fs::read_to_string(out.join(KEY_FILE)).unwrap(),
            leaf.key_pem
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(out.join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Overwriting works and leaves no temporary files behind.
        let leaf2 = ca.issue(&request()).unwrap();
        write_files(&out, ca.cert_pem(), &leaf2).unwrap();
        assert_eq!(
            fs::read_to_string(out.join(CERT_FILE)).unwrap(),
            leaf2.cert_pem
        );
        let mut names: Vec<_> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["ca.crt", "tls.crt", "tls.key"]);
    }
}
