//! Who holds the server's connections: the open connections in the order they were accepted,
//! which of them are waiting for a request head (their first, or the next one on a kept-alive
//! connection), and how many each remote address holds.
//!
//! Design: at `--max-connections` a new connection does not lose to the ones already open. The
//! oldest connection that is still waiting for its first request head is evicted (closed
//! without an answer: it has not asked anything); failing that, the oldest kept-alive one that
//! is idle between requests (HTTP lets a server close an idle connection at any time; clients
//! open a new one). The new one takes its place, so a flood of half-open sockets, or of
//! connections that ask once and then idle, can delay a real client by one accept, never lock
//! it (or a liveness probe) out. Only when every open connection is being answered is the new
//! one refused with 503. A peer that is not loopback may hold at most
//! `--max-connections-per-peer` of them, so one remote machine cannot evict everyone else's
//! waiting connections; loopback peers are exempt (a reverse proxy on the same host speaks for
//! many clients).
//!
//! Cost: one short mutex section per accept and per close (a map insert/remove); an eviction
//! scans the open connections in age order, at most `--max-connections` entries, and only
//! when the cap is reached.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The open connections and their caps.
pub struct Conns {
    max: usize,
    per_peer: usize,
    inner: Mutex<Inner>,
    /// Signalled whenever a connection closes (shutdown waits on it).
    closed: Notify,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// By accept order: the smallest key is the oldest connection.
    open: BTreeMap<u64, Entry>,
    by_peer: HashMap<IpAddr, usize>,
}

struct Entry {
    peer: IpAddr,
    state: Arc<State>,
    evict: Arc<Notify>,
}

/// Where a connection is in its life: waiting for its first request head, answering, or idle
/// between requests. Set by the transport, read at the cap.
#[derive(Default)]
pub struct State(AtomicU8);

const FRESH: u8 = 0;
const BUSY: u8 = 1;
const IDLE: u8 = 2;

impl State {
    /// A request head arrived: not evictable until its answer is done.
    pub fn busy(&self) {
        self.0.store(BUSY, Ordering::Release);
    }

    /// The answer was sent (or given up): waiting for the next request head.
    pub fn idle(&self) {
        self.0.store(IDLE, Ordering::Release);
    }

    /// Still waiting for its first request head.
    pub fn is_fresh(&self) -> bool {
        self.is(FRESH)
    }

    fn is(&self, s: u8) -> bool {
        self.0.load(Ordering::Acquire) == s
    }
}

/// Why a connection was not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every open connection is being answered: none may be evicted.
    Full,
    /// This (non-loopback) peer already holds its share.
    PeerFull,
}

/// An admitted connection: its place is given back when this drops.
pub struct Held {
    conns: Arc<Conns>,
    id: u64,
    /// Fresh, busy or idle (see [`State`]).
    pub state: Arc<State>,
    /// Notified when a newer connection took this one's place.
    pub evict: Arc<Notify>,
    /// Whether admitting this connection evicted another.
    pub evicted_one: bool,
}

impl Conns {
    /// At most `max` connections, and `per_peer` from any one non-loopback address.
    pub fn new(max: usize, per_peer: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max: max.max(1),
            per_peer: per_peer.max(1),
            inner: Mutex::new(Inner::default()),
            closed: Notify::new(),
        })
    }

    /// Admits a connection from `peer`, evicting at the cap the oldest fresh connection, else
    /// the oldest idle one (this peer's own first).
    pub fn admit(self: &Arc<Conns>, peer: IpAddr) -> Result<Held, Refusal> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mine = g.by_peer.get(&peer).copied().unwrap_or(0);
        if !peer.is_loopback() && mine >= self.per_peer {
            return Err(Refusal::PeerFull);
        }
        let mut evicted_one = false;
        if g.open.len() >= self.max {
            // Prefer this same peer's own oldest waiting connection, then anyone's; a fresh one
            // (it asked nothing) before an idle one.
            let oldest = |state: u8, same: bool| {
                g.open
                    .iter()
                    .find(|(_, e)| e.state.is(state) && (!same || e.peer == peer))
                    .map(|(id, _)| *id)
            };
            let Some(id) = [(FRESH, true), (FRESH, false), (IDLE, true), (IDLE, false)]
                .into_iter()
                .find_map(|(state, same)| oldest(state, same))
            else {
                return Err(Refusal::Full);
            };
            let e = g.open.remove(&id).expect("found above");
            g.release(e.peer);
            e.evict.notify_one();
            evicted_one = true;
        }
        let id = g.next;
        g.next += 1;
        let state = Arc::new(State::default());
        let evict = Arc::new(Notify::new());
        g.open.insert(id, Entry { peer, state: state.clone(), evict: evict.clone() });
        *g.by_peer.entry(peer).or_insert(0) += 1;
        Ok(Held { conns: self.clone(), id, state, evict, evicted_one })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).open.len()
    }

    /// Waits until no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let wait = self.closed.notified();
            if self.open() == 0 {
                return;
            }
            wait.await;
        }
    }
}

