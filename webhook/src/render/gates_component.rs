//! `nodegate-webhook gates-component`: a kustomize Component that turns the
//! base install (manifests/base: one gate, nodegate's default key, opened by
//! Cilium's probes) into the gate set of a gates declaration
//! (`nodegate_shared::gates`), the way `components/key-profiles/*` switch
//! one key:
//!
//! * the webhook StatefulSet gets the declaration's `--taint`s (nodegate's
//!   gates), `--owned-taint`s (gates owned elsewhere) and `--boot-taint`s
//!   in place of the base's `--taint`, and tolerates every one of their keys
//!   (it runs before any of their agents is ready);
//! * the agent DaemonSet gets `--gates=<the declaration as JSON>` in place
//!   of the base's `--taint` and Cilium's two probes;
//! * `confinement.yaml`, `webhook-config.yaml` and `admission-policy.yaml`
//!   are the other generators' output for those flags;
//! * with pod probes, the agent's Role and RoleBinding to read Pods in each
//!   probed namespace (what `components/probe-pod` grants for Cilium's).
//!
//! Every patch of an argument `test`s the base's value first, so a base that
//! changed, or another component that changed the same argument, fails the
//! build instead of gating with the wrong taint. Pure: the command writes
//! the files.

use std::fmt::Write as _;

use anyhow::Context;
use nodegate_shared::TaintSpec;
use nodegate_shared::gate_flags::{GateFlags, OwnedFlags};
use nodegate_shared::gates::Gates;
use nodegate_shared::keys::{DEFAULT_TAINT, LEGACY_TAINT};
use nodegate_shared::taint::is_dns1123_label;

use crate::render::{confinement, policy, taint_flags, webhook_config};

/// The declaration's copy in the component.
pub const GATES_FILE: &str = "gates.yaml";
/// The agent's Role and RoleBinding for pod probes, when there are any.
pub const PROBE_POD_RBAC_FILE: &str = "probe-pod-rbac.yaml";
/// The Services of replicas past the base's two, when `--replicas` asks.
pub const REPLICA_SERVICES_FILE: &str = "replica-services.yaml";

/// Where the base's webhook StatefulSet names its taint, and what it says.
const WEBHOOK_TAINT_ARG: usize = 4;
/// The agent DaemonSet's taint (argument 0), then Cilium's two probes.
const AGENT_TAINT_ARG: usize = 0;
const BASE_PROBES: [&str; 2] = [
    "--probe-http=http://127.0.0.1:9879/healthz",
    "--probe-file=/host/etc/cni/net.d/05-cilium.conflist",
];
/// The base's webhook tolerates these keys already.
fn tolerated_by_base(key: &str) -> bool {
    [DEFAULT_TAINT, LEGACY_TAINT]
        .iter()
        .filter_map(|t| t.parse::<TaintSpec>().ok())
        .any(|t| t.key() == key)
}

const WEBHOOK_ARGS: &str = "/spec/template/spec/containers/0/args";
const AGENT_ARGS: &str = "/spec/template/spec/containers/0/args";

/// What `--out` receives: each file's name in the directory and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub name: &'static str,
    pub text: String,
}

/// The header of the declaration's copy; taken off a declaration that has
/// it, so running the command on its own output changes nothing.
fn gates_header() -> String {
    format!(
        "# The gates declaration of this component. Run in this directory,\n\
         # `{}`\n\
         # writes every other file here from it (docs/gates.md).\n",
        command(None)
    )
}

/// The command that makes the component from the directory's own copy of
/// the declaration; `replicas` when not the default.
fn command(replicas: Option<u32>) -> String {
    let mut c = format!("nodegate-webhook gates-component --gates {GATES_FILE} --out .");
    if let Some(n) = replicas.filter(|n| *n != webhook_config::DEFAULT_REPLICAS) {
        let _ = write!(c, " --replicas {n}");
    }
    c
}

