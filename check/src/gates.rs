//! The gates nodegate puts on a new Node, as installed: the agent
//! DaemonSet's declaration (`--gates`, else the one gate of its `--taint`
//! and `--probe-*` flags), with every taint the webhook StatefulSet's flags
//! add besides. What an autoscaler must be told to wait for.

use k8s_openapi::api::core::v1::Container;
use nodegate_shared::TaintSpec;
use nodegate_shared::gates::{self as declared, Gates, Probes};

use crate::container_flags::{Flags, container_flag, container_values, declared_gates, flags};
use crate::installed::Installed;

/// The name the agent gives the one gate it runs without `--gates` (its
/// `--taint`s opened by its `--probe-*` flags).
pub const LEGACY_GATE: &str = "default";

/// One taint nodegate adds, and whether it is strict mode's boot gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    pub taint: TaintSpec,
    pub boot: bool,
    /// Its name in the agent's declaration; `None` for strict mode's boot
    /// gates and for a taint only the webhook's flags name.
    pub name: Option<String>,
    /// `namespace/name` of the DaemonSet that removes it, for a gate owned
    /// elsewhere.
    pub owner: Option<String>,
}

impl Gate {
    /// The gate in a line: `cni (key:Effect)`, or `key:Effect` unnamed.
    pub fn shown(&self) -> String {
        let t = format!("{}:{}", self.taint.key(), self.taint.effect());
        match &self.name {
            Some(n) => format!("{n} ({t})"),
            None => t,
        }
    }
}

/// The agent's gates as it runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub gates: Gates,
    /// From `--gates` (or `NODEGATE_GATES`); else built from its `--taint`
    /// and `--probe-*` flags.
    pub from_flag: bool,
}

/// The declaration of an agent container: its `--gates`, else the one gate
/// [`LEGACY_GATE`] of its `--taint`s (nodegate's default without one),
/// opened by its `--probe-*` flags, read as its clap reads them: a
/// declaration holds one taint per gate, so one entry per taint, each with
/// every probe. `Err` says why the agent would refuse to start.
pub fn declaration(agent: &Container) -> Result<Declaration, String> {
    if let Some(gates) = declared_gates(agent) {
        return gates.map(|gates| Declaration {
            gates,
            from_flag: true,
        });
    }
    let f = flags(agent)?;
    // http, tcp and file split at commas; exec and pod are taken whole.
    let probes = Probes {
        http: container_flag(agent, "--probe-http", "NODEGATE_PROBE_HTTP"),
        tcp: container_flag(agent, "--probe-tcp", "NODEGATE_PROBE_TCP"),
        file: container_flag(agent, "--probe-file", "NODEGATE_PROBE_FILE"),
        exec: container_values(agent, "--probe-exec", "NODEGATE_PROBE_EXEC"),
        pod: container_values(agent, "--probe-pod", "NODEGATE_PROBE_POD"),
    };
    let gates = f
        .taints
        .into_iter()
        .map(|t| declared::Gate {
            name: LEGACY_GATE.to_string(),
            taint: declared::Taint(t),
            probes: probes.clone(),
            owner: None,
        })
        .collect();
    Ok(Declaration {
        gates: Gates {
            gates,
            boot_taints: f.boot.into_iter().map(declared::Taint).collect(),
        },
        from_flag: false,
    })
}

/// Every taint a new Node gets from nodegate; `None` when neither
/// workload's flags can be read (other lines say why).
pub fn installed(installed: &Installed) -> Option<Vec<Gate>> {
    let webhook = installed.webhook.container().and_then(|c| flags(c).ok());
    let agent = installed
        .agent
        .container()
        .and_then(|c| declaration(c).ok());
    merged(agent.as_ref(), webhook.as_ref())
}

/// The declaration's gates (opened and owned, in its order), its boot
/// gates, then every taint the webhook adds that it does not declare: the
/// gates lines fail on those, and a node still carries them.
pub fn merged(agent: Option<&Declaration>, webhook: Option<&Flags>) -> Option<Vec<Gate>> {
    if agent.is_none() && webhook.is_none() {
        return None;
    }
    let mut out: Vec<Gate> = Vec::new();
    if let Some(d) = agent {
        out.extend(d.gates.gates.iter().map(|g| Gate {
            taint: g.taint.0.clone(),
            boot: false,
            name: Some(g.name.clone()),
            owner: g.owner.as_ref().map(|o| o.daemon_set.clone()),
        }));
        out.extend(d.gates.boot_taints().into_iter().map(|taint| Gate {
            taint,
            boot: true,
            name: None,
            owner: None,
        }));
    }
    if let Some(w) = webhook {
        let ordinary = w.taints.iter().chain(&w.owned).map(|t| (t, false));
        for (t, boot) in ordinary.chain(w.boot.iter().map(|t| (t, true))) {
            let known = out
                .iter()
                .any(|g| g.taint.key() == t.key() && g.taint.effect() == t.effect());
            if !known {
                out.push(Gate {
                    taint: t.clone(),
                    boot,
                    name: None,
                    owner: None,
                });
            }
        }
    }
    Some(out)
}