impl Inner {
    fn release(&mut self, peer: IpAddr) {
        if let Some(n) = self.by_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&peer);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut g = self.conns.inner.lock().unwrap_or_else(|e| e.into_inner());
        // An evicted connection's entry is already gone.
        if let Some(e) = g.open.remove(&self.id) {
            g.release(e.peer);
        }
        drop(g);
        self.conns.closed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const FAR: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

    #[test]
    fn at_the_cap_the_oldest_fresh_connection_makes_room() {
        let c = Conns::new(3, 8);
        let a = c.admit(LOCAL).unwrap();
        let b = c.admit(LOCAL).unwrap();
        let d = c.admit(LOCAL).unwrap();
        a.state.busy(); // a sent its request: not evictable while it is answered
        let e = c.admit(LOCAL).unwrap();
        assert!(e.evicted_one);
        assert_eq!(c.open(), 3);
        // b was the oldest fresh one; its eviction is signalled.
        assert!(futures_util::FutureExt::now_or_never(b.evict.notified()).is_some());
        assert!(futures_util::FutureExt::now_or_never(d.evict.notified()).is_none());
        drop(b); // its entry is already gone: nothing else is released
        assert_eq!(c.open(), 3);
        for h in [&d, &e] {
            h.state.busy();
        }
        assert_eq!(c.admit(LOCAL).err(), Some(Refusal::Full));
        drop((a, d, e));
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn idle_kept_alive_connections_make_room_after_fresh_ones() {
        let c = Conns::new(3, 8);
        let (a, b, d) = (c.admit(LOCAL).unwrap(), c.admit(LOCAL).unwrap(), c.admit(LOCAL).unwrap());
        for h in [&a, &b] {
            h.state.busy();
            h.state.idle(); // answered, kept alive
        }
        // d never asked: it goes first, though a and b are older.
        let e = c.admit(LOCAL).unwrap();
        assert!(futures_util::FutureExt::now_or_never(d.evict.notified()).is_some());
        e.state.busy();
        // Then the oldest idle one, a; b asks again meanwhile and is kept.
        b.state.busy();
        let f = c.admit(LOCAL).unwrap();
        assert!(f.evicted_one);
        assert!(futures_util::FutureExt::now_or_never(a.evict.notified()).is_some());
        assert!(futures_util::FutureExt::now_or_never(b.evict.notified()).is_none());
        f.state.busy();
        assert_eq!(c.admit(LOCAL).err(), Some(Refusal::Full));
        drop((a, b, d, e, f));
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn a_remote_peer_gets_its_share_and_loopback_is_exempt() {
        let c = Conns::new(100, 2);
        let held: Vec<_> = (0..2).map(|_| c.admit(FAR).unwrap()).collect();
        assert_eq!(c.admit(FAR).err(), Some(Refusal::PeerFull));
        let local: Vec<_> = (0..5).map(|_| c.admit(LOCAL).unwrap()).collect();
        drop(held);
        assert!(c.admit(FAR).is_ok());
        drop(local);
    }
}
