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
    assert!(
        out.faults.contains_key("controller SIGKILLed"),
        "the controller was never killed"
    );
    assert!(
        out.violations.is_empty(),
        "violations:\n{}",
        out.violations.join("\n")
    );
}
