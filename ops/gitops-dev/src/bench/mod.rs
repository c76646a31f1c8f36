//! Benchmarks: programs, not tests, that print figures as JSON on stdout and their
//! progress on stderr. Tests assert behaviour; these measure it.

pub mod appstudio;
pub mod chaos;
pub mod cpu;
pub mod e2e;
pub mod failover;
pub mod kube;
pub mod queue;
pub mod soak;
