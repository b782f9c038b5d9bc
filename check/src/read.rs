//! What a read step hands its verdict: the object, its absence, or why it
//! could not be read. The verdict decides what each case means (a missing
//! Service fails, an unreadable one is skipped).

use std::fmt::Display;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

/// One object as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read<T> {
    Found(T),
    Missing,
    /// The read's error, as text.
    Unreadable(String),
}

impl<T> Read<T> {
    /// A `get_opt`'s result.
    pub fn of<E: Display>(got: Result<Option<T>, E>) -> Read<T> {
        match got {
            Ok(Some(t)) => Read::Found(t),
            Ok(None) => Read::Missing,
            Err(e) => Read::Unreadable(e.to_string()),
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Read<U> {
        match self {
            Read::Found(t) => Read::Found(f(t)),
            Read::Missing => Read::Missing,
            Read::Unreadable(e) => Read::Unreadable(e),
        }
    }
}

/// Every object of a cluster-scoped custom resource `r`, each spec parsed
/// by `parse` (or its name and why not); the list's own error as is.
pub async fn list_specs<T>(
    client: &Client,
    r: &ApiResource,
    parse: impl Fn(&str, &serde_json::Value) -> Result<T, String>,
) -> Result<Vec<Result<T, (String, String)>>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), r);
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|o| {
            let name = o.metadata.name.clone().unwrap_or_default();
            let spec = o
                .data
                .get("spec")
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            parse(&name, &spec).map_err(|e| (name, e))
        })
        .collect())
}

/// The API server does not serve the resource (no CRD).
pub fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_opt_reads_as_one_of_three() {
        assert_eq!(Read::of(Ok::<_, String>(Some(1))), Read::Found(1));
        assert_eq!(Read::of(Ok::<Option<i32>, String>(None)), Read::Missing);
        assert_eq!(
            Read::of(Err::<Option<i32>, _>("403")).map(|n| n + 1),
            Read::Unreadable("403".into())
        );
    }
}
