//! The fault campaign, short, as part of `make test` (fixed seed, so a
//! failure repeats with `soak --seconds 40 --seed 7`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_campaign_leaves_nothing_behind() {
    let out = bench::soak::run(7, std::time::Duration::from_secs(40), 0.3)
        .await
        .unwrap();
    print!("{}", out.render());
    let ops: u64 = out.operations.values().sum();
    let faults: u64 = out.faults.values().sum();
    assert!(
        ops >= 30 && faults >= 8,
        "too little happened: {ops} operations, {faults} faults"
    );
    let kills = out.faults.get("controller SIGKILLed").unwrap_or(&0)
        + out
            .faults
            .get("controller SIGKILLed during an out-of-band change")
            .unwrap_or(&0)
        + out.faults.get(bench::soak::KILLED_MID_CALL).unwrap_or(&0);
    assert!(kills > 0, "the controller was never killed");
    let kinds = bench::operator::KINDS
        .iter()
        .filter(|k| out.faults.contains_key(*k))
        .count();
    assert!(
        kinds >= 3,
        "only {kinds} kinds of out-of-band change happened"
    );
    // Every counted fault fired or was taken back unfired (a violation
    // otherwise); some fired.
    assert!(
        out.fired.errors_5xx
            + out.fired.dropped_connections
            + out.fired.failed_hotplugs
            + out.fired.failed_tasks
            > 0,
        "no injected fault fired: {:?}",
        out.fired
    );
    // A 596 after a write, and writes queued behind a saturated pvedaemon
    // that the proxy answered 596 and carried out later.
    assert!(
        out.fired.lost_answers > 0 && out.fired.proxy_timeouts > 0,
        "no write was answered 596 after taking effect: {:?}",
        out.fired
    );
    assert!(
        out.violations.is_empty(),
        "violations:\n{}",
        out.violations.join("\n")
    );
}
