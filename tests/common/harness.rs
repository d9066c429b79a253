//! One harness for every backend, so each behavioural test is written once.

use std::sync::Arc;
use std::time::Duration;

use tower_lock::{MemoryBackend, SharedBackend};

/// A backend under test, plus how to let time pass for TTLs.
#[derive(Clone)]
pub struct Harness {
    pub backend: SharedBackend,
    /// Memory runs on tokio's paused clock; Redis on the server's real one.
    pub paused: bool,
    #[allow(dead_code)]
    keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

#[allow(dead_code)]
impl Harness {
    /// The in-memory backend; call inside a runtime with paused time.
    pub fn memory() -> Self {
        Harness {
            backend: Arc::new(MemoryBackend::new()),
            paused: true,
            keep: None,
        }
    }

    /// Let `d` pass for TTLs: advances the paused clock (memory), or waits
    /// for real while the server's clock runs (Redis: that wait IS the thing
    /// under test, not a stand-in for a signal).
    pub async fn advance(&self, d: Duration) {
        if self.paused {
            tokio::time::advance(d).await;
        } else {
            tokio::time::sleep(d).await;
        }
    }
}

/// `backend_tests! { a, b }` runs `async fn a(h: Harness)` and `b` once per
/// backend: `memory::a` (paused clock) and `redis::a` (private server).
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    super::$name($crate::common::harness::Harness::memory()).await
                }
            )*
        }
    };
}
