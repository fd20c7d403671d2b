//! Wire definitions: CSI v1.12 (`csi::v1`) and the hostd local API (`hostd::v1`).

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

pub mod hostd {
    pub mod v1 {
        tonic::include_proto!("hostd.v1");
    }
}

/// Path of our own `csi.proto`, for tests that inspect the source.
pub const CSI_PROTO_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto/csi.proto");
