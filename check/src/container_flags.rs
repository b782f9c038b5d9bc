//! The taint flags a webhook or agent container runs with, read from its
//! Pod template the way the binary's clap reads them. Pure.

use k8s_openapi::api::core::v1::Container;
use nodegate_shared::TaintSpec;
use nodegate_shared::gates::Gates;
use nodegate_shared::keys::DEFAULT_TAINT;
use nodegate_shared::taint::{check_release, check_taints, check_unique};

/// The values of a repeatable, comma-delimited flag as clap reads them:
/// `flag=X` or `flag X` in the args (commas split values), else the `env`
/// variable's literal value when no arg gives one.
pub fn container_flag(c: &Container, flag: &str, env: &str) -> Vec<String> {
    values(c, flag, env, true)
}

/// The values of a repeatable flag clap takes whole (no `value_delimiter`:
/// an exec probe, a pod selector, the `--gates` JSON), else the `env`
/// variable's value as one.
pub fn container_values(c: &Container, flag: &str, env: &str) -> Vec<String> {
    values(c, flag, env, false)
}

fn values(c: &Container, flag: &str, env: &str, delimited: bool) -> Vec<String> {
    let args: Vec<&str> = c
        .args
        .iter()
        .flatten()
        .chain(c.command.iter().flatten())
        .map(String::as_str)
        .collect();
    let split = |v: &str| -> Vec<String> {
        let parts: Vec<&str> = if delimited {
            v.split(',').collect()
        } else {
            vec![v]
        };
        parts
            .into_iter()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.extend(split(v));
        } else if *a == flag
            && let Some(v) = it.next()
        {
            out.extend(split(v));
        }
    }
    if out.is_empty()
        && let Some(v) = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == env)
            .and_then(|e| e.value.clone())
    {
        out.extend(split(&v));
    }
    out
}

/// The agent's gates declaration flag and its environment variable.
pub const GATES_FLAG: &str = "--gates";
pub const GATES_ENV: &str = "NODEGATE_GATES";

/// The agent's `--gates` declaration (the last value, as clap keeps it),
/// `None` without one; `Err` says why the agent would refuse it.
pub fn declared_gates(c: &Container) -> Option<Result<Gates, String>> {
    let text = container_values(c, GATES_FLAG, GATES_ENV).pop()?;
    Some(Gates::parse(&text).map_err(|e| format!("{GATES_FLAG}: {e}")))
}

/// The taint flags one container runs with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `--taint` (default: nodegate's default taint).
    pub taints: Vec<TaintSpec>,
    /// `--boot-taint`: strict mode's boot gate, empty when off.
    pub boot: Vec<TaintSpec>,
    /// `--release-taint` (the agent's): removed when matched exactly, never
    /// added; empty for the webhook.
    pub release: Vec<TaintSpec>,
    /// The webhook's `--owned-taint`, or the owned gates of the agent's
    /// `--gates`: added by nodegate, removed by another component.
    pub owned: Vec<TaintSpec>,
}

/// The flags of a webhook or agent container as its clap reads them (args
/// win over `NODEGATE_TAINTS` / `NODEGATE_BOOT_TAINTS`); an agent's
/// `--gates` declaration stands for its `--taint` and `--boot-taint`.
/// `Err` says why the binary would refuse to start with them.
pub fn flags(c: &Container) -> Result<Flags, String> {
    let parse = |flag: &str, env: &str| -> Result<Vec<TaintSpec>, String> {
        container_flag(c, flag, env)
            .iter()
            .map(|s| s.parse().map_err(|e| format!("{flag}={s}: {e}")))
            .collect()
    };
    let (taints, boot, owned) = match declared_gates(c) {
        Some(gates) => {
            let g = gates?;
            (g.taints(), g.boot_taints(), g.owned_taints())
        }
        None => {
            let mut taints = parse("--taint", "NODEGATE_TAINTS")?;
            if taints.is_empty() {
                taints.extend(DEFAULT_TAINT.parse::<TaintSpec>().ok());
            }
            let boot = parse("--boot-taint", "NODEGATE_BOOT_TAINTS")?;
            let owned = parse("--owned-taint", "NODEGATE_OWNED_TAINTS")?;
            (taints, boot, owned)
        }
    };
    check_taints(&taints, &boot).map_err(|e| e.to_string())?;
    let all: Vec<TaintSpec> = taints.iter().chain(&owned).chain(&boot).cloned().collect();
    check_unique(&all).map_err(|e| e.to_string())?;
    let release = parse("--release-taint", "NODEGATE_RELEASE_TAINTS")?;
    let managed: Vec<TaintSpec> = taints.iter().chain(&boot).cloned().collect();
    check_release(&managed, &release).map_err(|e| e.to_string())?;
    Ok(Flags {
        taints,
        boot,
        release,
        owned,
    })
}

/// Strict mode's boot gate as the strict-mode component sets it: nodegate's
/// default taint with effect NoExecute (tests).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn default_gate() -> String {
    let t: TaintSpec = DEFAULT_TAINT.parse().unwrap();
    TaintSpec::new(
        t.key(),
        t.value(),
        nodegate_shared::taint::Effect::NoExecute,
    )
    .unwrap()
    .to_string()
}