/// The component's files for `declaration` (the text of a gates
/// declaration, YAML or JSON) and `replicas` webhook replicas.
pub fn render(declaration: &str, replicas: u32) -> anyhow::Result<Vec<File>> {
    let gates = Gates::parse(declaration)?;
    let gate = GateFlags {
        taints: gates.taints(),
        boot_taints: gates.boot_taints(),
    };
    gate.validate()?;
    let owned = OwnedFlags {
        owned_taints: gates.owned_taints(),
    };
    owned.validate(&gate)?;
    let (ordinary, boot, owned) = (gate.taints, gate.boot_taints, owned.owned_taints);
    let namespaces = probed_namespaces(&gates)?;

    let policy = policy::render_owned(&ordinary, &boot, &owned, policy::ApiVersion::V1);
    let first_policy = policy.split("\n---\n").next().unwrap_or_default();
    let body = declaration
        .strip_prefix(gates_header().as_str())
        .unwrap_or(declaration);
    let mut files = vec![
        File {
            name: "kustomization.yaml",
            text: kustomization(&gates, &ordinary, &boot, &owned, replicas, &namespaces),
        },
        File {
            name: "confinement.yaml",
            text: confinement::render_owned(&ordinary, &boot, &owned, &[]),
        },
        File {
            name: "webhook-config.yaml",
            text: webhook_config::render_owned(&ordinary, &boot, &owned, replicas),
        },
        File {
            name: "admission-policy.yaml",
            text: format!("{first_policy}\n"),
        },
        File {
            name: GATES_FILE,
            text: format!("{}{body}", gates_header()),
        },
    ];
    if !namespaces.is_empty() {
        files.push(File {
            name: PROBE_POD_RBAC_FILE,
            text: probe_pod_rbac(&namespaces),
        });
    }
    if replicas > webhook_config::DEFAULT_REPLICAS {
        files.push(File {
            name: REPLICA_SERVICES_FILE,
            text: replica_services(replicas),
        });
    }
    Ok(files)
}

/// The namespaces of the declaration's pod probes (`NAMESPACE/SELECTOR`),
/// each once, in order.
fn probed_namespaces(gates: &Gates) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for g in gates.opened() {
        for p in &g.probes.pod {
            let ns = p
                .split_once('/')
                .map(|(ns, _)| ns)
                .filter(|ns| is_dns1123_label(ns))
                .with_context(|| {
                    format!(
                        "gate {:?}: pod probe {p:?} is not NAMESPACE/LABEL_SELECTOR",
                        g.name
                    )
                })?;
            if !out.iter().any(|n| n == ns) {
                out.push(ns.to_owned());
            }
        }
    }
    Ok(out)
}

/// A YAML single-quoted scalar: any text, as one line.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn kustomization(
    gates: &Gates,
    ordinary: &[TaintSpec],
    boot: &[TaintSpec],
    owned: &[TaintSpec],
    replicas: u32,
    namespaces: &[String],
) -> String {
    let flags = taint_flags(ordinary, owned, boot);
    let mut out = format!(
        "# Generated by `{command}` in this\n\
         # directory; do not edit: change {GATES_FILE} and run it again (a test compares\n\
         # the shipped components with the output).\n\
         #\n\
         # The gates of {GATES_FILE} on the base install (manifests/base, which gates\n\
         # with {DEFAULT_TAINT} opened by Cilium's probes):\n",
        command = command(Some(replicas)),
    );
    let width = gates.gates.iter().map(|g| g.name.len()).max().unwrap_or(0);
    let taint_width = ordinary
        .iter()
        .chain(owned)
        .chain(boot)
        .map(|t| t.to_string().len())
        .max()
        .unwrap_or(0);
    for g in &gates.gates {
        let who = match &g.owner {
            Some(o) => format!("owned elsewhere: DaemonSet {} removes it", o.daemon_set),
            None => match g.probes.len() {
                1 => "nodegate's agent opens it (1 probe)".to_owned(),
                n => format!("nodegate's agent opens it ({n} probes)"),
            },
        };
        let taint = g.taint.0.to_string();
        let _ = writeln!(out, "#   {:width$}  {taint:taint_width$}  {who}", g.name);
    }
    for t in boot {
        let t = t.to_string();
        let _ = writeln!(
            out,
            "#   {:width$}  {t:taint_width$}  strict mode's boot gate",
            ""
        );
    }
    out.push_str(
        "#\n\
         #   components: [../manifests/components/gates/<this directory>]\n\
         #\n\
         # The webhook adds every gate at a Node's create and at a new boot; a gate\n\
         # owned elsewhere at no other time, so that its owner's removal stands.\n\
         # The agent takes the whole declaration (--gates), opens each of nodegate's\n\
         # gates on its own probes, and never adds or removes a gate owned elsewhere,\n\
         # nor may its token (confinement.yaml). Not with a component that\n\
         # changes the gates or the agent's probes (key-profiles, strict-mode,\n\
         # release-cilium-key, probe-pod): their patches fail the build or undo\n\
         # these; put strict mode's gate in the declaration's bootTaints instead.\n",
    );
    if !namespaces.is_empty() {
        let _ = write!(
            out,
            "#\n\
             # Pod probes: {PROBE_POD_RBAC_FILE} lets the agent list and watch Pods in\n\
             # {} only (what components/probe-pod grants for Cilium's).\n",
            namespaces.join(", ")
        );
    }
    let _ = write!(
        out,
        "#\n\
         # confinement.yaml is `nodegate-webhook confinement {flags}`,\n\
         # webhook-config.yaml `nodegate-webhook webhook-config {flags} --replicas {replicas}`\n\
         # and admission-policy.yaml the first document of `nodegate-webhook policy\n\
         # {flags}` (patched in only under the admission-policy overlay).\n\
         apiVersion: kustomize.config.k8s.io/v1alpha1\n\
         kind: Component\n",
    );
    let mut resources: Vec<&str> = Vec::new();
    if !namespaces.is_empty() {
        resources.push(PROBE_POD_RBAC_FILE);
    }
    if replicas > webhook_config::DEFAULT_REPLICAS {
        resources.push(REPLICA_SERVICES_FILE);
    }
    if !resources.is_empty() {
        out.push_str("resources:\n");
        for r in resources {
            let _ = writeln!(out, "  - {r}");
        }
    }
    out.push_str("patches:\n");
    out.push_str(&webhook_patch(ordinary, boot, owned, replicas));
    out.push_str(&agent_patch(gates));
    out.push_str(
        "  - path: confinement.yaml\n\
         \x20 # The backup lines' still-ungated condition names nodegate's gates.\n\
         \x20 - path: webhook-config.yaml\n\
         \x20 - path: admission-policy.yaml\n\
         \x20   target: {kind: MutatingAdmissionPolicy, name: nodegate}\n",
    );
    out
}

