//! `dprintf(3)` and `vdprintf(3)`, and `_FORTIFY_SOURCE`'s `__dprintf_chk` and
//! `__vdprintf_chk`, on a socket the shim serves. glibc formats into a stream over the
//! descriptor and writes it with its own internal calls, which no interposer sees: on an
//! accelerated connection those bytes would go to the kernel socket, which carries nothing the
//! peer reads. Here the text is formatted by glibc (`vasprintf`, so every conversion and the
//! fortify checks are its own) and written through the shim's `write`, all of it, as glibc's
//! own loop writes a stream's buffer. A descriptor the shim does not serve goes to libc's
//! function unchanged.
//!
//! The variadic `dprintf` and `__dprintf_chk` are wrapped on x86-64 by naked trampolines that
//! build the call's `va_list` as a variadic function's prologue does; elsewhere only the `v`
//! forms are (docs/LIMITS.md).

use crate::api::fdopen::cookie_write;
use crate::api::route::plain;
use crate::base::guard::{errno_loc, set_errno};
use crate::real;
use libc::{c_char, c_int, c_void, size_t, ssize_t};

extern "C" {
    fn vasprintf(out: *mut *mut c_char, fmt: *const c_char, ap: *mut c_void) -> c_int;
    fn __vasprintf_chk(out: *mut *mut c_char, flag: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

/// `vdprintf(3)` (`flag`: `None`), or `__vdprintf_chk` with its fortify level. `ap` is the
/// caller's `va_list` as the ABI passes one to a function (on x86-64 and arm64, the address of
/// its state), handed on to libc's formatter unchanged.
///
/// # Safety
/// The arguments are what libc's `vdprintf` (`__vdprintf_chk`) requires: a NUL-terminated
/// format and a `va_list` whose arguments match it.
unsafe fn print(fd: c_int, flag: Option<c_int>, fmt: *const c_char, ap: *mut c_void) -> c_int {
    if plain(fd) {
        // SAFETY: the application's arguments, as libc's function takes them.
        return unsafe {
            match flag {
                None => real::vdprintf(fd, fmt, ap),
                Some(f) => real::__vdprintf_chk(fd, f, fmt, ap),
            }
        };
    }
    let mut text: *mut c_char = std::ptr::null_mut();
    // SAFETY: the application's format and arguments; `text` receives a malloc'd string.
    let n = unsafe {
        match flag {
            None => vasprintf(&mut text, fmt, ap),
            Some(f) => __vasprintf_chk(&mut text, f, fmt, ap),
        }
    };
    if n < 0 {
        // errno is vasprintf's (ENOMEM, EOVERFLOW), as glibc's dprintf would leave it.
        return -1;
    }
    // Through the shim's `write`, not holding its guard: all `n` bytes, or the first failure.
    // SAFETY: `text` holds `n` bytes; the cookie is the descriptor number.
    let written = unsafe { cookie_write(fd as usize as *mut c_void, text, n as size_t) };
    // SAFETY: this thread's errno slot.
    let e = unsafe { *errno_loc() };
    // SAFETY: `text` was allocated by vasprintf and is not used after.
    unsafe { libc::free(text.cast()) };
    if written != n as ssize_t {
        set_errno(e);
        return -1;
    }
    n
}

/// `vdprintf(3)`.
#[no_mangle]
pub unsafe extern "C" fn vdprintf(fd: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    // SAFETY: the caller's arguments, as `vdprintf(3)` takes them.
    unsafe { print(fd, None, fmt, ap) }
}

/// `__vdprintf_chk`, what `vdprintf` is under `_FORTIFY_SOURCE`.
#[no_mangle]
pub unsafe extern "C" fn __vdprintf_chk(fd: c_int, flag: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    // SAFETY: the caller's arguments, as libc's `__vdprintf_chk` takes them.
    unsafe { print(fd, Some(flag), fmt, ap) }
}

/// What [`dprintf`]'s trampoline calls with the `va_list` it built.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn dprintf_va(fd: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    // SAFETY: the application's arguments, gathered into `ap` by the trampoline.
    unsafe { print(fd, None, fmt, ap) }
}

/// What [`__dprintf_chk`]'s trampoline calls with the `va_list` it built.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn dprintf_chk_va(fd: c_int, flag: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    // SAFETY: the application's arguments, gathered into `ap` by the trampoline.
    unsafe { print(fd, Some(flag), fmt, ap) }
}

/// A variadic export whose first `$named` arguments are integers: it builds the System V
/// x86-64 `va_list` of the rest as a variadic function's prologue does (the six integer and,
/// when `al` says the caller used any, the eight vector argument registers saved in a register
/// save area; the stack arguments past the return address), and calls `$target` with the named
/// arguments still in their registers and the `va_list`'s address in `$ap`.
macro_rules! variadic_print {
    ($name:ident, $gp_offset:literal, $ap:literal, $target:ident) => {
        /// See the module's comment: the variadic arguments as a `va_list`, to [`print`].
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() -> c_int {
            // At entry the stack is 8 bytes off 16-byte alignment (the return address): 216
            // bytes more align it, for the call and for `movaps`. [rsp, rsp+24): the va_list
            // (gp_offset, fp_offset, overflow_arg_area, reg_save_area); [rsp+32, rsp+208): the
            // register save area (rdi..r9 at 0..48, xmm0..xmm7 at 48..176).
            std::arch::naked_asm!(
                "sub rsp, 216",
                "mov [rsp+32], rdi", "mov [rsp+40], rsi", "mov [rsp+48], rdx",
                "mov [rsp+56], rcx", "mov [rsp+64], r8", "mov [rsp+72], r9",
                "test al, al",
                "je 2f",
                "movaps [rsp+80], xmm0", "movaps [rsp+96], xmm1", "movaps [rsp+112], xmm2", "movaps [rsp+128], xmm3",
                "movaps [rsp+144], xmm4", "movaps [rsp+160], xmm5", "movaps [rsp+176], xmm6", "movaps [rsp+192], xmm7",
                "2:",
                concat!("mov dword ptr [rsp], ", $gp_offset),
                "mov dword ptr [rsp+4], 48",
                "lea rax, [rsp+224]",
                "mov [rsp+8], rax",
                "lea rax, [rsp+32]",
                "mov [rsp+16], rax",
                concat!("mov ", $ap, ", rsp"),
                "call {target}",
                "add rsp, 216",
                "ret",
                target = sym $target
            )
        }
    };
}
// dprintf(fd, fmt, ...): two named integer arguments; the va_list third (rdx).
variadic_print!(dprintf, "16", "rdx", dprintf_va);
// __dprintf_chk(fd, flag, fmt, ...): three; the va_list fourth (rcx).
variadic_print!(__dprintf_chk, "24", "rcx", dprintf_chk_va);
