//! The on-disk set of Nodes the agent last knew, so a restarted agent can
//! tell which nodes were deleted while it was down.
//!
//! Format: `{"version":1,"nodes":[NodeRecord...]}`, sorted by name. Written
//! atomically: temp file in the same directory, fsync, rename, fsync of the
//! directory — a crash at any point leaves either the old or the new file.
//!
//! The directory is a hostPath other processes on the node may write to, so
//! no path in it is trusted: the temp file is created new (`O_EXCL`, never
//! an existing file or a symlink's target) with mode 0600, files are opened
//! with `O_NOFOLLOW`, only a regular file of bounded size is read, and at
//! most [`KEEP_CORRUPT`] corrupt copies are kept.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nodegate_roster::record::NodeRecord;
use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = "nodes.json";
/// The only format version this agent reads and writes.
pub const VERSION: u64 = 1;
const TEMP_PREFIX: &str = ".nodes.json.tmp-";
const CORRUPT_PREFIX: &str = "nodes.json.corrupt-";
/// Corrupt snapshots kept for inspection (the newest); older ones go.
pub const KEEP_CORRUPT: usize = 3;
/// Largest snapshot read: ~300 bytes a node, so room for 100,000+ nodes.
pub const MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Why a snapshot file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("snapshot is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unknown snapshot version {0} (this agent reads version {VERSION})")]
    UnknownVersion(u64),
    #[error("snapshot is not a regular file of at most {MAX_BYTES} bytes")]
    NotRegular,
}

#[derive(Serialize)]
struct FileOut<'a> {
    version: u64,
    nodes: Vec<&'a NodeRecord>,
}

#[derive(Deserialize)]
struct Header {
    version: u64,
}

#[derive(Deserialize)]
struct FileIn {
    nodes: Vec<NodeRecord>,
}

/// Serializes records (any order) into the versioned file format.
pub fn encode<'a>(nodes: impl IntoIterator<Item = &'a NodeRecord>) -> serde_json::Result<Vec<u8>> {
    let mut nodes: Vec<&NodeRecord> = nodes.into_iter().collect();
    nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    serde_json::to_vec(&FileOut {
        version: VERSION,
        nodes,
    })
}

/// Parses a snapshot, checking the version before trusting the body.
pub fn decode(bytes: &[u8]) -> Result<Vec<NodeRecord>, DecodeError> {
    let header: Header = serde_json::from_slice(bytes)?;
    if header.version != VERSION {
        return Err(DecodeError::UnknownVersion(header.version));
    }
    Ok(serde_json::from_slice::<FileIn>(bytes)?.nodes)
}

/// What was found at start.
#[derive(Debug)]
pub enum Loaded {
    /// No snapshot: first start on this node (or since its last reboot).
    Missing,
    Found(Vec<NodeRecord>),
    /// Unusable; renamed to `to` and treated as empty.
    MovedAside {
        to: PathBuf,
        reason: String,
    },
}

impl Loaded {
    pub fn into_nodes(self) -> Vec<NodeRecord> {
        match self {
            Loaded::Found(n) => n,
            Loaded::Missing | Loaded::MovedAside { .. } => Vec::new(),
        }
    }
}

pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Reads the snapshot in `dir`. A corrupt or unknown-version file, or
/// anything that is not a regular file (a symlink, a FIFO), is moved to
/// `nodes.json.corrupt-<unix-ns>` so it is kept for inspection and never read
/// again; only the newest [`KEEP_CORRUPT`] such copies are kept. Temp files
/// left by a crash mid-write are removed.
pub fn load(dir: &Path) -> io::Result<Loaded> {
    remove_stale_temps(dir);
    let path = path_in(dir);
    let bytes = match read_regular(&path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        // ELOOP: a symlink; the others: not a regular file, or too big.
        Err(e)
            if e.raw_os_error() == Some(nix::libc::ELOOP)
                || e.kind() == io::ErrorKind::InvalidData =>
        {
            Err(DecodeError::NotRegular)
        }
        Err(e) => return Err(e),
    };
    match bytes.and_then(|b| decode(&b)) {
        Ok(nodes) => Ok(Loaded::Found(nodes)),
        Err(err) => {
            let ns = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            let to = dir.join(format!("{CORRUPT_PREFIX}{ns}"));
            fs::rename(&path, &to)?;
            prune_corrupt(dir, KEEP_CORRUPT);
            Ok(Loaded::MovedAside {
                to,
                reason: err.to_string(),
            })
        }
    }
}

/// Opens without following a symlink, and reads only a regular file of at
/// most [`MAX_BYTES`] (a FIFO would block, a device never end).
fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.len() > MAX_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(MAX_BYTES + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Removes all but the newest `keep` corrupt copies (by the time in their name).
fn prune_corrupt(dir: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut aside: Vec<(u128, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let ts = name.strip_prefix(CORRUPT_PREFIX)?.parse().ok()?;
            Some((ts, e.path()))
        })
        .collect();
    aside.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
    for (_, path) in aside.into_iter().skip(keep) {
        // A symlink is removed itself, never its target.
        let _ = fs::remove_file(path);
    }
}

fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// A new file, mode 0600: `O_CREAT|O_EXCL` fails on any existing name,
/// a symlink (dangling or not) included; `O_NOFOLLOW` says so twice.
fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
}

