//! `webhook lines`: the shape of the configuration's lines against the
//! webhook's workload and its taints. [`read`] gets each backup line's
//! Service; [`verdict`] judges every line's policies and order, each backup
//! line's conditions, Service and the replica it selects, and whether every
//! replica has a line of its own.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::Api;
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::NODE_USER_PREFIX;
use nodegate_shared::match_conditions::Verdict;
use serde_json::Value;

use super::{Backups, Line, ServiceRef, lines, registering_node};
use crate::container_flags::Flags;
use crate::matching::{conditions, covers, evaluate_as};
use crate::read::Read;
use crate::report::{Report, Status};
use crate::webhook_config::Hook;
use crate::workloads::{Kind, WebhookWorkload};

pub const CHECK: &str = "webhook lines";
/// The label the StatefulSet controller puts on each of its Pods.
const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// A Service by namespace and name.
type ServiceKey = (String, String);

fn key(svc: &ServiceRef) -> ServiceKey {
    (svc.namespace.clone(), svc.name.clone())
}

/// What the verdict judges.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub hook: &'a Hook,
    /// The webhook's workload; `None`: missing or unreadable (another line
    /// says which).
    pub workload: Option<&'a WebhookWorkload>,
    /// The taints the lines must add; `None`: nodegate-check's own flags
    /// are invalid.
    pub want: Option<&'a Flags>,
    /// Each backup line's Service as read (not the first line's).
    pub services: BTreeMap<ServiceKey, Read<Service>>,
}