/// The webhook StatefulSet: its flags and tolerations.
fn webhook_patch(
    ordinary: &[TaintSpec],
    boot: &[TaintSpec],
    owned: &[TaintSpec],
    replicas: u32,
) -> String {
    let base = format!("--taint={DEFAULT_TAINT}");
    let args: Vec<String> = ordinary
        .iter()
        .map(|t| format!("--taint={t}"))
        .chain(owned.iter().map(|t| format!("--owned-taint={t}")))
        .chain(boot.iter().map(|t| format!("--boot-taint={t}")))
        .collect();
    let mut out = format!(
        "  - target: {{kind: StatefulSet, name: nodegate-webhook}}\n\
         \x20   patch: |-\n\
         \x20     - op: test\n\
         \x20       path: {WEBHOOK_ARGS}/{WEBHOOK_TAINT_ARG}\n\
         \x20       value: {base}\n"
    );
    for (i, a) in args.iter().enumerate() {
        let op = if i == 0 { "replace" } else { "add" };
        let _ = write!(
            out,
            "      - op: {op}\n\
             \x20       path: {WEBHOOK_ARGS}/{}\n\
             \x20       value: {a}\n",
            WEBHOOK_TAINT_ARG + i
        );
    }
    let mut keys: Vec<&str> = Vec::new();
    for t in ordinary.iter().chain(owned).chain(boot) {
        if !tolerated_by_base(t.key()) && !keys.contains(&t.key()) {
            keys.push(t.key());
        }
    }
    if !keys.is_empty() {
        out.push_str(
            "      # The webhook runs before any of these gates opens: it tolerates each.\n",
        );
    }
    for k in keys {
        let _ = write!(
            out,
            "      - op: add\n\
             \x20       path: /spec/template/spec/tolerations/-\n\
             \x20       value: {{key: {k}, operator: Exists}}\n"
        );
    }
    if replicas != webhook_config::DEFAULT_REPLICAS {
        let _ = write!(
            out,
            "      # One backup line per replica (webhook-config.yaml).\n\
             \x20     - op: test\n\
             \x20       path: /spec/replicas\n\
             \x20       value: {}\n\
             \x20     - op: replace\n\
             \x20       path: /spec/replicas\n\
             \x20       value: {replicas}\n",
            webhook_config::DEFAULT_REPLICAS
        );
    }
    out
}

