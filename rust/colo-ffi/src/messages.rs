//! Zero-copy messages: loans written in place and sent, received messages read in place and
//! released.

use crate::*;

/// Loans a buffer of at least `len` bytes for one outgoing message, waiting while every slot of
/// the pool is in flight (unless non-blocking or the write timeout expires). Write the message in
/// place at `*data`, then `colo_send` it (or `colo_loan_cancel`). Over shared memory the buffer
/// is in the segment and the receiver reads these very bytes; over TCP it is a heap buffer framed
/// on the stream. The caller owns the loan; `*data` is valid until it is sent or cancelled.
///
/// Returns 0, or -EBADF, -EINVAL (NULL `out` or `data`), -EMSGSIZE (`len` above
/// `colo_max_message_size`), -ENOBUFS (no pool), -EAGAIN, -EPIPE, -ECONNRESET, -EPROTO.
#[no_mangle]
pub extern "C" fn colo_loan(c: *const colo_conn, len: usize, out: *mut *mut colo_buf, data: *mut *mut c_void) -> c_int {
    guard_int(|| with_cx(|cx| {
        let s = conn_in(cx, c)?;
        if out.is_null() || data.is_null() {
            return Err(EINVAL);
        }
        let loan = s.loan_raw(len).map_err(|e| err(&e))?;
        let ptr = loan.as_mut_ptr();
        // The box keeps `s`'s reference: the stream outlives the loan.
        let h = insert(cx, LOAN, || Obj::Loan(LoanBox { loan, conn: s.0 }))?;
        // SAFETY: `out` and `data` are not NULL and point to writable pointers.
        unsafe {
            *out = h as *mut colo_buf;
            *data = ptr.cast();
        }
        Ok(0)
    }))
}

/// The loan's buffer, or NULL for a bad handle.
#[no_mangle]
pub extern "C" fn colo_loan_data(l: *const colo_buf) -> *mut c_void {
    catch_unwind(|| {
        with(l as usize, LOAN, |o| match o {
            Obj::Loan(b) => b.loan.as_mut_ptr().cast::<c_void>(),
            _ => std::ptr::null_mut(),
        })
        .unwrap_or(std::ptr::null_mut())
    })
    .unwrap_or(std::ptr::null_mut())
}

/// How many bytes the loan's buffer holds (at least the `len` asked for), or -EBADF.
#[no_mangle]
pub extern "C" fn colo_loan_capacity(l: *const colo_buf) -> ssize_t {
    guard(|| {
        with(l as usize, LOAN, |o| match o {
            Obj::Loan(b) => b.loan.capacity() as isize,
            _ => EBADF,
        })
        .ok_or(EBADF)
    })
}

/// Sends the first `len` bytes of the loan as one message. Only a descriptor moves; the receiver
/// reads the buffer in place. The loan handle is consumed (freed) whether or not sending
/// succeeds, except on -EBADF and -EINVAL, which leave it untouched. Over TCP the message is
/// framed on the stream: all of it is sent, or (-EAGAIN) none of it.
///
/// Returns 0, or -EBADF (bad or already sent loan), -EINVAL (`len` above the capacity),
/// -EPIPE (this side shut down writing or closed, or the peer stopped reading or closed),
/// -ECONNRESET, -EPROTO; over TCP also -EAGAIN, -ETIMEDOUT.
#[no_mangle]
pub extern "C" fn colo_send(l: *mut colo_buf, len: usize) -> c_int {
    guard_int(|| with_cx(|cx| {
        let t = take(cx, l as usize, LOAN, |o| match o {
            Obj::Loan(b) if len <= b.loan.capacity() => Ok(()),
            _ => Err(EINVAL),
        })?;
        let (loan, conn) = loan_parts(t);
        // SAFETY: the loan came from `loan_raw` on this connection, its handle is dead now (it is
        // sent once), and `len` fits (checked by the take).
        let r = unsafe { stream_of(&conn).send_raw(loan, len) };
        cx.put(conn);
        r.map(|()| 0).map_err(|e| err(&e))
    }))
}

