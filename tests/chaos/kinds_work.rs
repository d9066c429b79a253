//! The kinds workload: tasks of their own taking shared and exclusive holds
//! of a reader/writer key and `Permits(n)` of a permits key, with the
//! exclusive tasks' operations where they apply (acquire with and without a
//! max wait, cancelled calls, release, drop, extend, walking away, watchdog
//! renewals, hand-off and restore, force release), now and then a
//! request of the other family (refused at once while the key is held),
//! and a caller naming another's hold by its fence (refused).
//! Multi-lock requests through the layer and single-flight stay on the
//! exclusive keys.

use std::time::Duration;

use tower_lock::backend::Holder;
use tower_lock::{JobSpec, LockKey, LockKind};

use super::Task;

/// The owner token of the meddling calls: no acquisition has it.
pub const MEDDLER: &str = "meddler";

impl Task {
    /// One kinds operation.
    pub(super) async fn kinds_step(&mut self) {
        match self.rng.range(0, 99) {
            0..=61 | 95..=99 => {
                let spec = self.kind_spec(false);
                self.hold(spec).await
            }
            62..=71 => {
                let spec = self.kind_spec(false);
                self.hand_off(spec).await
            }
            72..=83 => self.restore().await,
            84..=85 => {
                let key = self.kinds_key();
                self.force_key(&key).await
            }
            86..=87 => self.meddle().await,
            _ => {
                let spec = self.kind_spec(true);
                self.hold(spec).await
            }
        }
    }

    /// A caller that is not the holder names a live hold's fence (read
    /// from the key's status, as from a log or an admin page) with an owner
    /// token of its own, in a release or an extension: it must be refused
    /// and touch nothing (rule 14).
    async fn meddle(&mut self) {
        let key = LockKey::global(self.kinds_key()).expect("key");
        let holds: Vec<u64> = match self.backend.status(&key).await {
            Ok(Some(s)) if s.holders.is_empty() => vec![s.fence],
            Ok(Some(s)) => s.holders.iter().map(|h| h.fence).collect(),
            _ => Vec::new(),
        };
        if !holds.is_empty() {
            let fence = *self.rng.pick(&holds);
            let meddler = Holder::new(MEDDLER, fence);
            if self.rng.chance(50) {
                let _ = self.backend.release(&key, meddler).await;
            } else {
                let ttl = self.ttl();
                let _ = self.backend.extend(&key, meddler, ttl).await;
            }
        }
        self.idle().await;
    }

    fn kinds_key(&mut self) -> String {
        let k = self.cfg.kinds.as_ref().expect("kinds keys");
        let keys = [k.rw.clone(), k.permits.clone()];
        self.rng.pick(&keys).clone()
    }

    /// A spec on one of the kinds keys: shared or exclusive on the
    /// reader/writer key, `Permits(n)` on the permits key; `mismatch`: a
    /// kind of another family than the key's (`Permits(n)` on the
    /// reader/writer key, `Permits(n + 1)` or shared on the permits key).
    fn kind_spec(&mut self, mismatch: bool) -> JobSpec {
        let k = self.cfg.kinds.clone().expect("kinds keys");
        let rw = self.rng.chance(50);
        let kind = match (rw, mismatch) {
            (true, false) if self.rng.chance(35) => LockKind::Exclusive,
            (true, false) => LockKind::Shared,
            (false, false) => LockKind::Permits(k.n),
            (true, true) => LockKind::Permits(k.n),
            (false, true) if self.rng.chance(50) => LockKind::Permits(k.n + 1),
            (false, true) => LockKind::Shared,
        };
        let key = if rw { k.rw } else { k.permits };
        let mut spec = JobSpec::new(key, self.ttl()).kind(kind);
        if self.rng.chance(50) {
            spec = spec.max_wait(Duration::from_millis(self.rng.range(50, 1_500)));
        }
        // One owner for several holds at once: only the fences tell them
        // apart.
        if self.rng.chance(20) {
            let job = format!("job-{}", spec.as_lock_spec().get_key());
            spec = spec.owner(job);
        }
        if self.rng.chance(15) {
            spec = spec.watchdog(true);
        }
        spec
    }
}
