//! Per-node agent: readiness gate, shutdown re-taint and stale-node pruning
