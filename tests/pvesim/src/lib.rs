//! pvesim: a Proxmox VE API simulator.
//!
//! It answers the `/api2/json` endpoints the driver uses the way Proxmox
//! does: the `{"data": …}` envelope, the error message in the HTTP reason
//! phrase, API-token and ticket authentication, privilege checks from
//! ACLs, request validation against Proxmox's own schema, UPID tasks,
//! per-VM locks, digests and pending changes. See `README.md`.

pub mod api;
pub mod auth;
pub mod clock;
pub mod ctx;
pub mod drive;
pub mod knobs;
pub mod locks;
pub mod perms;
pub mod qmp;
pub mod reply;
pub mod schema;
pub mod server;
pub mod state;
pub mod tasks;
pub mod tls;
pub mod users;

pub use schema::Schema;
pub use server::{Running, Sim};
pub use state::State;
