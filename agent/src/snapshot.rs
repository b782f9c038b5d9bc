//! The on-disk set of Nodes the agent last knew, so a restarted agent can
//! tell which nodes were deleted while it was down.
//!
//! Format: `{"version":1,"nodes":[NodeRecord...]}`, sorted by name. Written
//! atomically: temp file in the same directory, fsync, rename, fsync of the
//! directory — a crash at any point leaves either the old or the new file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::record::NodeRecord;

pub const FILE_NAME: &str = "nodes.json";
/// The only format version this agent reads and writes.
pub const VERSION: u64 = 1;
const TEMP_PREFIX: &str = ".nodes.json.tmp-";

/// Why a snapshot file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("snapshot is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unknown snapshot version {0} (this agent reads version {VERSION})")]
    UnknownVersion(u64),
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

/// Reads the snapshot in `dir`. A corrupt or unknown-version file is moved to
/// `nodes.json.corrupt-<unix-ts>` so it is kept for inspection and never read
/// again. Temp files left by a crash mid-write are removed.
pub fn load(dir: &Path) -> io::Result<Loaded> {
    remove_stale_temps(dir);
    let path = path_in(dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(e),
    };
    match decode(&bytes) {
        Ok(nodes) => Ok(Loaded::Found(nodes)),
        Err(err) => {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default();
            let to = dir.join(format!("{FILE_NAME}.corrupt-{ts}"));
            fs::rename(&path, &to)?;
            Ok(Loaded::MovedAside {
                to,
                reason: err.to_string(),
            })
        }
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

/// Replaces the snapshot in `dir` with `bytes`, durably and atomically.
pub fn write_atomic(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    // Unique even for two agents that are both PID 1 in their containers.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let tmp = dir.join(format!("{TEMP_PREFIX}{}-{nanos}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path_in(dir))?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::NodeAddress;

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
    fn unknown_version_is_moved_aside() {
        moved_aside(
            b"{\"version\":2,\"nodes\":[]}",
            "unknown snapshot version 2",
        );
    }
}