/// Gates from taint specs (`ordinary`, then strict mode's `boot`), for
/// tests.
#[cfg(test)]
pub(crate) fn parsed(ordinary: &[&str], boot: &[&str]) -> Vec<Gate> {
    let g = |s: &&str, boot| Gate {
        taint: s.parse::<TaintSpec>().unwrap(),
        boot,
        name: None,
        owner: None,
    };
    ordinary
        .iter()
        .map(|s| g(s, false))
        .chain(boot.iter().map(|s| g(s, true)))
        .collect()
}

/// The gates of a declaration (YAML), for tests.
#[cfg(test)]
pub(crate) fn of_declaration(yaml: &str) -> Vec<Gate> {
    let d = Declaration {
        gates: Gates::parse(yaml).unwrap(),
        from_flag: true,
    };
    merged(Some(&d), None).unwrap()
}

/// One gate nodegate opens and one owned elsewhere (tests).
#[cfg(test)]
pub(crate) const TWO_GATES: &str = r#"
gates:
  - name: cni
    taint: nodegate.dev/agent-not-ready=true:NoSchedule
    probes:
      http: [http://127.0.0.1:9879/healthz]
  - name: ebs-csi
    taint: ebs.csi.aws.com/agent-not-ready:NoExecute
    owner: {daemonSet: kube-system/ebs-csi-node}
"#;

/// Two gates nodegate opens and one owned elsewhere (tests).
#[cfg(test)]
pub(crate) const THREE_GATES: &str = r#"
gates:
  - name: cni
    taint: nodegate.dev/agent-not-ready=true:NoSchedule
    probes:
      http: [http://127.0.0.1:9879/healthz]
      file: [/host/etc/cni/net.d/05-cilium.conflist]
  - name: dns
    taint: example.com/dns-not-ready:NoSchedule
    probes:
      tcp: [127.0.0.1:53]
  - name: ebs-csi
    taint: ebs.csi.aws.com/agent-not-ready:NoExecute
    owner: {daemonSet: kube-system/ebs-csi-node}
"#;

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

/// The declared gates that use `key`: `gate ebs-csi`, `gates a, b`, or
/// nothing.
pub fn gate_names(gates: &[Gate], key: &str) -> Option<String> {
    let mut names: Vec<&str> = Vec::new();
    for g in gates.iter().filter(|g| g.taint.key() == key) {
        if let Some(n) = g.name.as_deref()
            && !names.contains(&n)
        {
            names.push(n);
        }
    }
    match names.len() {
        0 => None,
        1 => Some(format!("gate {}", names[0])),
        _ => Some(format!("gates {}", names.join(", "))),
    }
}

/// `key`, with the declared gates that use it:
/// `ebs.csi.aws.com/agent-not-ready (gate ebs-csi)`.
pub fn key_shown(gates: &[Gate], key: &str) -> String {
    match gate_names(gates, key) {
        Some(n) => format!("{key} ({n})"),
        None => key.to_string(),
    }
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
    use serde_json::{Value, json};

    fn container(args: &[&str], env: &[(&str, &str)]) -> Container {
        let env: Vec<Value> = env
            .iter()
            .map(|(n, v)| json!({"name": n, "value": v}))
            .collect();
        serde_json::from_value(json!({"name": "agent", "args": args, "env": env})).unwrap()
    }

    fn names(d: &Declaration) -> Vec<(String, String)> {
        d.gates
            .gates
            .iter()
            .map(|g| (g.name.clone(), g.taint.0.to_string()))
            .collect()
    }

    /// `--gates` as the agent's clap reads it: the last value, args over
    /// the env var, commas kept; without it the one gate of the taint and
    /// probe flags.
    #[test]
    fn the_agents_declaration() {
        let one = |name: &str, taint: &str| {
            format!(
                "{{gates: [{{name: {name}, taint: '{taint}', probes: {{tcp: ['h:1', 'h:2']}}}}]}}"
            )
        };
        let a = one("a", "a.dev/x:NoSchedule");
        let b = one("b", "b.dev/x:NoSchedule");
        let rows = [
            (container(&[&format!("--gates={a}")], &[]), "a"),
            (
                container(&["--gates", &a, &format!("--gates={b}")], &[]),
                "b",
            ),
            (container(&[], &[("NODEGATE_GATES", &b)]), "b"),
            (
                container(&[&format!("--gates={a}")], &[("NODEGATE_GATES", &b)]),
                "a",
            ),
        ];
        for (c, want) in rows {
            let d = declaration(&c).unwrap();
            assert!(d.from_flag);
            assert_eq!(d.gates.gates[0].name, want);
            assert_eq!(d.gates.gates[0].probes.tcp, ["h:1", "h:2"]);
        }
        let err = declaration(&container(&["--gates=gates: [{name: a}]"], &[])).unwrap_err();
        assert!(err.starts_with("--gates: the gates declaration: "), "{err}");

        // The legacy form: one gate per --taint, every probe flag, exec and
        // pod probes whole.
        let d = declaration(&container(
            &[
                "--taint=a.dev/x:NoSchedule,b.dev/y:NoSchedule",
                "--probe-http=http://h/1,http://h/2",
                "--probe-exec",
                "test -f /a,b",
                "--boot-taint=a.dev/x:NoExecute",
            ],
            &[("NODEGATE_PROBE_POD", "kube-system/k8s-app=cilium,tier=node")],
        ))
        .unwrap();
        assert!(!d.from_flag);
        assert_eq!(
            names(&d),
            [
                ("default".to_string(), "a.dev/x:NoSchedule".to_string()),
                ("default".to_string(), "b.dev/y:NoSchedule".to_string())
            ]
        );
        let p = &d.gates.gates[1].probes;
        assert_eq!(p.http, ["http://h/1", "http://h/2"]);
        assert_eq!(p.exec, ["test -f /a,b"]);
        assert_eq!(p.pod, ["kube-system/k8s-app=cilium,tier=node"]);
        assert_eq!(
            d.gates.boot_taints(),
            ["a.dev/x:NoExecute".parse().unwrap()]
        );
        let d = declaration(&container(&[], &[])).unwrap();
        assert_eq!(
            names(&d),
            [(
                "default".to_string(),
                nodegate_shared::keys::DEFAULT_TAINT.to_string()
            )]
        );
        assert!(d.gates.gates[0].probes.is_empty());
    }

    /// The autoscaler lines iterate the declaration, named, and every taint
    /// the webhook adds besides.
    #[test]
    fn gates_as_installed() {
        let d = Declaration {
            gates: Gates::parse(THREE_GATES).unwrap(),
            from_flag: true,
        };
        let mut webhook = Flags::of(
            &[
                "nodegate.dev/agent-not-ready=other:NoSchedule",
                "x.dev/y:NoSchedule",
            ],
            &["x.dev/y:NoExecute"],
        );
        webhook.owned = vec!["ebs.csi.aws.com/agent-not-ready:NoExecute".parse().unwrap()];
        let got = merged(Some(&d), Some(&webhook)).unwrap();
        let shown: Vec<(String, bool, Option<String>)> = got
            .iter()
            .map(|g| (g.shown(), g.boot, g.owner.clone()))
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "cni (nodegate.dev/agent-not-ready:NoSchedule)".to_string(),
                    false,
                    None
                ),
                (
                    "dns (example.com/dns-not-ready:NoSchedule)".to_string(),
                    false,
                    None
                ),
                (
                    "ebs-csi (ebs.csi.aws.com/agent-not-ready:NoExecute)".to_string(),
                    false,
                    Some("kube-system/ebs-csi-node".to_string())
                ),
                ("x.dev/y:NoSchedule".to_string(), false, None),
                ("x.dev/y:NoExecute".to_string(), true, None),
            ]
        );
        assert_eq!(key_shown(&got, "x.dev/y"), "x.dev/y");
        assert_eq!(
            key_shown(&got, "ebs.csi.aws.com/agent-not-ready"),
            "ebs.csi.aws.com/agent-not-ready (gate ebs-csi)"
        );
        // The webhook's alone, as before the declaration.
        let alone = merged(None, Some(&Flags::of(&["a.dev/x:NoSchedule"], &[]))).unwrap();
        assert_eq!(alone, parsed(&["a.dev/x:NoSchedule"], &[]));
        assert_eq!(merged(None, None), None);
    }

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
