//! The CSI spec clauses, as part of `make test`: every clause must pass;
//! the report names each one. The Identity and Controller clauses run once
//! per storage type pvesim models; the Node clauses on this host's loop
//! devices (the guest VM's run is `tests/e2e`'s `node_follows_the_spec_in_the_guest`).

use conformance::Report;

/// Every Identity and Controller clause with volumes on `storage` (a
/// pvesim storage of type `kind`): at least `CONTROLLER_CLAUSES` ran, none
/// failed.
async fn controller_on(storage: &str, kind: &str) {
    let mut report = Report::default();
    conformance::controller::run_on(storage, kind, &mut report).await;
    let title = format!(
        "CSI spec clauses: Identity and Controller (controller on pvesim, {kind} storage {storage})"
    );
    report.require_all_passed(&title, CONTROLLER_CLAUSES);
}

/// The Identity and Controller clauses `controller::run_on` reports.
const CONTROLLER_CLAUSES: usize = 95;

/// The Node clauses `node::run` reports on this host.
const NODE_CLAUSES: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_spec() {
    controller_on("local-lvm", "lvmthin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_spec_on_lvm_with_volume_chains() {
    controller_on("san", "lvm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_spec_on_zfspool() {
    controller_on("local-zfs", "zfspool").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_spec_on_shared_rbd() {
    controller_on("ceph", "rbd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_spec_on_dir() {
    controller_on("local", "dir").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_spec_on_shared_nfs() {
    controller_on("nfs", "nfs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_follows_the_spec() {
    testkit::require_root!();
    let mut report = Report::default();
    conformance::node::run(&mut report).await;
    report.require_all_passed(
        "CSI spec clauses: Node (node plugin and hostd on loop devices)",
        NODE_CLAUSES,
    );
}
