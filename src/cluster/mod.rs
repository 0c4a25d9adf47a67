//! The cluster edge of the controller: the inventory of GPU workloads (pure resolution
//! of pods to their root workloads) and the actions on them (IO through kube::Client).

pub mod actions;
pub mod address;
pub mod discovery;
pub mod inventory;
pub mod snapshot;