/// The agent DaemonSet: the declaration in place of the base's taint and
/// Cilium's probes (the agent refuses `--gates` beside them).
fn agent_patch(gates: &Gates) -> String {
    let base = format!("--taint={DEFAULT_TAINT}");
    let flag = quoted(&format!("--gates={}", gates.to_flag()));
    let mut out = format!(
        "  - target: {{kind: DaemonSet, name: nodegate-agent}}\n\
         \x20   patch: |-\n\
         \x20     - op: test\n\
         \x20       path: {AGENT_ARGS}/{AGENT_TAINT_ARG}\n\
         \x20       value: {base}\n\
         \x20     - op: replace\n\
         \x20       path: {AGENT_ARGS}/{AGENT_TAINT_ARG}\n\
         \x20       value: {flag}\n"
    );
    for probe in BASE_PROBES {
        // Each probe in turn moves up to the place after --gates.
        let _ = write!(
            out,
            "      - op: test\n\
             \x20       path: {AGENT_ARGS}/{i}\n\
             \x20       value: {probe}\n\
             \x20     - op: remove\n\
             \x20       path: {AGENT_ARGS}/{i}\n",
            i = AGENT_TAINT_ARG + 1
        );
    }
    out
}

/// The agent's Role and RoleBinding to list and watch Pods in each probed
/// namespace: the same grant as `components/probe-pod/rbac.yaml`.
fn probe_pod_rbac(namespaces: &[String]) -> String {
    let mut out = format!(
        "# Generated by `{}` (kustomization.yaml); do not edit.\n\
         # Pod list/watch in each namespace a pod probe of {GATES_FILE} reads, and\n\
         # only there (Roles, not a ClusterRole): a stolen agent token reads no Pod\n\
         # spec elsewhere. The agent reads them with the field selector\n\
         # spec.nodeName=<its node>.\n",
        command(None)
    );
    for (i, ns) in namespaces.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let _ = write!(
            out,
            "apiVersion: rbac.authorization.k8s.io/v1\n\
             kind: Role\n\
             metadata:\n\
             \x20 name: nodegate-agent-probe-pod\n\
             \x20 namespace: {ns}\n\
             \x20 labels:\n\
             \x20   app.kubernetes.io/name: nodegate-agent\n\
             \x20   app.kubernetes.io/part-of: nodegate\n\
             rules:\n\
             \x20 - apiGroups: [\"\"]\n\
             \x20   resources: [\"pods\"]\n\
             \x20   verbs: [\"list\", \"watch\"]\n\
             ---\n\
             apiVersion: rbac.authorization.k8s.io/v1\n\
             kind: RoleBinding\n\
             metadata:\n\
             \x20 name: nodegate-agent-probe-pod\n\
             \x20 namespace: {ns}\n\
             \x20 labels:\n\
             \x20   app.kubernetes.io/name: nodegate-agent\n\
             \x20   app.kubernetes.io/part-of: nodegate\n\
             roleRef:\n\
             \x20 apiGroup: rbac.authorization.k8s.io\n\
             \x20 kind: Role\n\
             \x20 name: nodegate-agent-probe-pod\n\
             subjects:\n\
             \x20 - kind: ServiceAccount\n\
             \x20   name: nodegate-agent\n\
             \x20   namespace: nodegate\n"
        );
    }
    out
}

