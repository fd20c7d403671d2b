//! pvesim: a Proxmox VE API simulator.
//!
//! It answers the `/api2/json` endpoints the driver uses the way Proxmox
//! does: the `{"data": …}` envelope, the error message in the HTTP reason
//! phrase, API-token and ticket authentication. See `README.md`.

pub mod api;
pub mod auth;
pub mod reply;
pub mod server;
pub mod state;
pub mod tls;

pub use server::{Running, Sim};
pub use state::State;
