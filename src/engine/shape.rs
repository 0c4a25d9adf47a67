//! Why a workload is idle: the shape its idleness takes. Its own module because both the
//! model (a classification) and the resumption risk (spans pooled by shape) name it.

/// Why a workload is idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdleShape {
    /// Compute idle while holding GPU memory: weights resident, no traffic.
    MemoryHeld,
    /// Compute idle and memory empty: allocated, unused.
    Unused,
    /// Pods bound to GPUs that never started working (Pending, crash loop, image pull).
    Provisioning,
    /// Low engine activity while data streams in over PCIe: waiting on the pipeline.
    DataStarved,
}

impl IdleShape {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleShape::MemoryHeld => "MemoryHeld",
            IdleShape::Unused => "Unused",
            IdleShape::Provisioning => "Provisioning",
            IdleShape::DataStarved => "DataStarved",
        }
    }
}
