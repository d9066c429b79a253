//! Wake-ups: every waiter of a backend (and its clones) watches through one
//! etcd watch stream, each watch with an id of its own, from the revision
//! after what it read: nothing that happened since is missed, however late
//! the watch is set up.
//!
//! A waiter watches one key (its predecessor in the queue, or the holder
//! when it is the oldest), so a release wakes one waiter, not all. When the
//! stream breaks (its member died, lost its leader, or was compacted past a
//! watch's revision) every watch hears [`Note::Gone`] and its waiter reads
//! the lock again; the next watch opens a new stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use etcd_client::{EventType, KeyValue, WatchOptions};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout_at};

use super::Shared;
use super::conn::{etcd_error, timed_out};
use crate::error::LockError;

/// What a watch hears.
pub(super) enum Note {
    /// etcd set the watch up at this revision (its header's): the watch
    /// starts at the one after it (etcd reads the revision, then registers
    /// the watch from the next: a write between the two still reaches it),
    /// so no change after it is missed, and from then on every change of
    /// the watched keys reaches it as it happens.
    Created(i64),
    /// Changes of the watched keys: `true` for a put, `false` for a
    /// delete, with the key-value (a delete's has only key and revision).
    Events(Vec<(bool, KeyValue)>),
    /// The watch ended (its stream broke or etcd cancelled it).
    Gone,
}

/// The backend's watch stream, opened on first use.
#[derive(Default)]
pub(super) struct Watches {
    stream: Mutex<Option<Arc<Stream>>>,
    next_id: AtomicI64,
}

struct Stream {
    /// The endpoint it is open on.
    member: usize,
    commands: mpsc::UnboundedSender<Command>,
    subscribers: Mutex<HashMap<i64, mpsc::UnboundedSender<Note>>>,
    dead: AtomicBool,
}

enum Command {
    Watch(Vec<u8>, WatchOptions),
    Cancel(i64),
}

/// One watch; dropping it cancels it.
pub(super) struct Watch {
    id: i64,
    notes: mpsc::UnboundedReceiver<Note>,
    stream: Arc<Stream>,
}

impl Watch {
    /// The next note; [`Note::Gone`] forever once the watch ended.
    pub(super) async fn next(&mut self) -> Note {
        self.notes.recv().await.unwrap_or(Note::Gone)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let subscribers = &self.stream.subscribers;
        subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        let _ = self.stream.commands.send(Command::Cancel(self.id));
    }
}

impl Watches {
    /// Watch `key` (or `[key, range_end)`) from revision `from`, or, with
    /// `None`, from when etcd sets the watch up ([`Note::Created`] says
    /// when).
    ///
    /// A watch from a past revision starts *unsynced*: etcd catches it up
    /// in a loop that runs every 100 ms, and holds back every later event
    /// for it until then. One from now is synced at once: the waiters use
    /// that, and read what changed before it themselves.
    pub(super) async fn watch(
        &self,
        shared: &Arc<Shared>,
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
        from: Option<i64>,
        end: Instant,
    ) -> Result<Watch, LockError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut options = WatchOptions::new().with_watch_id(id);
        if let Some(from) = from {
            options = options.with_start_revision(from);
        }
        if let Some(range_end) = range_end {
            options = options.with_range(range_end);
        }
        let (tx, notes) = mpsc::unbounded_channel();
        let live = {
            let stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
            stream.clone().filter(|s| !s.dead.load(Ordering::Acquire))
        };
        // Calls moved to another endpoint (this one failed): so do watches.
        let live = match live {
            Some(stream) if stream.member != shared.conn.current() => {
                stream.close();
                None
            }
            live => live,
        };
        let stream = match live {
            Some(stream) => {
                stream.subscribe(id, tx);
                let _ = stream.commands.send(Command::Watch(key, options));
                stream
            }
            None => {
                let stream = open(shared, key, options, id, tx, end).await?;
                let mut current = self.stream.lock().unwrap_or_else(|e| e.into_inner());
                *current = Some(stream.clone());
                stream
            }
        };
        Ok(Watch { id, notes, stream })
    }
}

impl Stream {
    fn subscribe(&self, id: i64, tx: mpsc::UnboundedSender<Note>) {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        if self.dead.load(Ordering::Acquire) {
            let _ = tx.send(Note::Gone);
        } else {
            subscribers.insert(id, tx);
        }
    }

    fn close(&self) {
        self.dead.store(true, Ordering::Release);
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        for (_, tx) in subscribers.drain() {
            let _ = tx.send(Note::Gone);
        }
    }

    fn tell(&self, id: i64, note: Note) {
        let subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = subscribers.get(&id) {
            let _ = tx.send(note);
        }
    }
}

/// Open a stream with its first watch, and the tasks that write to and
/// read from it.
async fn open(
    shared: &Arc<Shared>,
    key: Vec<u8>,
    options: WatchOptions,
    id: i64,
    tx: mpsc::UnboundedSender<Note>,
    end: Instant,
) -> Result<Arc<Stream>, LockError> {
    let (member, client) = shared.conn.client(end).await?;
    let opened = timeout_at(end, client.watch_client().watch(key, Some(options))).await;
    let opened = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) => {
            shared.conn.failed(member);
            return Err(etcd_error(&e));
        }
        Err(_) => {
            shared.conn.failed(member);
            return Err(timed_out("opening an etcd watch"));
        }
    };
    let (mut sender, mut replies) = opened.split();
    let (commands, mut incoming) = mpsc::unbounded_channel();
    let stream = Arc::new(Stream {
        member,
        commands,
        subscribers: Mutex::new(HashMap::from([(id, tx)])),
        dead: AtomicBool::new(false),
    });
    let writer = Arc::downgrade(&stream);
    tokio::spawn(async move {
        while let Some(command) = incoming.recv().await {
            let sent = match command {
                Command::Watch(key, options) => sender.watch(key, Some(options)).await,
                Command::Cancel(id) => sender.cancel(id).await,
            };
            if sent.is_err() {
                if let Some(stream) = writer.upgrade() {
                    stream.close();
                }
                return;
            }
        }
    });
    let reader = Arc::downgrade(&stream);
    tokio::spawn(async move {
        loop {
            let reply = replies.message().await;
            let Some(stream) = reader.upgrade() else {
                return;
            };
            match reply {
                Ok(Some(reply)) => {
                    let id = reply.watch_id();
                    if reply.canceled() {
                        stream.tell(id, Note::Gone);
                        continue;
                    }
                    if reply.created() {
                        let at = reply.header().map_or(0, |h| h.revision());
                        stream.tell(id, Note::Created(at));
                    }
                    let events: Vec<(bool, KeyValue)> = reply
                        .events()
                        .iter()
                        .filter_map(|e| {
                            let kv = e.kv()?.clone();
                            Some((e.event_type() == EventType::Put, kv))
                        })
                        .collect();
                    if !events.is_empty() {
                        stream.tell(id, Note::Events(events));
                    }
                }
                Ok(None) | Err(_) => {
                    stream.close();
                    return;
                }
            }
        }
    });
    Ok(stream)
}
