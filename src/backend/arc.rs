//! The backend trait through an `Arc`, and a small join for backends that
//! send several calls at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::{
    AcquireRequest, BoxFuture, ExtendRequest, FlightPublish, FlightResult, FlightStart, HeldBy,
    Holder, Lease, LockBackend, LockError, LockKey, LockStatus,
};

impl<T: LockBackend + ?Sized> LockBackend for Arc<T> {
    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        (**self).acquire(req)
    }
    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        (**self).release(key, holder)
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn supports(&self, kind: crate::spec::LockKind) -> bool {
        (**self).supports(kind)
    }
    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        (**self).extend(key, holder, ttl)
    }
    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        (**self).claim(key, holder, attempt)
    }
    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        (**self).force_release(key)
    }
    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        (**self).status(key)
    }
    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        (**self).extend_many(batch)
    }
    fn extend_each<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> Option<Vec<BoxFuture<'a, Result<Lease, LockError>>>> {
        (**self).extend_each(batch)
    }
    fn held_by<'a>(
        &'a self,
        owner: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HeldBy>, LockError>> {
        (**self).held_by(owner, limit)
    }
    fn owns<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        (**self).owns(key, owner)
    }
    fn try_acquire_now(&self, req: &AcquireRequest) -> Option<Result<Lease, LockError>> {
        (**self).try_acquire_now(req)
    }
    fn try_release_now(&self, key: &LockKey, holder: Holder<'_>) -> Option<Result<(), LockError>> {
        (**self).try_release_now(key, holder)
    }
    fn flight_begin<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<FlightStart, LockError>> {
        (**self).flight_begin(req)
    }
    fn flight_result<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<FlightResult>, LockError>> {
        (**self).flight_result(key)
    }
    fn flight_publish<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        publish: &'a FlightPublish,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        (**self).flight_publish(key, owner, publish)
    }
}

/// Drive `futures` concurrently; their outputs in order.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    use std::task::Poll;
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
