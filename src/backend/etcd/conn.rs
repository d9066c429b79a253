//! The connection to the cluster: one etcd-client [`Client`] per endpoint,
//! each made on first use, and calls sent to one endpoint at a time (as
//! etcd's own Go client does), the leader's when it is among them (a
//! follower forwards every write to the leader: one more hop). When a call
//! fails or times out, the next call goes to the next endpoint (and looks
//! for the leader again): a dead or stopped member costs the calls in
//! flight to it, not every third call. A call is never repeated
//! after it was sent (it may have landed); the layer then cleans up as
//! after any lost reply.
//!
//! Every call is bounded by a deadline. Errors become
//! [`LockError::BackendUnavailable`] without a key or an owner in the
//! message. The first answer after a failure is announced (see
//! `backend/retry.rs`): work retried in the background (an expiry, a leave) goes
//! again when the process hears from etcd, instead of sleeping out its
//! pause.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use etcd_client::{Client, ConnectOptions, Error, Txn, TxnResponse};
use tokio::sync::OnceCell;
use tokio::time::{Instant, timeout_at};

use crate::backend::retry::Answers;
use crate::error::LockError;

/// The endpoints, and which one calls go to.
pub(super) struct Conn {
    members: Vec<Member>,
    current: AtomicUsize,
    /// The next call first asks which member leads.
    find_leader: AtomicBool,
    /// Whether etcd answers, for the pauses of work retried (see
    /// `backend/retry.rs`).
    answers: Answers,
}

struct Member {
    endpoint: String,
    options: ConnectOptions,
    client: OnceCell<Client>,
}

impl Conn {
    pub(super) fn new(endpoints: Vec<String>, options: ConnectOptions) -> Self {
        Conn {
            members: endpoints
                .into_iter()
                .map(|endpoint| Member {
                    endpoint,
                    options: options.clone(),
                    client: OnceCell::new(),
                })
                .collect(),
            current: AtomicUsize::new(0),
            find_leader: AtomicBool::new(true),
            answers: Answers::default(),
        }
    }

    /// Whether etcd answers: what retried work pauses on.
    pub(super) fn answers(&self) -> &Answers {
        &self.answers
    }

    /// Other pauses (a test's pause longer than the test).
    #[cfg(test)]
    pub(super) fn set_pauses(&mut self, first: std::time::Duration, max: std::time::Duration) {
        self.answers.set_pauses(first, max);
    }

    /// etcd answered a call (see [`Answers::answered`]).
    pub(super) fn answered(&self) {
        self.answers.answered();
    }

