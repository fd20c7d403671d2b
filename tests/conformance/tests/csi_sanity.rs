//! csi-sanity in `make test`: every spec passes; a spec is skipped only
//! because a capability is not advertised (see the README).

use conformance::sanity::{self, Specs};

fn binary() -> Option<std::path::PathBuf> {
    match sanity::build() {
        Ok(Some(b)) => Some(b),
        Ok(None) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "../shared/tools/csi-sanity is missing, and CI is set"
            );
            eprintln!("SKIPPED: ../shared/tools/csi-sanity is not beside the repository");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

async fn check(storage: &str, kind: &str, specs: Specs) {
    let Some(bin) = binary() else { return };
    if !conformance::as_root() {
        return;
    }
    let o = sanity::run(&bin, storage, kind, specs)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "csi-sanity {specs:?} on {kind} storage {storage}: {}",
        o.summary
    );
    assert!(o.passed, "csi-sanity failed on {kind}:\n{}", o.output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_specs_on_lvmthin_with_the_node_on_loop_devices() {
    check("local-lvm", "lvmthin", Specs::All).await;
}

// The Controller specs on every storage type pvesim models (the node answers
// NodeGetInfo; its own specs ran above).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_specs_on_lvm_with_volume_chains() {
    check("san", "lvm", Specs::Controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_specs_on_zfspool() {
    check("local-zfs", "zfspool", Specs::Controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_specs_on_shared_rbd() {
    check("ceph", "rbd", Specs::Controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_specs_on_dir() {
    check("local", "dir", Specs::Controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_specs_on_shared_nfs() {
    check("nfs", "nfs", Specs::Controller).await;
}
