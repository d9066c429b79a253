//! Sharded pub/sub on a cluster.
//!
//! One RESP3 `ClusterConnection` per backend carries every subscription:
//! `SSUBSCRIBE` to the backend's channel of a slot is routed to the shard
//! owning that slot (following `MOVED` while the map is stale), made the
//! first time a waiter waits in that slot and kept. Its pushes arrive on one
//! queue: messages go to their waiter; a `sunsubscribe` the server sends on
//! its own (the slot moved to another shard) and a node's disconnection
//! mean messages may have been missed, so the waiters concerned (all of
//! them for a disconnection: the push does not say which node) re-check at
//! once and subscribe again, which lands on the slot's new owner. A
//! `PING` to every primary each second catches a node that stopped
//! answering without closing its connection.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use deadpool_redis::redis::{PushInfo, PushKind, Value, cmd};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::time::{Instant, timeout, timeout_at};

use super::{Dispatch, KEEPALIVE, Wakeups};
use crate::backend::redis::cluster::Nodes;
use crate::backend::redis::error::{redis_error, timed_out};
use crate::backend::redis::keys::slot_of;
use crate::error::LockError;

/// Subscribe to the backend's channel of `slot`, connecting first if
/// needed.
pub(super) async fn subscribe(
    wake: &Wakeups,
    nodes: &Nodes,
    slot: u16,
    end: Instant,
    op_timeout: Duration,
) -> Result<(), LockError> {
    let _single_flight = timeout_at(end, wake.connecting.lock())
        .await
        .map_err(|_| timed_out("waiting for the Redis pub/sub connection"))?;
    let (generation, conn) = {
        let inner = wake.dispatch.lock();
        if inner.slots.contains(&slot) {
            return Ok(());
        }
        (inner.up, inner.sharded.clone())
    };
    let (generation, mut conn) = match (generation, conn) {
        (Some(generation), Some(conn)) => (generation, conn),
        _ => connect(wake, nodes, end, op_timeout).await?,
    };
    let channel = wake.channel(slot).into_owned();
    match timeout_at(end, conn.ssubscribe(&channel)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(redis_error(&e)),
        Err(_) => return Err(timed_out("subscribing to Redis")),
    }
    let mut inner = wake.dispatch.lock();
    if inner.up == Some(generation) {
        inner.slots.insert(slot);
    }
    Ok(())
}

async fn connect(
    wake: &Wakeups,
    nodes: &Nodes,
    end: Instant,
    op_timeout: Duration,
) -> Result<(u64, ClusterConnection), LockError> {
    let (tx, rx) = unbounded_channel();
    let conn = nodes.pubsub(tx, end).await?;
    let old_reader = {
        let mut inner = wake.dispatch.lock();
        inner.generation += 1;
        let generation = inner.generation;
        let reader = tokio::spawn(read(
            Arc::clone(&wake.dispatch),
            generation,
            conn.clone(),
            rx,
            op_timeout,
        ));
        inner.up = Some(generation);
        inner.slots.clear();
        inner.sharded = Some(conn.clone());
        (generation, inner.reader.replace(reader.abort_handle()))
    };
    if let Some(old) = old_reader.1 {
        old.abort();
    }
    Ok((old_reader.0, conn))
}

/// Deliver grants until the connection is gone, then mark it down.
async fn read(
    dispatch: Arc<Dispatch>,
    generation: u64,
    conn: ClusterConnection,
    mut pushes: UnboundedReceiver<PushInfo>,
    op_timeout: Duration,
) {
    let keepalive = tokio::spawn(keep_alive(
        Arc::clone(&dispatch),
        generation,
        conn,
        op_timeout,
    ));
    let _cleanup = super::Cleanup {
        dispatch: Arc::clone(&dispatch),
        generation,
        keepalive: keepalive.abort_handle(),
    };
    while let Some(push) = pushes.recv().await {
        match push.kind {
            PushKind::SMessage => {
                if let Some(Value::BulkString(payload)) = push.data.get(1) {
                    dispatch.deliver(payload);
                }
            }
            PushKind::SUnsubscribe => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    let moved = slot_of(&String::from_utf8_lossy(channel));
                    dispatch.lost(generation, |slot| slot == moved);
                }
            }
            PushKind::Disconnection => dispatch.lost(generation, |_| true),
            _ => {}
        }
    }
}

async fn keep_alive(
    dispatch: Arc<Dispatch>,
    generation: u64,
    mut conn: ClusterConnection,
    op_timeout: Duration,
) {
    let every_primary = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    loop {
        tokio::time::sleep(KEEPALIVE).await;
        let pong = timeout(
            op_timeout,
            conn.route_command(cmd("PING"), every_primary.clone()),
        );
        if !matches!(pong.await, Ok(Ok(_))) {
            dispatch.lost(generation, |_| true);
        }
    }
}