    /// The endpoint calls go to now.
    pub(super) fn current(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    /// A call to endpoint `i` failed: the next ones go to the next
    /// endpoint (unless another call moved on already).
    pub(super) fn failed(&self, i: usize) {
        self.answers.failed();
        let next = (i + 1) % self.members.len().max(1);
        let moved = self
            .current
            .compare_exchange(i, next, Ordering::AcqRel, Ordering::Acquire);
        if moved.is_ok() {
            self.find_leader.store(true, Ordering::Release);
        }
    }

    /// The client of the current endpoint (and its index), connected (and
    /// authenticated, with a user) before `end`. A failed or timed-out
    /// connect is tried again by the next call, on the next endpoint.
    pub(super) async fn client(&self, end: Instant) -> Result<(usize, Client), LockError> {
        let (i, client) = self.connect(end).await?;
        if self.members.len() < 2 || !self.find_leader.swap(false, Ordering::AcqRel) {
            return Ok((i, client));
        }
        match timeout_at(end, self.leader(client.clone())).await {
            Ok(Some(leader)) if leader != i => {
                let _ =
                    self.current
                        .compare_exchange(i, leader, Ordering::AcqRel, Ordering::Acquire);
                self.connect(end).await
            }
            _ => Ok((i, client)),
        }
    }

    /// Which of our endpoints the leader serves, as `client`'s member sees
    /// it (`None`: no leader now, or not one of ours).
    async fn leader(&self, client: Client) -> Option<usize> {
        let leader = client.maintenance_client().status().await.ok()?.leader();
        let members = client.cluster_client().member_list().await.ok()?;
        let urls = members
            .members()
            .iter()
            .find(|m| m.id() == leader)?
            .client_urls()
            .to_vec();
        let bare = |url: &str| {
            let url = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"))
                .unwrap_or(url);
            url.trim_end_matches('/').to_owned()
        };
        self.members
            .iter()
            .position(|m| urls.iter().any(|u| bare(u) == bare(&m.endpoint)))
    }

    async fn connect(&self, end: Instant) -> Result<(usize, Client), LockError> {
        let i = self.current();
        let member = &self.members[i];
        let connect = member.client.get_or_try_init(|| async {
            Client::connect([member.endpoint.as_str()], Some(member.options.clone()))
                .await
                .map_err(|e| etcd_error(&e))
        });
        match timeout_at(end, connect).await {
            Ok(Ok(client)) => Ok((i, client.clone())),
            Ok(Err(e)) => {
                self.failed(i);
                Err(e)
            }
            Err(_) => {
                self.failed(i);
                Err(timed_out("connecting to etcd"))
            }
        }
    }

    /// Run `call` on the current endpoint's client before `end`.
    pub(super) async fn call<'a, T, F, Fut>(
        &'a self,
        what: &'static str,
        end: Instant,
        call: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>> + 'a,
    {
        match self.call_lease(what, end, call).await? {
            Ok(reply) => Ok(reply),
            Err(_gone) => Err(LockError::BackendUnavailable(
                "etcd: the lease is gone".into(),
            )),
        }
    }

    /// [`call`](Conn::call), telling "the lease it names is gone" apart
    /// from other failures.
    pub(super) async fn call_lease<'a, T, F, Fut>(
        &'a self,
        what: &'static str,
        end: Instant,
        call: F,
    ) -> Result<Result<T, LeaseGone>, LockError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>> + 'a,
    {
        let (i, client) = self.client(end).await?;
        match timeout_at(end, call(client)).await {
            Ok(Ok(reply)) => {
                self.answered();
                Ok(Ok(reply))
            }
            Ok(Err(e)) if lease_not_found(&e) => {
                self.answered();
                Ok(Err(LeaseGone))
            }
            Ok(Err(e)) => {
                self.failed(i);
                Err(etcd_error(&e))
            }
            Err(_) => {
                self.failed(i);
                Err(timed_out(what))
            }
        }
    }

    /// One transaction before `end`.
    pub(super) async fn txn(
        &self,
        what: &'static str,
        txn: Txn,
        end: Instant,
    ) -> Result<TxnResponse, LockError> {
        self.call(what, end, |c| async move { c.kv_client().txn(txn).await })
            .await
    }

    /// One transaction before `end` that writes under a lease.
    pub(super) async fn txn_with_lease(
        &self,
        what: &'static str,
        txn: Txn,
        end: Instant,
    ) -> Result<Result<TxnResponse, LeaseGone>, LockError> {
        self.call_lease(what, end, |c| async move { c.kv_client().txn(txn).await })
            .await
    }
}

/// A write named a lease etcd no longer has (it expired or was revoked).
#[derive(Debug)]
pub(super) struct LeaseGone;

/// Whether `e` is etcd's "requested lease not found".
pub(super) fn lease_not_found(e: &Error) -> bool {
    match e {
        Error::GRpcStatus(status) => status.message().contains("lease not found"),
        Error::LeaseKeepAliveError(msg) => msg.contains("not found"),
        _ => false,
    }
}

pub(super) fn etcd_error(e: &Error) -> LockError {
    match e {
        Error::GRpcStatus(status) => LockError::BackendUnavailable(
            format!("etcd: {:?}: {}", status.code(), status.message()).into(),
        ),
        other => LockError::BackendUnavailable(format!("etcd: {other}").into()),
    }
}

pub(super) fn timed_out(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("timed out {what}").into())
}

pub(super) fn config_error(what: &str) -> LockError {
    LockError::InvalidConfig(format!("invalid etcd configuration: {what}"))
}

/// A reply without the shape the transaction gives: a bug, or something
/// else writing under our prefix. Never a panic.
pub(super) fn bad_reply(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("unexpected reply from etcd to {what}").into())
}
