//! Writes that would disturb an installed publisher if admitted are dry
//! runs on a real cluster (they go through the same authorization and
//! admission); the emulator is the test's own.

use kube::api::{DeleteParams, PatchParams, PostParams};
use nodegate_e2e::cluster::Cluster;

pub fn post(c: &Cluster) -> PostParams {
    PostParams {
        dry_run: c.is_real(),
        ..PostParams::default()
    }
}

pub fn delete(c: &Cluster) -> DeleteParams {
    DeleteParams {
        dry_run: c.is_real(),
        ..DeleteParams::default()
    }
}

pub fn patch_params(c: &Cluster) -> PatchParams {
    PatchParams {
        dry_run: c.is_real(),
        ..PatchParams::default()
    }
}
