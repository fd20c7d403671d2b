//! CSI services of the node plugin. One file per service.

pub mod identity;
pub mod node;
