//! The rendezvous of the LD_PRELOAD shim's listeners ([`netns::serving`]) read while no
//! handshake is under way there. A rendezvous is otherwise read only by the accepts that wait
//! for a HELLO (`netns_accept`): a HELLO that proves nothing (forged, replayed or late) sent
//! while none waits would sit unread, its sender waiting, until the server's next connection
//! from another namespace. So each process that serves other namespaces has a keeper thread,
//! started with its first rendezvous, that reads every one of its rendezvous whenever
//! something arrives there and no nonce is live (what it reads can then prove nothing, and is
//! refused at once). While a nonce is live, the rendezvous's registration stays in the
//! keeper's set unreported ([`Watch::reported`]): the accept that waits for the HELLO reads
//! it, and the keeper costs the connection no thread wake-up.
//!
//! The Rust API's listener waits on its rendezvous in its own accept and has no keeper.

use crate::log;
use colo_sys::doorbell::Poller;
use colo_sys::BorrowedFd;
use std::sync::{Arc, Mutex};

/// A rendezvous's registration in its process's keeper set.
#[derive(Debug)]
pub struct Watch {
    set: Arc<Poller>,
    token: u64,
}

impl Watch {
    /// Reports the rendezvous's wait fd `fd` to the keeper (`on`: no nonce is live), or not.
    pub fn reported(&self, fd: BorrowedFd<'_>, on: bool) {
        // If this fails the registration stays as it was: reported, the keeper's next look
        // asks again (`Rendezvous::keep_look`); unreported, a forged HELLO waits for the next
        // look of an accept, as without a keeper.
        let _ = self.set.set_reported(fd, self.token, on);
    }
}

/// What a keeper watches: a rendezvous of this process's (`netns::Rendezvous`).
pub trait Keepable: Sync {
    /// The fd that is readable when something arrived at the rendezvous.
    fn wait_fd(&self) -> BorrowedFd<'_>;
    /// From now on the keeper `w` reads the rendezvous while no nonce is live.
    fn kept_by(&self, w: Watch);
    /// The keeper's look at what arrived.
    fn keep_look(&self);
}

/// The rendezvous a keeper watches, by token (their index).
type Kept = Arc<Mutex<Vec<&'static dyn Keepable>>>;

/// This process's keeper: its set, and the rendezvous it watches.
struct Keeper {
    pid: u32,
    set: Arc<Poller>,
    kept: Kept,
}

/// Taken only under the lock of `netns::SERVING` (held around a fork), so never held at one.
/// A fork child's value is its parent's (another pid): it starts a keeper of its own.
static KEEPER: Mutex<Option<Keeper>> = Mutex::new(None);

/// Has this process's keeper watch `r` (just bound by `netns::serving`), starting the keeper if
/// this process has none. Logged and left unwatched if no thread can be started.
pub fn keep(r: &'static dyn Keepable) {
    let mut k = KEEPER.lock().unwrap_or_else(|e| e.into_inner());
    let pid = colo_sys::host::pid();
    if k.as_ref().is_none_or(|k| k.pid != pid) {
        match start() {
            Ok((set, kept)) => *k = Some(Keeper { pid, set, kept }),
            Err(e) => {
                log::info(format_args!("COLO_NETNS_DIR: no keeper thread ({e}): a forged HELLO is answered at the next accept"));
                *k = None;
                return;
            }
        }
    }
    let Some(k) = k.as_ref() else { return };
    let mut kept = k.kept.lock().unwrap_or_else(|e| e.into_inner());
    let token = kept.len() as u64;
    if k.set.add(r.wait_fd(), token).is_ok() {
        kept.push(r);
        r.kept_by(Watch { set: k.set.clone(), token });
    }
}

fn start() -> std::io::Result<(Arc<Poller>, Kept)> {
    let set = Arc::new(Poller::new_above(crate::floor::fd_floor())?);
    let kept: Kept = Arc::new(Mutex::new(Vec::new()));
    let (s, l) = (set.clone(), kept.clone());
    colo_sys::host::spawn("colo-netns", move || run(&s, &l))?;
    Ok((set, kept))
}

/// The keeper thread: reads each rendezvous reported (it is reported only while no nonce of it
/// is live; `Rendezvous::keep_look` checks again under its lock).
fn run(set: &Poller, kept: &Mutex<Vec<&'static dyn Keepable>>) {
    loop {
        let Ok(tokens) = set.wait(None) else { return };
        for t in tokens {
            let r = kept.lock().unwrap_or_else(|e| e.into_inner()).get(t as usize).copied();
            if let Some(r) = r {
                r.keep_look();
            }
        }
    }
}