#[cfg(test)]
impl Flags {
    /// Flags from taint specs (tests): `--taint`s, then `--boot-taint`s.
    #[allow(clippy::unwrap_used)]
    pub(crate) fn of(taints: &[&str], boot: &[&str]) -> Flags {
        let parse = |l: &[&str]| l.iter().map(|s| s.parse().unwrap()).collect();
        Flags {
            taints: parse(taints),
            boot: parse(boot),
            release: Vec::new(),
            owned: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn f(taints: &[&str], boot: &[&str]) -> Flags {
        Flags::of(taints, boot)
    }

    fn container(args: &[&str], env: &[(&str, &str)]) -> Container {
        let env: Vec<Value> = env
            .iter()
            .map(|(n, v)| json!({"name": n, "value": v}))
            .collect();
        serde_json::from_value(json!({"name": "c", "args": args, "env": env})).unwrap()
    }

    #[test]
    fn flags_are_read_as_the_binaries_read_them() {
        let gate = default_gate();
        let gate = gate.as_str();
        let none = flags(&container(&["--listen=0.0.0.0:9443"], &[])).unwrap();
        assert_eq!(none, f(&[DEFAULT_TAINT], &[]));
        let on = flags(&container(
            &[&format!("--taint={DEFAULT_TAINT}"), "--boot-taint", gate],
            &[],
        ))
        .unwrap();
        assert_eq!(on, f(&[DEFAULT_TAINT], &[gate]));
        // The env var counts only without the arg.
        let env = flags(&container(&[], &[("NODEGATE_BOOT_TAINTS", gate)])).unwrap();
        assert_eq!(env, f(&[DEFAULT_TAINT], &[gate]));
        let both = flags(&container(
            &["--boot-taint=a.io/b:NoExecute"],
            &[("NODEGATE_BOOT_TAINTS", gate)],
        ))
        .unwrap();
        assert_eq!(both, f(&[DEFAULT_TAINT], &["a.io/b:NoExecute"]));
        // Flags the binaries refuse.
        let err = flags(&container(&[&format!("--boot-taint={DEFAULT_TAINT}")], &[])).unwrap_err();
        assert!(err.contains("must have effect NoExecute"), "{err}");
        let err = flags(&container(&["--boot-taint=nope"], &[])).unwrap_err();
        assert!(err.starts_with("--boot-taint=nope: "), "{err}");
    }

    /// The agent's `--release-taint`: read like the others, and refused (as
    /// the agent refuses it) when it names a managed taint's key and effect.
    #[test]
    fn release_taints_are_read_and_checked() {
        use nodegate_shared::keys::LEGACY_TAINT;
        let got = flags(&container(
            &[&format!("--release-taint={LEGACY_TAINT}")],
            &[],
        ))
        .unwrap();
        assert_eq!(got.release, vec![LEGACY_TAINT.parse().unwrap()]);
        assert_eq!(got.taints, f(&[DEFAULT_TAINT], &[]).taints);
        let env = flags(&container(
            &[],
            &[("NODEGATE_RELEASE_TAINTS", LEGACY_TAINT)],
        ))
        .unwrap();
        assert_eq!(env.release, got.release);
        let t: TaintSpec = DEFAULT_TAINT.parse().unwrap();
        let clash = format!("--release-taint={}=other:{}", t.key(), t.effect());
        let err = flags(&container(&[&clash], &[])).unwrap_err();
        assert!(
            err.contains("the agent would remove what the webhook adds"),
            "{err}"
        );
    }

    /// The agent's `--gates` stands for its taint flags; the webhook's
    /// owned gates are `--owned-taint`; one key and effect cannot be both.
    #[test]
    fn gates_and_owned_taints() {
        let ebs = "ebs.csi.aws.com/agent-not-ready:NoExecute";
        let gates = format!(
            "--gates={{gates: [{{name: cni, taint: '{DEFAULT_TAINT}', probes: {{tcp: ['h:1']}}}}, {{name: ebs, taint: '{ebs}', owner: {{daemonSet: kube-system/ebs}}}}]}}"
        );
        let agent = flags(&container(&[&gates, "--taint=x.dev/y:NoSchedule"], &[])).unwrap();
        assert_eq!(agent.taints, f(&[DEFAULT_TAINT], &[]).taints);
        assert_eq!(agent.owned, vec![ebs.parse().unwrap()]);
        let webhook = flags(&container(
            &[&format!("--owned-taint={ebs}")],
            &[("NODEGATE_TAINTS", DEFAULT_TAINT)],
        ))
        .unwrap();
        assert_eq!(webhook.taints, agent.taints);
        assert_eq!(webhook.owned, agent.owned);
        let err = flags(&container(
            &[&format!("--owned-taint={DEFAULT_TAINT}")],
            &[],
        ))
        .unwrap_err();
        assert!(err.contains("nodegate.dev/agent-not-ready"), "{err}");
        let err = flags(&container(&["--gates={gates: []}"], &[])).unwrap_err();
        assert!(err.starts_with("--gates: "), "{err}");
        // Taken whole: commas are the JSON's.
        let c = container(
            &[],
            &[("NODEGATE_GATES", "a,b"), ("NODEGATE_PROBE_EXEC", "x,y")],
        );
        assert_eq!(container_values(&c, "--gates", "NODEGATE_GATES"), ["a,b"]);
        assert_eq!(
            container_flag(&c, "--probe-exec", "NODEGATE_PROBE_EXEC"),
            ["x", "y"]
        );
    }

    /// Args win over the env var, commas split values as clap's
    /// value_delimiter does, and `--taint` is not `--taint-x`.
    #[test]
    fn flags_follow_clap() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "w",
            "args": ["--boot-taint=a.io/x:NoExecute,b.io/y:NoExecute", "--boot-taints=c.io/z:NoExecute"],
            "env": [{"name": "NODEGATE_BOOT_TAINTS", "value": "d.io/w:NoExecute"}]
        }))
        .unwrap();
        assert_eq!(
            container_flag(&c, "--boot-taint", "NODEGATE_BOOT_TAINTS"),
            vec!["a.io/x:NoExecute", "b.io/y:NoExecute"]
        );
        assert_eq!(
            container_flag(&c, "--taint", "NODEGATE_TAINTS"),
            Vec::<String>::new()
        );
    }
}
