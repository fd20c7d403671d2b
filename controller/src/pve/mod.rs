//! The Proxmox VE API client.

pub mod client;
mod tls;

pub use client::{Client, PveError, Version};
