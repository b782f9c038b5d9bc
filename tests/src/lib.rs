//! Kubernetes API server emulator for Nodes and nodegate's end-to-end harness