/// Which replica a backup line's Service selects: `Ok(Some(i))`,
/// `Ok(None)` when the workload is unknown, `Err(what is wrong)`.
fn selection(
    selector: &BTreeMap<String, String>,
    svc: &ServiceRef,
    w: Option<&WebhookWorkload>,
) -> Result<Option<i32>, String> {
    let Some(pod) = selector.get(POD_NAME_LABEL) else {
        return Err(format!(
            "selects every replica (no {POD_NAME_LABEL} in its selector): a dead replica still takes its share of the line's calls"
        ));
    };
    let Some(w) = w else {
        return Ok(None);
    };
    if w.kind != Kind::StatefulSet {
        return Err(format!(
            "selects Pod {pod}, but the webhook runs as {}, whose Pods carry no {POD_NAME_LABEL}: it selects nothing",
            w.describe()
        ));
    }
    if svc.namespace != w.namespace {
        return Err(format!(
            "is not in the namespace of {}: it selects none of its Pods",
            w.describe()
        ));
    }
    let foreign: Vec<String> = selector
        .iter()
        .filter(|(k, v)| k.as_str() != POD_NAME_LABEL && w.template_labels.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !foreign.is_empty() {
        return Err(format!(
            "selects {foreign:?}, which the Pods of {} do not carry: it selects none of them",
            w.describe()
        ));
    }
    pod.strip_prefix(&format!("{}-", w.name))
        .and_then(|i| i.parse::<i32>().ok().filter(|n| n.to_string() == i))
        .filter(|i| (0..w.replicas).contains(i))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "selects Pod {pod}, not one of the {} replicas of {} ({})",
                w.replicas,
                w.describe(),
                (0..w.replicas)
                    .map(|i| w.pod(i))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// What is wrong with a backup line's conditions (`problems`), or costly
/// (`risks`): it must be called on a Node CREATE that lacks the taints and,
/// when `want` is known, skipped on one that carries them. Evaluated with
/// `request` bound as for a real (not dry-run) create, where an absent
/// `dryRun` is an error too.
fn backup_conditions(
    entry: &MutatingWebhook,
    want: Option<&Flags>,
    problems: &mut Vec<String>,
    risks: &mut Vec<String>,
) {
    let name = &entry.name;
    if !covers(entry.rules.as_deref().unwrap_or_default(), "CREATE", "") {
        problems.push(format!(
            "no rule sends a Node CREATE to {name}: it backs up no registration"
        ));
        return;
    }
    let conditions = conditions(entry);
    let node = "nodegate-check-node";
    let user = format!("{NODE_USER_PREFIX}{node}");
    let bare = registering_node(node);
    let silent = |errs: Vec<String>, on: &str| {
        format!(
            "{} of {name} on {on}: with failurePolicy Ignore the API server skips that line silently, so it never backs up the first one — guard optional request fields with has()",
            errs.join("; ")
        )
    };
    match evaluate_as(&conditions, "CREATE", "", &user, &bare, &Value::Null) {
        Verdict::Call => {}
        Verdict::Excluded(c) => problems.push(format!(
            "condition {c} of {name} is false on a Node CREATE that lacks the taints: the line never backs up the first one"
        )),
        Verdict::Errors(errs) => problems.push(silent(errs, "a Node CREATE")),
    }
    let Some(want) = want else {
        return;
    };
    let mut tainted = bare;
    let all: Vec<&TaintSpec> = want.taints.iter().chain(&want.boot).collect();
    if let Some(list) = tainted["spec"]["taints"].as_array_mut() {
        list.extend(all.iter().map(|t| t.to_json()));
    }
    match evaluate_as(&conditions, "CREATE", "", &user, &tainted, &Value::Null) {
        Verdict::Excluded(_) => {}
        Verdict::Call => risks.push(format!(
            "{name} is called even on a Node CREATE that carries every taint ({}): each Node write then costs one more call, and a dead replica a timeout; its conditions must list the webhook's --taint and --boot-taint flags (regenerate with `nodegate-webhook webhook-config`)",
            all.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        )),
        Verdict::Errors(errs) => problems.push(silent(errs, "a tainted Node CREATE")),
    }
}

/// What the lines add up to: problems fail the check, risks warn, notes
/// say what could not be verified.
#[derive(Debug, Default)]
struct Tally {
    problems: Vec<String>,
    risks: Vec<String>,
    notes: Vec<String>,
    /// Replica index → the backup lines that select it.
    covered: BTreeMap<i32, Vec<String>>,
    /// `line → Service (Pod)` of each backup line, for the passing line.
    shown: Vec<String>,
    placed: Backups,
}

impl Tally {
    /// failurePolicy Ignore and reinvocationPolicy Never on every line, and
    /// no line before the first one.
    fn policies(&mut self, all: &[Line], first: usize, first_name: &str) {
        for l in all {
            if l.failure_policy != "Ignore" {
                self.problems.push(format!(
                    "{} has failurePolicy {}: while its replica is down the API server refuses the Node write instead of trying the next line (and a kubelet retries its create forever); set Ignore",
                    l.name, l.failure_policy
                ));
            }
            if l.reinvocation_policy != "Never" {
                self.problems.push(format!(
                    "{} has reinvocationPolicy {}: a line that failed open is called again after a later line's patch, so a dead replica costs a second timeout; set Never",
                    l.name, l.reinvocation_policy
                ));
            }
        }
        for l in &all[..first] {
            self.problems.push(format!(
                "{} comes before the first line {first_name}: it is called ahead of it on every Node write",
                l.name
            ));
        }
    }

    /// One backup line's Service: its own, there, with the port, selecting
    /// one replica. `claimed`: the Services of the lines judged before it.
    fn service(&mut self, l: &Line, inputs: &Inputs, claimed: &mut Vec<(ServiceRef, String)>) {
        let Some(svc) = &l.service else {
            self.problems.push(format!(
                "{} calls a url, not a replica's own Service",
                l.name
            ));
            return;
        };
        let at = format!("{}/{}", svc.namespace, svc.name);
        if let Some((_, other)) = claimed
            .iter()
            .find(|(s, _)| s.namespace == svc.namespace && s.name == svc.name)
        {
            self.problems.push(format!(
                "{} and {other} both call Service {at}: a backup line needs a replica's own Service",
                l.name
            ));
            return;
        }
        claimed.push((svc.clone(), l.name.clone()));
        let object = match inputs.services.get(&key(svc)) {
            Some(Read::Found(o)) => o,
            Some(Read::Missing) => {
                self.problems.push(format!(
                    "Service {at} of {} not found: that line always fails open",
                    l.name
                ));
                return;
            }
            Some(Read::Unreadable(e)) => {
                self.notes
                    .push(format!("cannot read Service {at} of {}: {e}", l.name));
                return;
            }
            // `read` reads every backup line's own Service: only Inputs
            // built otherwise lack one.
            None => {
                self.notes
                    .push(format!("Service {at} of {} was not read", l.name));
                return;
            }
        };
        let spec = object.spec.clone().unwrap_or_default();
        let ports: Vec<i32> = spec.ports.iter().flatten().map(|p| p.port).collect();
        if !ports.contains(&svc.port) {
            self.problems.push(format!(
                "Service {at} of {} has ports {ports:?}, the line calls {}",
                l.name, svc.port
            ));
        }
        match selection(&spec.selector.unwrap_or_default(), svc, inputs.workload) {
            Ok(Some(i)) => {
                self.covered.entry(i).or_default().push(l.name.clone());
                if let Some(w) = inputs.workload {
                    self.shown
                        .push(format!("{} → {at} (Pod {})", l.name, w.pod(i)));
                }
            }
            Ok(None) => self.shown.push(format!("{} → {at}", l.name)),
            Err(why) => self
                .problems
                .push(format!("Service {at} of {} {why}", l.name)),
        }
        self.placed.services.push((l.name.clone(), object.clone()));
    }

    /// Every replica with a backup line of its own (a StatefulSet), or the
    /// risk of one line only.
    fn coverage(&mut self, workload: Option<&WebhookWorkload>, no_backups: bool) {
        match workload {
            Some(w) if w.kind == Kind::StatefulSet => {
                let missing: Vec<String> = (0..w.replicas)
                    .filter(|i| !self.covered.contains_key(i))
                    .map(|i| w.pod(i))
                    .collect();
                if !missing.is_empty() {
                    self.problems.push(format!(
                        "no backup line for replica {} of {}: a call the first line routes to a crashed replica's node then stores the Node ungated (docs/webhook.md#lines-of-admission-what-a-dead-replica-costs); regenerate the configuration with `nodegate-webhook webhook-config --replicas {}`",
                        missing.join(", "),
                        w.describe(),
                        w.replicas
                    ));
                }
                for (i, names) in self.covered.iter().filter(|(_, n)| n.len() > 1) {
                    self.problems.push(format!(
                        "{} all call replica {}: that replica down fails all of them open",
                        names.join(" and "),
                        w.pod(*i)
                    ));
                }
            }
            Some(w) if no_backups => self.risks.push(format!(
                "{} (an install from before the per-replica lines): one line of admission, so a call the API server routes to a crashed replica's node stores the Node ungated; apply the current manifests for the StatefulSet and a backup line per replica (docs/webhook.md#lines-of-admission-what-a-dead-replica-costs)",
                w.describe()
            )),
            // A Deployment with backup lines: `selection` said what is wrong.
            Some(_) => {}
            None if no_backups => self.risks.push(
                "the configuration has the first line only: a call the API server routes to a crashed replica's node stores the Node ungated (docs/webhook.md#lines-of-admission-what-a-dead-replica-costs)"
                    .into(),
            ),
            None => self.notes.push(
                "the webhook's workload is missing or unreadable: the lines were not matched with its replicas"
                    .into(),
            ),
        }
    }
}

/// The index of the first line among `all` (`webhook_config` found it).
fn first_index(all: &[Line], hook: &Hook) -> usize {
    all.iter().position(|l| l.name == hook.name).unwrap_or(0)
}

/// The `webhook lines` line, and the backup lines' Services for
/// [`super::placement`].
pub fn verdict(inputs: &Inputs) -> (Status, String, Backups) {
    let hook = inputs.hook;
    let all = lines(hook);
    let first = first_index(&all, hook);
    let mut tally = Tally::default();
    tally.policies(&all, first, &hook.name);
    let mut claimed: Vec<(ServiceRef, String)> = all[first]
        .service
        .iter()
        .map(|s| (s.clone(), hook.name.clone()))
        .collect();
    let backups: Vec<(&Line, &MutatingWebhook)> = all
        .iter()
        .zip(&hook.entries)
        .enumerate()
        .filter(|(i, _)| *i != first)
        .map(|(_, p)| p)
        .collect();
    for (l, entry) in &backups {
        backup_conditions(entry, inputs.want, &mut tally.problems, &mut tally.risks);
        tally.service(l, inputs, &mut claimed);
    }
    tally.coverage(inputs.workload, backups.is_empty());

    let tail = if tally.notes.is_empty() {
        String::new()
    } else {
        format!(" (not verified: {})", tally.notes.join("; "))
    };
    let (status, detail) = if !tally.problems.is_empty() {
        (Status::Fail, format!("{}{tail}", tally.problems.join("; ")))
    } else if !tally.risks.is_empty() {
        (Status::Warn, format!("{}{tail}", tally.risks.join("; ")))
    } else {
        let first_svc = all[first]
            .service
            .as_ref()
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .unwrap_or_else(|| "a url".into());
        (
            Status::Pass,
            format!(
                "first line {} → {first_svc}, then {}; failurePolicy Ignore and reinvocationPolicy Never on every line; each backup is called on a Node CREATE that lacks the taints and skipped once it carries them{tail}",
                hook.name,
                tally.shown.join(", ")
            ),
        )
    };
    (status, detail, tally.placed)
}

/// Each backup line's Service, once (the first line's is not read: a
/// backup line calling it is wrong whatever it holds).
pub async fn read(client: &Client, hook: &Hook) -> BTreeMap<ServiceKey, Read<Service>> {
    let all = lines(hook);
    let first = first_index(&all, hook);
    let first_key = all[first].service.as_ref().map(key);
    let mut out = BTreeMap::new();
    for (i, l) in all.iter().enumerate() {
        let Some(svc) = &l.service else { continue };
        let k = key(svc);
        if i == first || Some(&k) == first_key.as_ref() || out.contains_key(&k) {
            continue;
        }
        let api: Api<Service> = Api::namespaced(client.clone(), &svc.namespace);
        out.insert(k, Read::of(api.get_opt(&svc.name).await));
    }
    out
}

/// Reads the backup lines' Services and reports [`verdict`].
pub async fn check(
    client: &Client,
    hook: &Hook,
    workload: Option<&WebhookWorkload>,
    want: Option<&Flags>,
    report: &mut Report,
) -> Backups {
    let inputs = Inputs {
        hook,
        workload,
        want,
        services: read(client, hook).await,
    };
    let (status, detail, placed) = verdict(&inputs);
    report.add(CHECK, status, detail);
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts(replicas: i32) -> WebhookWorkload {
        WebhookWorkload {
            kind: Kind::StatefulSet,
            namespace: "nodegate".into(),
            name: "nodegate-webhook".into(),
            replicas,
            available: replicas,
            available_condition: true,
            template_labels: BTreeMap::from([(
                "app.kubernetes.io/name".into(),
                "nodegate-webhook".into(),
            )]),
            containers: Vec::new(),
            leftover_deployment: false,
        }
    }

    fn svc(name: &str) -> ServiceRef {
        ServiceRef {
            namespace: "nodegate".into(),
            name: name.into(),
            port: 443,
            path: "/mutate".into(),
        }
    }

    fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_backup_service_selects_exactly_one_replica() {
        let w = sts(2);
        let app = ("app.kubernetes.io/name", "nodegate-webhook");
        let one = selector(&[app, (POD_NAME_LABEL, "nodegate-webhook-1")]);
        assert_eq!(selection(&one, &svc("x"), Some(&w)), Ok(Some(1)));
        assert_eq!(selection(&one, &svc("x"), None), Ok(None));
        let every = selection(&selector(&[app]), &svc("x"), Some(&w)).unwrap_err();
        assert!(every.contains("selects every replica"), "{every}");
        let beyond = selector(&[app, (POD_NAME_LABEL, "nodegate-webhook-2")]);
        let e = selection(&beyond, &svc("x"), Some(&w)).unwrap_err();
        assert!(
            e.contains("not one of the 2 replicas")
                && e.contains("nodegate-webhook-0, nodegate-webhook-1"),
            "{e}"
        );
        let padded = selector(&[app, (POD_NAME_LABEL, "nodegate-webhook-01")]);
        assert!(selection(&padded, &svc("x"), Some(&w)).is_err());
        let other_app = selector(&[("app", "x"), (POD_NAME_LABEL, "nodegate-webhook-0")]);
        let e = selection(&other_app, &svc("x"), Some(&w)).unwrap_err();
        assert!(e.contains("[\"app=x\"]"), "{e}");
        let mut deploy = sts(2);
        deploy.kind = Kind::Deployment;
        let e = selection(&one, &svc("x"), Some(&deploy)).unwrap_err();
        assert!(
            e.contains("runs as Deployment nodegate/nodegate-webhook"),
            "{e}"
        );
    }

    /// The generator's backup entries for `taints`.
    fn generated_backups(taints: &[&str]) -> Vec<MutatingWebhook> {
        let specs: Vec<TaintSpec> = taints.iter().map(|t| t.parse().unwrap()).collect();
        let yaml = nodegate_webhook::webhook_config::render(&specs, &[], 2);
        let cfg: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
            serde_yaml::from_str(&yaml).unwrap();
        cfg.webhooks.unwrap().into_iter().skip(1).collect()
    }

    #[test]
    fn backup_conditions_call_an_ungated_create_and_skip_a_gated_one() {
        use nodegate_shared::keys::DEFAULT_TAINT;
        let backups = generated_backups(&[DEFAULT_TAINT]);
        assert_eq!(backups.len(), 2);
        let want = Flags::of(&[DEFAULT_TAINT], &[]);
        let (mut problems, mut risks) = (Vec::new(), Vec::new());
        for b in &backups {
            backup_conditions(b, Some(&want), &mut problems, &mut risks);
        }
        assert_eq!(
            (problems.len(), risks.len()),
            (0, 0),
            "{problems:?} {risks:?}"
        );

        // Conditions that wait for a taint the webhook does not add: the
        // backup lines fire on every write.
        let more = generated_backups(&[DEFAULT_TAINT, "example.com/x:NoExecute"]);
        backup_conditions(&more[0], Some(&want), &mut problems, &mut risks);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(
            risks[0].contains("replica-0.nodes.nodegate.dev is called even on a Node CREATE that carries every taint"),
            "{risks:?}"
        );

        // The first line's old mistake, in a backup line: an unguarded read
        // of an absent request field errors on every create.
        let mut unguarded = backups[1].clone();
        unguarded.match_conditions.as_mut().unwrap()[0].expression =
            "request.subResource != 'status'".into();
        let mut problems = Vec::new();
        backup_conditions(&unguarded, Some(&want), &mut problems, &mut risks);
        assert!(
            problems[0].contains("of replica-1.nodes.nodegate.dev on a Node CREATE")
                && problems[0].contains("never backs up the first one"),
            "{problems:?}"
        );
        // No rule for Node CREATE.
        let mut updates_only = backups[1].clone();
        updates_only.rules.as_mut().unwrap()[0].operations = Some(vec!["UPDATE".into()]);
        let mut problems = Vec::new();
        backup_conditions(&updates_only, Some(&want), &mut problems, &mut risks);
        assert!(
            problems[0].starts_with("no rule sends a Node CREATE to replica-1"),
            "{problems:?}"
        );
    }

    /// The generator's configuration for nodegate's default taint and two
    /// replicas, as `webhook_config` hands it on, with its entries edited.
    fn hook(edit: impl FnOnce(&mut Vec<MutatingWebhook>)) -> Hook {
        use nodegate_shared::keys::DEFAULT_TAINT;
        let specs = [DEFAULT_TAINT.parse().unwrap()];
        let yaml = nodegate_webhook::webhook_config::render(&specs, &[], 2);
        let cfg: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
            serde_yaml::from_str(&yaml).unwrap();
        let mut entries = cfg.webhooks.unwrap();
        edit(&mut entries);
        Hook {
            name: "nodes.nodegate.dev".into(),
            entries,
            failure_policy: "Ignore".into(),
            service: None,
            ca_bundle: Vec::new(),
            create_condition_errors: Vec::new(),
        }
    }

    /// A per-replica Service as the install ships it, on `port`, selecting
    /// Pod `pod`.
    fn service(pod: &str, port: i32) -> Read<Service> {
        Read::Found(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": pod, "namespace": "nodegate"},
                "spec": {"ports": [{"port": port}], "selector": {
                    "app.kubernetes.io/name": "nodegate-webhook", POD_NAME_LABEL: pod}},
            }))
            .unwrap(),
        )
    }

    /// Both replicas' Services, with the one of replica `i` replaced.
    fn services(i: usize, read: Read<Service>) -> BTreeMap<ServiceKey, Read<Service>> {
        let mut all: BTreeMap<ServiceKey, Read<Service>> = (0..2)
            .map(|r| {
                let name = format!("nodegate-webhook-{r}");
                (("nodegate".into(), name.clone()), service(&name, 443))
            })
            .collect();
        all.insert(("nodegate".into(), format!("nodegate-webhook-{i}")), read);
        all
    }

    fn judged(
        hook: &Hook,
        workload: Option<&WebhookWorkload>,
        services: BTreeMap<ServiceKey, Read<Service>>,
    ) -> (Status, String, Backups) {
        use nodegate_shared::keys::DEFAULT_TAINT;
        let want = Flags::of(&[DEFAULT_TAINT], &[]);
        verdict(&Inputs {
            hook,
            workload,
            want: Some(&want),
            services,
        })
    }

    /// (case, configuration, workload, Services read, status, detail part)
    type Row<'a> = (
        &'a str,
        Hook,
        Option<&'a WebhookWorkload>,
        BTreeMap<ServiceKey, Read<Service>>,
        Status,
        &'a str,
    );

    /// Each row's verdict has its status and the part of its detail.
    fn assert_rows(rows: Vec<Row>) {
        for (name, hook, workload, services, status, part) in rows {
            let (got, detail, _) = judged(&hook, workload, services);
            assert_eq!(got, status, "{name}: {detail}");
            assert!(detail.contains(part), "{name}: {detail:?} lacks {part:?}");
        }
    }

    /// The install as shipped, and each way one line goes wrong: its
    /// policies, its place, its Service.
    #[test]
    fn verdicts_on_each_line() {
        let shipped = || services(0, service("nodegate-webhook-0", 443));
        let two = sts(2);
        assert_rows(vec![
            (
                "as shipped",
                hook(|_| {}),
                Some(&two),
                shipped(),
                Status::Pass,
                "first line nodes.nodegate.dev → nodegate/nodegate-webhook, then replica-0.nodes.nodegate.dev → nodegate/nodegate-webhook-0 (Pod nodegate-webhook-0), replica-1.nodes.nodegate.dev → nodegate/nodegate-webhook-1 (Pod nodegate-webhook-1); failurePolicy Ignore and reinvocationPolicy Never on every line; each backup is called on a Node CREATE that lacks the taints and skipped once it carries them",
            ),
            (
                "failurePolicy Fail",
                hook(|e| e[1].failure_policy = Some("Fail".into())),
                Some(&two),
                shipped(),
                Status::Fail,
                "replica-0.nodes.nodegate.dev has failurePolicy Fail: while its replica is down the API server refuses the Node write",
            ),
            (
                "reinvoked",
                hook(|e| e[2].reinvocation_policy = Some("IfNeeded".into())),
                Some(&two),
                shipped(),
                Status::Fail,
                "replica-1.nodes.nodegate.dev has reinvocationPolicy IfNeeded",
            ),
            (
                "a backup first",
                hook(|e| e.swap(0, 1)),
                Some(&two),
                shipped(),
                Status::Fail,
                "replica-0.nodes.nodegate.dev comes before the first line nodes.nodegate.dev",
            ),
            (
                "by url",
                hook(|e| {
                    e[2].client_config.service = None;
                    e[2].client_config.url = Some("https://x".into());
                }),
                Some(&two),
                shipped(),
                Status::Fail,
                "replica-1.nodes.nodegate.dev calls a url, not a replica's own Service",
            ),
            (
                "the first line's Service",
                hook(|e| e[2].client_config.service = e[0].client_config.service.clone()),
                Some(&two),
                shipped(),
                Status::Fail,
                "replica-1.nodes.nodegate.dev and nodes.nodegate.dev both call Service nodegate/nodegate-webhook",
            ),
            (
                "Service missing",
                hook(|_| {}),
                Some(&two),
                services(1, Read::Missing),
                Status::Fail,
                "Service nodegate/nodegate-webhook-1 of replica-1.nodes.nodegate.dev not found: that line always fails open",
            ),
            (
                "Service unreadable",
                hook(|_| {}),
                Some(&two),
                services(1, Read::Unreadable("403".into())),
                Status::Fail,
                "no backup line for replica nodegate-webhook-1 of StatefulSet nodegate/nodegate-webhook: a call the first line routes to a crashed replica's node then stores the Node ungated (docs/webhook.md#lines-of-admission-what-a-dead-replica-costs); regenerate the configuration with `nodegate-webhook webhook-config --replicas 2` (not verified: cannot read Service nodegate/nodegate-webhook-1 of replica-1.nodes.nodegate.dev: 403)",
            ),
            (
                "wrong port",
                hook(|_| {}),
                Some(&two),
                services(1, service("nodegate-webhook-1", 9443)),
                Status::Fail,
                "Service nodegate/nodegate-webhook-1 of replica-1.nodes.nodegate.dev has ports [9443], the line calls 443",
            ),
        ]);
    }

    /// Whether every replica has a line of its own, by the workload.
    #[test]
    fn verdicts_on_the_replicas() {
        let shipped = || services(0, service("nodegate-webhook-0", 443));
        let (two, three) = (sts(2), sts(3));
        let mut deploy = sts(2);
        deploy.kind = Kind::Deployment;
        let first_only = hook(|e| e.truncate(1));
        assert_rows(vec![
            (
                "selects replica 0 twice",
                hook(|_| {}),
                Some(&two),
                services(1, service("nodegate-webhook-0", 443)),
                Status::Fail,
                "replica-0.nodes.nodegate.dev and replica-1.nodes.nodegate.dev all call replica nodegate-webhook-0: that replica down fails all of them open",
            ),
            (
                "a third replica without a line",
                hook(|_| {}),
                Some(&three),
                shipped(),
                Status::Fail,
                "no backup line for replica nodegate-webhook-2 of StatefulSet nodegate/nodegate-webhook",
            ),
            (
                "an install from before",
                first_only.clone(),
                Some(&deploy),
                BTreeMap::new(),
                Status::Warn,
                "Deployment nodegate/nodegate-webhook (an install from before the per-replica lines): one line of admission",
            ),
            (
                "no workload, first line only",
                first_only,
                None,
                BTreeMap::new(),
                Status::Warn,
                "the configuration has the first line only: a call the API server routes to a crashed replica's node stores the Node ungated",
            ),
            (
                "no workload",
                hook(|_| {}),
                None,
                shipped(),
                Status::Pass,
                "then replica-0.nodes.nodegate.dev → nodegate/nodegate-webhook-0, replica-1.nodes.nodegate.dev → nodegate/nodegate-webhook-1; failurePolicy Ignore and reinvocationPolicy Never on every line; each backup is called on a Node CREATE that lacks the taints and skipped once it carries them (not verified: the webhook's workload is missing or unreadable: the lines were not matched with its replicas)",
            ),
        ]);
    }

    /// The Services read are handed on for the placement check, in line
    /// order; a missing one is not.
    #[test]
    fn the_read_services_go_to_placement() {
        let two = sts(2);
        let (_, _, placed) = judged(
            &hook(|_| {}),
            Some(&two),
            services(1, service("nodegate-webhook-1", 443)),
        );
        let lines: Vec<&str> = placed.services.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            lines,
            [
                "replica-0.nodes.nodegate.dev",
                "replica-1.nodes.nodegate.dev"
            ]
        );
        let (_, _, placed) = judged(&hook(|_| {}), Some(&two), services(1, Read::Missing));
        assert_eq!(placed.services.len(), 1);
    }
}