/// Replaces the snapshot in `dir` with `bytes`, durably and atomically. The
/// temp file is always a new file (mode 0600): an existing file or symlink
/// of that name makes the write fail rather than write through it.
pub fn write_atomic(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    // Unique even for two agents that are both PID 1 in their containers.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let tmp = dir.join(format!("{TEMP_PREFIX}{}-{nanos}", std::process::id()));
    let mut created = false;
    let result = (|| {
        let mut f = create_private(&tmp)?;
        created = true;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        // rename replaces a symlink at nodes.json itself, never its target.
        fs::rename(&tmp, path_in(dir))?;
        File::open(dir)?.sync_all()
    })();
    // Only what this call created is removed: the name may be someone else's.
    if result.is_err() && created {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_roster::record::NodeAddress;

    fn rec(name: &str, uid: &str) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            uid: uid.into(),
            addresses: vec![NodeAddress {
                kind: "InternalIP".into(),
                address: "10.0.0.1".into(),
            }],
            pod_cidrs: vec!["10.1.0.0/24".into()],
            provider_id: Some("kind://x".into()),
            boot_id: Some("b".into()),
            labels: [("k".to_string(), "v".to_string())].into(),
        }
    }

    #[test]
    fn round_trip_sorted_and_versioned() {
        let nodes = [rec("b", "2"), rec("a", "1")];
        let bytes = encode(nodes.iter()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["nodes"][0]["name"], "a");
        assert_eq!(v["nodes"][0]["podCIDRs"][0], "10.1.0.0/24");
        assert_eq!(decode(&bytes).unwrap(), vec![rec("a", "1"), rec("b", "2")]);
    }

    #[test]
    fn write_then_load() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(load(dir.path()).unwrap(), Loaded::Missing));
        let nodes = [rec("a", "1")];
        write_atomic(dir.path(), &encode(nodes.iter()).unwrap()).unwrap();
        write_atomic(dir.path(), &encode(nodes.iter()).unwrap()).unwrap();
        let Loaded::Found(got) = load(dir.path()).unwrap() else {
            panic!("snapshot not found")
        };
        assert_eq!(got, nodes);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![FILE_NAME], "no temp file left behind");
    }

    fn moved_aside(content: &[u8], want: &str) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(path_in(dir.path()), content).unwrap();
        fs::write(dir.path().join(format!("{TEMP_PREFIX}999")), b"{\"vers").unwrap();
        match load(dir.path()).unwrap() {
            Loaded::MovedAside { to, reason } => {
                assert!(reason.contains(want), "{reason}");
                assert_eq!(fs::read(&to).unwrap(), content, "kept for inspection");
                let n = to.file_name().unwrap().to_string_lossy().into_owned();
                assert!(n.starts_with("nodes.json.corrupt-"), "{n}");
            }
            other => panic!("expected MovedAside, got {other:?}"),
        }
        assert!(!path_in(dir.path()).exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "temp removed");
        assert!(matches!(load(dir.path()).unwrap(), Loaded::Missing));
    }

    #[test]
    fn corrupt_file_is_moved_aside() {
        moved_aside(b"{\"version\":1,\"nodes\":[{\"name\":", "JSON");
        moved_aside(b"", "JSON");
        moved_aside(b"{\"nodes\":[]}", "version");
    }

    #[test]
    fn writes_never_follow_a_symlink_and_are_private() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        // A symlink where the snapshot goes: replaced, the target untouched.
        symlink(&victim, path_in(dir.path())).unwrap();
        write_atomic(dir.path(), b"{}").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        let meta = fs::symlink_metadata(path_in(dir.path())).unwrap();
        assert!(meta.is_file(), "the link itself was replaced");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // The temp file's open: an existing name, symlink or not, fails
        // instead of being written through.
        let planted = dir.path().join(format!("{TEMP_PREFIX}planted"));
        symlink(&victim, &planted).unwrap();
        assert_eq!(
            create_private(&planted).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let dangling = dir.path().join(format!("{TEMP_PREFIX}dangling"));
        symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(create_private(&dangling).is_err());
        assert!(
            !dir.path().join("nowhere").exists(),
            "not created through the link"
        );
        fs::write(dir.path().join("plain"), b"x").unwrap();
        assert!(create_private(&dir.path().join("plain")).is_err());
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        let fresh = dir.path().join("fresh");
        drop(create_private(&fresh).unwrap());
        assert_eq!(
            fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn a_symlink_or_fifo_snapshot_is_set_aside_unread() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        fs::write(&secret, encode([&rec("a", "1")]).unwrap()).unwrap();
        symlink(&secret, path_in(dir.path())).unwrap();
        match load(dir.path()).unwrap() {
            Loaded::MovedAside { to, reason } => {
                assert!(reason.contains("regular file"), "{reason}");
                assert!(fs::symlink_metadata(&to).unwrap().file_type().is_symlink());
            }
            other => panic!("a symlink was followed: {other:?}"),
        }
        assert!(secret.exists(), "the target is left alone");
        let made = std::process::Command::new("mkfifo")
            .arg(path_in(dir.path()))
            .status()
            .unwrap();
        assert!(made.success());
        assert!(matches!(
            load(dir.path()).unwrap(),
            Loaded::MovedAside { .. }
        ));
    }

    #[test]
    fn only_the_newest_corrupt_copies_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..(KEEP_CORRUPT + 4) {
            fs::write(path_in(dir.path()), format!("garbage {i}")).unwrap();
            assert!(matches!(
                load(dir.path()).unwrap(),
                Loaded::MovedAside { .. }
            ));
        }
        let mut kept: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        assert_eq!(kept.len(), KEEP_CORRUPT, "{kept:?}");
        let mut contents: Vec<String> = kept
            .iter()
            .map(|n| fs::read_to_string(dir.path().join(n)).unwrap())
            .collect();
        contents.sort();
        let want: Vec<String> = (4..KEEP_CORRUPT + 4)
            .map(|i| format!("garbage {i}"))
            .collect();
        assert_eq!(contents, want, "the newest ones");
    }

    #[test]
    fn unknown_version_is_moved_aside() {
        moved_aside(
            b"{\"version\":2,\"nodes\":[]}",
            "unknown snapshot version 2",
        );
    }
}
