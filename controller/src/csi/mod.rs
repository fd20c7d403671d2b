//! CSI services of the controller. One file per service; handlers stay thin.

pub mod controller;
pub mod identity;
