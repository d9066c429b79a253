//! `examples/jobs.rs` as a process: it must run to the end and show each
//! step it promises (a job keeping its request's lock until it is
//! processed; one instance of three running a singleton scheduled job).

mod common;

use std::process::Command;

#[test]
fn jobs_example_runs_every_step() {
    let bin = common::bank::example_binary("jobs");
    let out = Command::new(bin).output().expect("run the jobs example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    for expected in [
        "POST /reports/7 -> 202",
        "POST /reports/7 while its job runs -> 429",
        "POST /reports/7 after its job -> 202",
        "ok",
    ] {
        assert!(
            lines.contains(&expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    let count = |pred: &dyn Fn(&str) -> bool| lines.iter().filter(|l| pred(l)).count();
    let built = |l: &str| l.starts_with("worker: report 7 built under fence");
    assert_eq!(count(&built), 2, "{stdout}");
    let cron = |l: &str, what: &str| l.starts_with("cron instance") && l.contains(what);
    assert_eq!(count(&|l| cron(l, "nightly report built")), 1, "{stdout}");
    assert_eq!(
        count(&|l| cron(l, "skipped (LOCK_ACQUISITION_FAILED)")),
        2,
        "{stdout}"
    );
}
