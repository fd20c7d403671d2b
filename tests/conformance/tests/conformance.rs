//! The CSI spec clauses, as part of `make test`: every clause must pass;
//! the report names each one.

use conformance::Report;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_follows_the_spec() {
    let mut report = Report::default();
    conformance::controller::run(&mut report).await;
    print!(
        "{}",
        report.render("CSI spec clauses: Identity and Controller (controller on pvesim)")
    );
    assert!(
        report.results.len() >= 50,
        "only {} clauses ran",
        report.results.len()
    );
    assert!(
        report.failed().is_empty(),
        "failed clauses: {:#?}",
        report.failed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_follows_the_spec() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the node clauses need root, and CI is set"
        );
        eprintln!("SKIPPED: the node clauses need root (loop devices, mounts)");
        return;
    }
    let mut report = Report::default();
    conformance::node::run(&mut report).await;
    print!(
        "{}",
        report.render("CSI spec clauses: Node (node plugin and hostd on loop devices)")
    );
    assert!(
        report.results.len() >= 30,
        "only {} clauses ran",
        report.results.len()
    );
    assert!(
        report.failed().is_empty(),
        "failed clauses: {:#?}",
        report.failed()
    );
}
