//! A sleeper's registration of its wake-up eventfd with the connections it waits on.

use crate::conn::state::Conn;
use colo_sys::RawFd;
use std::sync::{Arc, Weak};

/// Registers a wake-up eventfd (`colo::internal::wake`: this thread's, or an epoll set's) with some
/// connections for as long as it lives (`Shm::add_waker`): their doorbells' drains by other
/// threads ring it. Made before the sleep's drains and announcements. It holds the connections
/// weakly: one that another thread closes during an `epoll_wait`'s sleep ends then (its FIN
/// goes out), as the kernel's epoll set holds no reference to the sockets in it; a holder would
/// keep it until the sleeper woke, perhaps never.
pub struct Waking {
    /// The connections it was registered with.
    conns: Vec<Weak<Conn>>,
    fd: RawFd,
    /// Whether it was registered with every connection (some may have had all places taken).
    complete: bool,
}

impl Waking {
    pub fn new<T>(items: &[T], conn: fn(&T) -> &Arc<Conn>, fd: RawFd) -> Self {
        let mut conns = Vec::with_capacity(items.len());
        let mut complete = true;
        for item in items {
            let c = conn(item);
            if c.shm().add_waker(fd) {
                conns.push(Arc::downgrade(c));
            } else {
                complete = false;
            }
        }
        Waking { conns, fd, complete }
    }

    /// Whether it is registered with every connection: if not, the sleep must be no longer
    /// than `colo::internal::shm::UNPASSED_SLEEP`.
    pub fn complete(&self) -> bool {
        self.complete
    }
}

impl Drop for Waking {
    fn drop(&mut self) {
        // (A connection dropped meanwhile took its list of wakers with it.)
        for c in self.conns.iter().filter_map(Weak::upgrade) {
            c.shm().remove_waker(self.fd);
        }
    }
}
