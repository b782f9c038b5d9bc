//! The gates nodegate puts on a new Node, as installed: the webhook
//! StatefulSet's taint flags, else the agent DaemonSet's (the strict-mode
//! check says when the two differ). What an autoscaler must be told to wait
//! for.

use nodegate_shared::TaintSpec;

use crate::container_flags::flags;
use crate::installed::Installed;

/// One taint nodegate adds, and whether it is strict mode's boot gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    pub taint: TaintSpec,
    pub boot: bool,
}

/// Every taint a new Node gets from nodegate; `None` when neither
/// workload's flags can be read (other lines say why).
pub fn installed(installed: &Installed) -> Option<Vec<Gate>> {
    let read = |w: &crate::installed::Workload| w.container().and_then(|c| flags(c).ok());
    let f = read(&installed.webhook).or_else(|| read(&installed.agent))?;
    let ordinary = f
        .taints
        .into_iter()
        .map(|taint| Gate { taint, boot: false });
    let boot = f.boot.into_iter().map(|taint| Gate { taint, boot: true });
    Some(ordinary.chain(boot).collect())
}

/// Gates from taint specs (`ordinary`, then strict mode's `boot`), for
/// tests.
#[cfg(test)]
pub(crate) fn parsed(ordinary: &[&str], boot: &[&str]) -> Vec<Gate> {
    let g = |s: &&str, boot| Gate {
        taint: s.parse::<TaintSpec>().unwrap(),
        boot,
    };
    ordinary
        .iter()
        .map(|s| g(s, false))
        .chain(boot.iter().map(|s| g(s, true)))
        .collect()
}

/// The distinct keys of `gates`, in order.
pub fn keys(gates: &[Gate]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for g in gates {
        if !out.contains(&g.taint.key()) {
            out.push(g.taint.key());
        }
    }
    out
}

/// A release of another project, as nodegate-check found it: from a flag
/// the operator passed, or from an image tag. `Unknown` says why, so a line
/// that depends on the version says so instead of passing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    Known((u64, u64, u64)),
    /// Why not: no Deployment found, a digest-only image …
    Unknown(String),
}

impl Version {
    /// The value of `--<flag>` (e.g. `1.31.5` or `v1.28.2`).
    pub fn given(flag: &str, value: &str) -> Version {
        match image_version(&format!("x:{value}")) {
            Some(v) => Version::Known(v),
            None => Version::Unknown(format!("--{flag} {value:?} is not a version like 1.31.5")),
        }
    }

    /// The tag of `image`.
    pub fn of_image(image: &str) -> Version {
        match image_version(image) {
            Some(v) => Version::Known(v),
            None => Version::Unknown(format!("its image {image} has no version tag")),
        }
    }

    /// `Some(true)` from `since` on, `Some(false)` before, `None` unknown.
    pub fn at_least(&self, since: (u64, u64, u64)) -> Option<bool> {
        match self {
            Version::Known(v) => Some(*v >= since),
            Version::Unknown(_) => None,
        }
    }
}

/// A release of the form `v1.31.5`, `1.13.0` or `v1.36.0-beta.1`, read from
/// an image reference's tag (`registry/path:tag[@digest]`); `None` for a
/// digest-only reference or a tag that is no version.
pub fn image_version(image: &str) -> Option<(u64, u64, u64)> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let (_, tag) = last.split_once(':')?;
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let core = tag.split(['-', '+']).next().unwrap_or(tag);
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// An image reference without its tag or digest:
/// `registry.k8s.io/autoscaling/cluster-autoscaler` for
/// `registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5`.
pub fn image_name(image: &str) -> &str {
    let without_digest = image.split('@').next().unwrap_or(image);
    let (path, last) = match without_digest.rsplit_once('/') {
        Some((p, l)) => (Some(p), l),
        None => (None, without_digest),
    };
    let name_len = last.split(':').next().map_or(last.len(), str::len);
    let end = path.map_or(0, |p| p.len() + 1) + name_len;
    &without_digest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_tag_only() {
        let cases = [
            (
                "registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5",
                Some((1, 31, 5)),
            ),
            (
                "public.ecr.aws/karpenter/controller:1.13.0@sha256:abcd",
                Some((1, 13, 0)),
            ),
            ("localhost:5000/karpenter/controller:v1.2", Some((1, 2, 0))),
            ("x/cluster-autoscaler:v1.36.0-beta.1", Some((1, 36, 0))),
            ("public.ecr.aws/karpenter/controller@sha256:abcd", None),
            ("localhost:5000/cluster-autoscaler", None),
            ("x/cluster-autoscaler:latest", None),
        ];
        for (image, want) in cases {
            assert_eq!(image_version(image), want, "{image}");
        }
    }

    #[test]
    fn names_drop_tag_and_digest_not_the_registry_port() {
        let cases = [
            (
                "registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5",
                "registry.k8s.io/autoscaling/cluster-autoscaler",
            ),
            (
                "localhost:5000/cluster-autoscaler",
                "localhost:5000/cluster-autoscaler",
            ),
            ("cluster-autoscaler@sha256:ab", "cluster-autoscaler"),
        ];
        for (image, want) in cases {
            assert_eq!(image_name(image), want, "{image}");
        }
    }
}