/// Services of replicas 2 to `replicas - 1`, each its backup line's, as the
/// base's `nodegate-webhook-0` and `-1` (manifests/base/webhook/service.yaml).
fn replica_services(replicas: u32) -> String {
    let mut out = format!(
        "# Generated by `{}` (kustomization.yaml); do not edit.\n",
        command(Some(replicas))
    );
    for i in webhook_config::DEFAULT_REPLICAS..replicas {
        if i > webhook_config::DEFAULT_REPLICAS {
            out.push_str("---\n");
        }
        let _ = write!(
            out,
            "# Replica {i} alone: its backup line (webhook-config.yaml).\n\
             apiVersion: v1\n\
             kind: Service\n\
             metadata:\n\
             \x20 name: {svc}-{i}\n\
             \x20 namespace: nodegate\n\
             \x20 labels:\n\
             \x20   app.kubernetes.io/name: nodegate-webhook\n\
             \x20   app.kubernetes.io/part-of: nodegate\n\
             spec:\n\
             \x20 selector:\n\
             \x20   app.kubernetes.io/name: nodegate-webhook\n\
             \x20   statefulset.kubernetes.io/pod-name: {svc}-{i}\n\
             \x20 ports:\n\
             \x20   - name: https\n\
             \x20     port: 443\n\
             \x20     targetPort: https\n\
             \x20     protocol: TCP\n",
            svc = webhook_config::SERVICE,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component_dir(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../manifests/components/gates")
            .join(name)
    }

    /// Each shipped example is exactly what the command writes from its own
    /// gates.yaml: every file, and no other file in the directory.
    #[test]
    fn shipped_gates_components_are_the_generator_output() {
        for name in ["cilium-ebs-csi", "cilium-gpu"] {
            let dir = component_dir(name);
            let declaration = std::fs::read_to_string(dir.join(GATES_FILE)).unwrap();
            let files = render(&declaration, webhook_config::DEFAULT_REPLICAS).unwrap();
            let mut want: Vec<&str> = files.iter().map(|f| f.name).collect();
            want.sort_unstable();
            let mut shipped: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            shipped.sort();
            assert_eq!(shipped, want, "{name}: files");
            for f in files {
                let path = dir.join(f.name);
                let on_disk = std::fs::read_to_string(&path).unwrap();
                assert!(
                    on_disk == f.text,
                    "{} differs from the generator; regenerate it:\n\
                     cargo build -p nodegate-webhook && ./target/debug/nodegate-webhook gates-component \
                     --gates manifests/components/gates/{name}/gates.yaml --out manifests/components/gates/{name}",
                    path.display()
                );
            }
        }
    }

    fn declaration() -> String {
        format!(
            "gates:\n\
             \x20 - {{name: cni, taint: '{DEFAULT_TAINT}', probes: {{http: [http://127.0.0.1:9879/healthz], pod: [kube-system/k8s-app=cilium]}}}}\n\
             \x20 - {{name: gpu, taint: 'example.com/gpu=x:NoSchedule', probes: {{pod: ['gpu-operator/app=dp', 'kube-system/k8s-app=other']}}}}\n\
             \x20 - {{name: ebs, taint: 'ebs.csi.aws.com/agent-not-ready:NoExecute', owner: {{daemonSet: kube-system/ebs-csi-node}}}}\n\
             bootTaints: ['nodegate.dev/agent-not-ready=true:NoExecute']\n"
        )
    }

    fn file<'a>(files: &'a [File], name: &str) -> &'a str {
        &files.iter().find(|f| f.name == name).unwrap().text
    }

    /// The webhook gets every taint in place of the base's and tolerates
    /// each new key; the agent gets the declaration in place of its taint
    /// and Cilium's probes; the generated files are the other commands'
    /// output for those flags.
    #[test]
    fn the_flags_go_where_the_base_had_its_gate() {
        let files = render(&declaration(), 2).unwrap();
        let k: serde_json::Value =
            serde_yaml::from_str(file(&files, "kustomization.yaml")).unwrap();
        let patches = k["patches"].as_array().unwrap();
        let ops = |i: usize| -> Vec<serde_json::Value> {
            serde_yaml::from_str(patches[i]["patch"].as_str().unwrap()).unwrap()
        };
        let webhook = ops(0);
        let values: Vec<&str> = webhook.iter().filter_map(|o| o["value"].as_str()).collect();
        assert_eq!(
            values,
            [
                format!("--taint={DEFAULT_TAINT}").as_str(),
                &format!("--taint={DEFAULT_TAINT}"),
                "--taint=example.com/gpu=x:NoSchedule",
                "--owned-taint=ebs.csi.aws.com/agent-not-ready:NoExecute",
                "--boot-taint=nodegate.dev/agent-not-ready=true:NoExecute",
            ]
        );
        let tolerated: Vec<&str> = webhook
            .iter()
            .filter(|o| o["path"] == "/spec/template/spec/tolerations/-")
            .map(|o| o["value"]["key"].as_str().unwrap())
            .collect();
        assert_eq!(
            tolerated,
            ["example.com/gpu", "ebs.csi.aws.com/agent-not-ready"]
        );
        let agent = ops(1);
        let gates_flag = agent[1]["value"].as_str().unwrap();
        let parsed = Gates::parse(gates_flag.strip_prefix("--gates=").unwrap()).unwrap();
        assert_eq!(parsed, Gates::parse(&declaration()).unwrap());
        let removed: Vec<&str> = agent
            .iter()
            .filter(|o| o["op"] == "test")
            .skip(1)
            .map(|o| o["value"].as_str().unwrap())
            .collect();
        assert_eq!(removed, BASE_PROBES);
        let ordinary: Vec<TaintSpec> = vec![
            DEFAULT_TAINT.parse().unwrap(),
            "example.com/gpu=x:NoSchedule".parse().unwrap(),
        ];
        let owned: Vec<TaintSpec> =
            vec!["ebs.csi.aws.com/agent-not-ready:NoExecute".parse().unwrap()];
        let boot: Vec<TaintSpec> = vec![
            "nodegate.dev/agent-not-ready=true:NoExecute"
                .parse()
                .unwrap(),
        ];
        assert_eq!(
            file(&files, "confinement.yaml"),
            confinement::render_owned(&ordinary, &boot, &owned, &[])
        );
        assert_eq!(
            file(&files, "webhook-config.yaml"),
            webhook_config::render_owned(&ordinary, &boot, &owned, 2)
        );
        let policy = policy::render_owned(&ordinary, &boot, &owned, policy::ApiVersion::V1);
        assert_eq!(
            file(&files, "admission-policy.yaml"),
            format!("{}\n", policy.split("\n---\n").next().unwrap())
        );
        // One Role and RoleBinding per probed namespace, each once.
        let rbac: Vec<serde_json::Value> = documents(file(&files, PROBE_POD_RBAC_FILE));
        let where_: Vec<(&str, &str)> = rbac
            .iter()
            .map(|d| {
                (
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["namespace"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            where_,
            [
                ("Role", "kube-system"),
                ("RoleBinding", "kube-system"),
                ("Role", "gpu-operator"),
                ("RoleBinding", "gpu-operator")
            ]
        );
        assert_eq!(k["resources"][0], PROBE_POD_RBAC_FILE);
    }

    fn documents(text: &str) -> Vec<serde_json::Value> {
        text.split("\n---\n")
            .map(|d| serde_yaml::from_str(d).unwrap())
            .collect()
    }

    /// Run on its own copy of the declaration, the command writes the same
    /// files again: the copy's header is not doubled.
    #[test]
    fn regenerating_from_the_copy_changes_nothing() {
        let first = render(&declaration(), 2).unwrap();
        let again = render(file(&first, GATES_FILE), 2).unwrap();
        assert_eq!(first, again);
    }

    /// Replicas other than the base's two: the StatefulSet's count and a
    /// Service for each replica past the base's, with one line each.
    #[test]
    fn another_replica_count_is_patched_with_its_services() {
        let files = render(&declaration(), 3).unwrap();
        let k = file(&files, "kustomization.yaml");
        assert!(k.contains("--replicas 3"), "{k}");
        assert!(k.contains("path: /spec/replicas\n        value: 3"), "{k}");
        let svc: serde_json::Value =
            serde_yaml::from_str(file(&files, REPLICA_SERVICES_FILE)).unwrap();
        assert_eq!(svc["metadata"]["name"], "nodegate-webhook-2");
        assert_eq!(
            svc["spec"]["selector"]["statefulset.kubernetes.io/pod-name"],
            "nodegate-webhook-2"
        );
        let lines: serde_json::Value =
            serde_yaml::from_str(file(&files, "webhook-config.yaml")).unwrap();
        assert_eq!(lines["webhooks"].as_array().unwrap().len(), 4);
        assert!(
            !file(&render(&declaration(), 1).unwrap(), "kustomization.yaml")
                .contains(REPLICA_SERVICES_FILE)
        );
    }

    #[test]
    fn a_declaration_nodegate_cannot_carry_out_is_refused() {
        let cases = [
            (
                // An owned gate on a key nodegate ships: its agents release it.
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {tcp: ['h:1']}}, \
                 {name: b, taint: 'readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule', owner: {daemonSet: ns/d}}]",
                "a gate nodegate ships",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {pod: ['no-namespace']}}]",
                "NAMESPACE/LABEL_SELECTOR",
            ),
            ("gates: []", "no gate nodegate opens"),
        ];
        for (text, want) in cases {
            let err = render(text, 2).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
