//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection.LeaderElector` does it (`tryAcquireOrRenew`, `renew`,
//! `release`): a foreign holder's lease counts as valid until
//! `leaseDurationSeconds` after this process *saw* its record change (local
//! clock, no trust in the other's timestamps); the leader renews every retry
//! period and stops leading when it has not renewed within the renew
//! deadline, which is shorter than the lease duration, so an old leader has
//! stopped writing before a new one can take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{PostParams, Resource};
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// The last record seen and when it was seen (local clock), and the Lease as
/// this process last wrote it while holding it.
#[derive(Debug, Default)]
struct Observed {
    record: Option<LeaseSpec>,
    at: Option<Instant>,
    held: Option<Lease>,
}

impl Observed {
    fn saw(&mut self, lease: &Lease) {
        self.record = lease.spec.clone();
        self.at = Some(Instant::now());
    }
}

/// Runs the election until `shutdown` flips; `leader` carries whether this
/// process leads now. On shutdown a held lease is released, so a standby
/// takes over at once rather than after the lease duration.
pub async fn run(
    api: Api<Lease>,
    cfg: LeaseConfig,
    leader: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut observed = Observed::default();
    let mut last_renew: Option<Instant> = None;
    loop {
        let ok = match try_acquire_or_renew(&api, &cfg, &mut observed).await {
            Ok(ok) => ok,
            Err(e) => {
                tracing::warn!(error = %e, lease = %cfg.name, "lease request failed");
                false
            }
        };
        let now = Instant::now();
        if ok {
            last_renew = Some(now);
            if !*leader.borrow() {
                tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                leader.send_replace(true);
            }
        } else if *leader.borrow()
            && last_renew.is_none_or(|t| now.duration_since(t) >= cfg.renew_deadline)
        {
            tracing::warn!(identity = %cfg.identity, "lease not renewed within the renew deadline: stopped leading");
            leader.send_replace(false);
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.retry_period) => {}
            _ = nodegate_shared::signal::stopped(&mut shutdown) => break,
        }
    }
    if leader.send_replace(false) {
        release(&api, &cfg).await;
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// One attempt, as client-go's `tryAcquireOrRenew`: create the lease if it
/// is missing; leave a valid foreign lease alone; otherwise take or renew it
/// with an update that carries the resourceVersion read (a concurrent
/// writer makes it fail with a conflict instead of both winning).
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    let secs = i32::try_from(cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    // client-go's fast path: a leader whose lease is still valid renews the
    // object it last wrote, without reading it first (one request per retry
    // period instead of two); a conflict falls back to the read below.
    if let Some(mut held) = observed.held.take()
        && observed
            .at
            .is_some_and(|t| t + cfg.lease_duration > Instant::now())
    {
        if let Some(spec) = held.spec.as_mut() {
            spec.renew_time = Some(now_micro());
        }
        match api.replace(&cfg.name, &PostParams::default(), &held).await {
            Ok(l) => {
                observed.saw(&l);
                observed.held = Some(l);
                return Ok(true);
            }
            Err(e) => tracing::debug!(error = %e, "optimistic lease renewal failed: reading it"),
        }
    }
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(l) => {
                observed.saw(&l);
                observed.held = Some(l);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    if observed.record.as_ref() != Some(&spec) {
        observed.record = Some(spec.clone());
        observed.at = Some(Instant::now());
    }
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let me = holder == cfg.identity;
    let duration = Duration::from_secs(
        u64::try_from(spec.lease_duration_seconds.unwrap_or(secs)).unwrap_or(0),
    );
    let valid = observed.at.is_some_and(|t| t + duration > Instant::now());
    if !holder.is_empty() && valid && !me {
        return Ok(false);
    }
    let mut next = spec.clone();
    if !me {
        next.acquire_time = Some(now_micro());
        next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    next.holder_identity = Some(cfg.identity.clone());
    next.lease_duration_seconds = Some(secs);
    next.renew_time = Some(now_micro());
    lease.spec = Some(next);
    let name = lease.meta().name.clone().unwrap_or_default();
    match api.replace(&name, &PostParams::default(), &lease).await {
        Ok(l) => {
            observed.saw(&l);
            observed.held = Some(l);
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// client-go's `release`: clear the holder so a standby need not wait.
async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now_micro());
    spec.acquire_time = Some(now_micro());
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(lease = %cfg.name, "lease released"),
        Err(e) => tracing::warn!(error = %e, lease = %cfg.name, "could not release the lease"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use nodegate_emulator::{Emulator, EmulatorOptions, users};

    fn cfg(identity: &str) -> LeaseConfig {
        LeaseConfig {
            name: "roster".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The leader renews from the object it wrote; when another process
    /// took the lease meanwhile, that write conflicts and the read that
    /// follows leaves the other's valid lease alone.
    #[tokio::test]
    async fn a_leader_renews_without_reading_and_never_over_a_new_holder() {
        let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
        let api: Api<Lease> = Api::namespaced(emu.client(users::ADMIN).await.unwrap(), "default");
        let mut obs = Observed::default();
        assert!(
            try_acquire_or_renew(&api, &cfg("a"), &mut obs)
                .await
                .unwrap()
        );
        let rv = |o: &Observed| o.held.as_ref().unwrap().metadata.resource_version.clone();
        let first = rv(&obs);
        assert!(
            try_acquire_or_renew(&api, &cfg("a"), &mut obs)
                .await
                .unwrap()
        );
        assert_ne!(rv(&obs), first, "renewed");
        let stored = api.get("roster").await.unwrap();
        assert_eq!(
            stored.metadata.resource_version,
            obs.held.as_ref().unwrap().metadata.resource_version
        );

        // b takes over (a was partitioned past the lease, say).
        let mut taken = stored;
        let spec = taken.spec.as_mut().unwrap();
        spec.holder_identity = Some("b".into());
        spec.renew_time = Some(now_micro());
        api.replace("roster", &PostParams::default(), &taken)
            .await
            .unwrap();

        assert!(
            !try_acquire_or_renew(&api, &cfg("a"), &mut obs)
                .await
                .unwrap()
        );
        let now = api.get("roster").await.unwrap();
        assert_eq!(now.spec.unwrap().holder_identity.as_deref(), Some("b"));
        assert!(obs.held.is_none(), "no optimistic write without holding");
    }
}
