//! The two reads [`crate::removal::decide`] judges a SIGTERM by: the
//! agent's DaemonSet in its namespace and that Namespace, side by side,
//! each within a short deadline so the shutdown's write keeps most of
//! `--shutdown-deadline`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, Client, Resource};
use tokio::time::Instant;

use crate::removal::{Decision, Lookup, decide};

/// The longest the reads may take; at most half the shutdown deadline.
pub const CHECK_WITHIN: Duration = Duration::from_secs(2);

/// Where the agent's own DaemonSet is.
#[derive(Clone)]
pub struct RemovalCheck {
    pub client: Client,
    pub namespace: String,
    pub daemonset: String,
    /// The reads' time limit.
    pub within: Duration,
}

impl RemovalCheck {
    /// `within` is [`CHECK_WITHIN`], capped at half of `shutdown_deadline`.
    pub fn new(
        client: Client,
        namespace: String,
        daemonset: String,
        shutdown_deadline: Duration,
    ) -> Self {
        Self {
            client,
            namespace,
            daemonset,
            within: CHECK_WITHIN.min(shutdown_deadline / 2),
        }
    }

    /// Reads both and decides; never fails (an error is a [`Lookup`]).
    pub async fn run(&self) -> Decision {
        let deadline = Instant::now() + self.within;
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client.clone(), &self.namespace);
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let (ds, ns) = futures::future::join(
            tokio::time::timeout_at(deadline, daemonsets.get(&self.daemonset)),
            tokio::time::timeout_at(deadline, namespaces.get(&self.namespace)),
        )
        .await;
        let (ds, ns) = (lookup(ds), lookup(ns));
        tracing::debug!(daemonset = %self.daemonset, namespace = %self.namespace, ?ds, ?ns, "removal check");
        decide(ds, ns)
    }
}

/// One read's outcome; a timeout is [`Lookup::Failed`].
fn lookup<K: Resource<DynamicType = ()>>(
    r: Result<Result<K, kube::Error>, tokio::time::error::Elapsed>,
) -> Lookup {
    match r {
        Ok(Ok(obj)) => of_meta(obj.meta()),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Lookup::NotFound,
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => Lookup::Forbidden,
        Ok(Err(_)) | Err(_) => Lookup::Failed,
    }
}

fn of_meta(meta: &ObjectMeta) -> Lookup {
    if meta.deletion_timestamp.is_some() {
        Lookup::Deleting
    } else {
        Lookup::Live
    }
}
