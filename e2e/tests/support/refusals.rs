//! The refusal a forbidden write must meet: a 403 naming who was refused,
//! where and why.

use k8s_openapi::api::core::v1::Node;

pub const AGENT_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-agent-confinement' with binding 'nodegate-agent-confinement'";
pub const WEBHOOK_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-webhook-confinement'";

/// A Node write refused with a 403 whose message holds every needle.
pub fn assert_refused(what: &str, r: Result<Node, Box<kube::core::Status>>, needles: &[&str]) {
    let e = match r {
        Ok(_) => panic!("{what}: was allowed"),
        Err(e) => e,
    };
    assert_eq!(e.code, 403, "{what}: {}", e.message);
    for n in needles {
        assert!(e.message.contains(n), "{what}: {:?} lacks {n:?}", e.message);
    }
}

/// Any write refused with a 403 whose message holds every needle.
pub fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>, needles: &[&str]) {
    match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{what}: {}", e.message);
            for n in needles {
                assert!(e.message.contains(n), "{what}: {:?} lacks {n:?}", e.message);
            }
        }
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}
