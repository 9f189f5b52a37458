//! Failures on the scheduler thread: a panic's message for the failed job's error, and fault
//! injection for the survival tests, compiled only with debug assertions (the `ci` and
//! test profiles; never in a release build) and armed only by the server's environment:
//! `SNUG_TEST_PANIC=PHASE:SEED[,PHASE:SEED…]` with PHASE `admit` or `sample` makes a job with
//! that sampling seed panic there. No request can arm it.

/// A panic's message, for the failed request's error.
pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    match (p.downcast_ref::<&str>(), p.downcast_ref::<String>()) {
        (Some(s), _) => format!("{s}; the request was dropped, others go on"),
        (_, Some(s)) => format!("{s}; the request was dropped, others go on"),
        _ => "a panic; the request was dropped, others go on".to_string(),
    }
}

/// Where an injected fault fires.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Phase {
    Admit,
    Sample,
}

#[cfg(debug_assertions)]
pub(super) fn check(req: &super::Request, at: Phase) {
    use std::sync::OnceLock;
    static ARMED: OnceLock<Vec<(Phase, u64)>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        let v = std::env::var("SNUG_TEST_PANIC").unwrap_or_default();
        let one = |p: &str| {
            let (phase, seed) = p.split_once(':')?;
            let phase = match phase {
                "admit" => Phase::Admit,
                "sample" => Phase::Sample,
                _ => return None,
            };
            Some((phase, seed.parse().ok()?))
        };
        v.split(',').filter_map(one).collect()
    });
    if armed.contains(&(at, req.sampling.seed)) {
        panic!("injected fault at {at:?} (SNUG_TEST_PANIC)");
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub(super) fn check(_: &super::Request, _: Phase) {}
