//! Mutating admission webhook that taints Nodes until their network agent is ready
