//! The Proxmox VE API client.

pub mod api;
pub mod client;
pub mod errors;
pub mod metrics;
pub mod replication;
pub mod tasks;
mod tls;

pub use client::{Client, Deadline, PveError, Version};
pub use errors::ErrorKind;
