//! The handle table behind the C API: a grow-only array of entries, each holding one object
//! (listener, connection, message, loan) and one atomic state word. A handle is an index plus a
//! generation; looking it up is one load and one compare-and-swap, never a lock, and for
//! connections usually no read-modify-write at all (see *Cached references*).
//!
//! # Entries
//!
//! Entries live in chunks of 64, 128, 256, ... entries, allocated when first needed and never
//! freed, so an entry's address is fixed and its memory is always a valid `Entry<T>` (type-stable:
//! a stale handle may read any entry's state word, never freed memory). Its state packs:
//!
//! ```text
//!  63            32 31  29   28    27          0
//! +----------------+------+------+-------------+
//! |   generation   | kind |CLOSED|    refs     |
//! +----------------+------+------+-------------+
//! ```
//!
//! - `kind` 0: vacant (no object). Otherwise the object was written by [`Table::insert`] and is
//!   alive until the entry is vacated.
//! - `refs`: counted references to the object. [`Table::insert`] hands out one, the *owner*
//!   reference, which the handle itself stands for; every [`Ref`] is another, and so is every
//!   reference a thread keeps cached.
//! - `CLOSED`: the handle is dead: no new reference can be taken. Set once, by [`Table::close`]
//!   (the object is dropped when the last reference goes) or [`Table::take`] (the caller moves the
//!   object out once the other references are gone).
//! - `generation`: bumped each time the entry is vacated. A handle carries the generation it was
//!   given out with; after a reuse the generations differ and the stale handle finds nothing.
//!   An entry whose generation would wrap is retired instead of reused, so that a handle value is
//!   never given out twice.
//!
//! Every change to a live entry's state is a compare-and-swap that first checked generation,
//! kind and `CLOSED`, or a decrement by a holder of references: a failed lookup never writes, so
//! a stale or made-up handle cannot disturb the entry's current occupant. The object is dropped
//! by whoever gives back the last reference of a closed entry, exactly once (`Arc`'s argument).
//!
//! # Handles
//!
//! `handle = generation << 32 | (index + 1) << 4`: multiples of 16 (they look like aligned
//! pointers to C) and never 0. Generations start at 1, so small made-up values (generation 0)
//! never name an object.
//!
//! # Cached references
//!
//! [`Table::get_cached`] (used for connections, which every message call looks up) takes
//! [`BATCH`] extra references with its compare-and-swap and keeps them in a small per-thread
//! array ([`HELD`] slots, indexed by entry index); later lookups of the same entry on the same
//! thread take one from there after a plain load of the state (to check generation, kind and
//! `CLOSED`), and a dropped cached [`Ref`] puts its reference back. The cached references are real
//! counts, so the object cannot go while a thread holds some: the plain load decides only whether
//! the handle is still open, not whether the memory is alive. They are given back when the slot is
//! needed for another entry, when the thread sees that the entry was closed (a dropped `Ref` checks
//! `CLOSED`; a close that leaves references behind bumps a global epoch that every cached lookup
//! compares, so each thread gives back the references of closed entries at its next lookup), and
//! when the thread exits. [`Table::close`] gives back the closing thread's own at once, so a
//! single-threaded program frees a closed connection at `colo_close`, as before.
//!
//! # Free indices
//!
//! Vacated indices go to a per-thread cache of up to [`CACHE_CAP`]; a full cache moves half of
//! itself to a global list behind a mutex, and an empty one refills from there in the same batches
//! (or takes a never-used index). A thread's cache is given back to the global list when the
//! thread exits. A message received on one thread and released on another therefore costs a lock
//! only once per [`FREE_BATCH`] messages.
//!
//! # Thread-local state
//!
//! Each table has a [`Local`] (free indices and cached references; plain `Cell`s, no destructor,
//! so reaching it is a bare thread-local access) and a [`Guard`] whose destructor gives the
//! thread's cached indices and references back when the thread exits. After that (in other
//! thread-local destructors) the thread uses the global paths only.
//!
//! # Modules
//!
//! `state` (the state word and handle bits), `table` (the types and each thread's side),
//! `refs` (insert, look up, close, take), `cache` (cached references), `free` (chunks and free
//! indices). Each imports only `state` and `table`.
//!
//! [`BATCH`]: state::BATCH
//! [`HELD`]: state::HELD
//! [`CACHE_CAP`]: state::CACHE_CAP
//! [`FREE_BATCH`]: state::FREE_BATCH

mod cache;
mod free;
mod refs;
mod state;
mod table;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod timing;

pub(crate) use table::{Cx, Guard, Local, Ref, Table, TakeError, Taken};