/// Gives an unsent loan back (its slot returns to the pool) and frees the handle.
///
/// Returns 0, or -EBADF (bad, sent or cancelled loan).
#[no_mangle]
pub extern "C" fn colo_loan_cancel(l: *mut colo_buf) -> c_int {
    guard_int(|| with_cx(|cx| {
        let (loan, conn) = loan_parts(take(cx, l as usize, LOAN, |_| Ok(()))?);
        // SAFETY: as in `colo_send`: this connection's loan, ended once.
        unsafe { stream_of(&conn).cancel_raw(loan) };
        cx.put(conn);
        Ok(0)
    }))
}

/// Receives the next zero-copy message, waiting for one (unless non-blocking or the read timeout
/// expires). On success stores a handle in `*out` and, if not NULL, the message's bytes in
/// `*data` and `*len`: a read-only view in the shared segment (over TCP, a heap copy), valid until
/// `colo_msg_release`. The caller owns the message and must release it: the sender gets the slot
/// back only then.
///
/// Returns 1 (a message), 0 (end of stream: the peer shut down writing or closed, or this side
/// shut down reading; `*out` is set to NULL), or -EBADF, -EINVAL (NULL `out`), -ENOBUFS (no
/// pool), -EAGAIN, -ECONNRESET (the peer reset or died), -EPROTO.
#[no_mangle]
pub extern "C" fn colo_recv_message(
    c: *const colo_conn,
    out: *mut *mut colo_msg,
    data: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    guard_int(|| with_cx(|cx| {
        let s = conn_in(cx, c)?;
        if out.is_null() {
            return Err(EINVAL);
        }
        let Some(msg) = s.recv_raw().map_err(|e| err(&e))? else {
            cx.put(s.0);
            // SAFETY: `out` is not NULL and points to a writable pointer.
            unsafe { *out = std::ptr::null_mut() };
            return Ok(0);
        };
        let (ptr, n) = (msg.as_ptr(), msg.len());
        // The box keeps `s`'s reference: the stream outlives the message.
        let h = insert(cx, MSG, || Obj::Msg(MsgBox { msg, conn: s.0 }))?;
        // SAFETY: `out` is not NULL; `data` and `len` are written only when not NULL.
        unsafe {
            *out = h as *mut colo_msg;
            if !data.is_null() {
                *data = ptr.cast();
            }
            if !len.is_null() {
                *len = n;
            }
        }
        Ok(1)
    }))
}

/// The message's bytes (read-only, valid until released), or NULL for a bad handle.
#[no_mangle]
pub extern "C" fn colo_msg_data(m: *const colo_msg) -> *const c_void {
    catch_unwind(|| {
        with(m as usize, MSG, |o| match o {
            Obj::Msg(b) => b.msg.as_ptr().cast::<c_void>(),
            _ => std::ptr::null(),
        })
        .unwrap_or(std::ptr::null())
    })
    .unwrap_or(std::ptr::null())
}

/// The message's length in bytes, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_msg_len(m: *const colo_msg) -> ssize_t {
    guard(|| {
        with(m as usize, MSG, |o| match o {
            Obj::Msg(b) => b.msg.len() as isize,
            _ => EBADF,
        })
        .ok_or(EBADF)
    })
}

/// Releases a received message: its slot goes back to the sender and the handle and its data
/// pointer become invalid.
///
/// Returns 0, or -EBADF (NULL, already released, or not a message).
#[no_mangle]
pub extern "C" fn colo_msg_release(m: *mut colo_msg) -> c_int {
    guard_int(|| with_cx(|cx| {
        let (msg, conn) = msg_parts(take(cx, m as usize, MSG, |_| Ok(()))?);
        // SAFETY: the message came from `recv_raw` on this connection; its handle is dead now, so
        // it is released once.
        unsafe { stream_of(&conn).release_raw(msg) };
        cx.put(conn);
        Ok(0)
    }))
}
