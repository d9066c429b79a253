//! When a waiter's queue entry was surely on the server: every backend says
//! `"lock busy: waiting"` (a DEBUG event) right after a call of its has
//! created a queue entry (the server's answer said so, or the in-memory
//! queue has it). The recorder runs each acquire in a `chaos_op` span
//! naming its operation; this layer notes the event's time against that
//! operation. First come, first served is by the server's order: a waiter
//! whose request was held in the network, or that joined the queue only on
//! a later attempt, came when its entry was written, not when it asked.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use super::clock::now_ns;

/// The message the backends send when a call of theirs has joined a queue.
pub const QUEUED: &str = "lock busy: waiting";
/// The recorder's span around an acquire: `op` is the operation's number.
pub const SPAN: &str = "chaos_op";

/// Operation number → when each of its queue entries was known written.
static JOINED: Mutex<BTreeMap<u64, Vec<u64>>> = Mutex::new(BTreeMap::new());

/// Listen in this process (once; later calls do nothing).
pub fn install() {
    let filter = Targets::new()
        .with_target("tower_lock", Level::DEBUG)
        .with_target(SPAN, Level::TRACE);
    let subscriber = tracing_subscriber::registry().with(Joins.with_filter(filter));
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The times operation `op` joined a queue, taken out.
pub fn take(op: u64) -> Vec<u64> {
    JOINED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&op)
        .unwrap_or_default()
}

struct Joins;

/// The `op` field of a [`SPAN`].
struct OpId(u64);

#[derive(Default)]
struct Fields {
    op: Option<u64>,
    queued: bool,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "op" {
            self.op = Some(value);
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" && value == QUEUED {
            self.queued = true;
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}") == QUEUED {
            self.queued = true;
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Joins {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != SPAN {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(op), Some(span)) = (fields.op, ctx.span(id)) {
            span.extensions_mut().insert(OpId(op));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if !fields.queued {
            return;
        }
        let at = now_ns();
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(OpId(op)) = span.extensions().get::<OpId>() {
                JOINED
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(*op)
                    .or_default()
                    .push(at);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower_lock::backend::AcquireRequest;
    use tower_lock::{LockBackend, LockKey, MemoryBackend};
    use tracing::Instrument;

    use super::*;

    #[tokio::test]
    async fn a_waiter_s_queue_entry_is_noted_against_its_operation() {
        install();
        let backend = MemoryBackend::new();
        let key = LockKey::global("queued-test").unwrap();
        let ttl = Duration::from_secs(5);
        let holder = AcquireRequest::new(key.clone(), "a", ttl, Duration::ZERO).unwrap();
        backend.acquire(&holder).await.unwrap();
        let waiter = AcquireRequest::new(key.clone(), "b", ttl, Duration::from_millis(20)).unwrap();
        let span = tracing::debug_span!(target: "chaos_op", "chaos_op", op = 4242_u64);
        let before = now_ns();
        let _ = backend.acquire(&waiter).instrument(span).await;
        let joined = take(4242);
        assert_eq!(joined.len(), 1, "{joined:?}");
        assert!(joined[0] >= before);
    }
}
