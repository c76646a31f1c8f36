//! Everything the writer and the agent share: the domain model, database access,
//! the operation queue and its signals, secret encryption and configuration.
//!
//! This crate knows PostgreSQL and nothing about Kubernetes or command lines, so it
//! is tested with a database alone.

pub mod backoff;
pub mod config;
pub mod crypto;
pub mod db;
pub mod exposition;
pub mod histogram;
pub mod listen;
pub mod model;
pub mod process;
pub mod queue;
pub mod sanitize;
pub mod serve;
pub mod signal;
pub mod telemetry;
pub mod tenancy;
