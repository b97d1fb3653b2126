//! Where the shim's own code lies in memory, to tell its calls through an interposed symbol
//! (its own `close` of a descriptor it made: std's `OwnedFd` closes through libc's symbol,
//! which is the shim's) from the application's.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The shim's loaded segments span `[START, END)` (0 and 0 until [`init`]).
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

/// Whether `addr` (a return address) lies in the shim.
#[inline]
pub fn contains(addr: usize) -> bool {
    addr >= START.load(Relaxed) && addr < END.load(Relaxed)
}

/// Finds the shim among the loaded objects (the one holding this function) and records its
/// span. Called once, from the shim's constructor (`dl_iterate_phdr` takes the loader's lock).
pub fn init() {
    unsafe extern "C" fn look(info: *mut libc::dl_phdr_info, _size: libc::size_t, _: *mut libc::c_void) -> libc::c_int {
        let here = init as *const () as usize;
        // SAFETY: the loader passes a valid `dl_phdr_info` whose `dlpi_phdr` points at
        // `dlpi_phnum` program headers, for the duration of the callback.
        let (base, phdrs) = unsafe {
            let i = &*info;
            (i.dlpi_addr as usize, std::slice::from_raw_parts(i.dlpi_phdr, usize::from(i.dlpi_phnum)))
        };
        let loads = phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
        let lo = loads.clone().map(|p| base + p.p_vaddr as usize).min();
        let hi = loads.map(|p| base + (p.p_vaddr + p.p_memsz) as usize).max();
        match (lo, hi) {
            (Some(lo), Some(hi)) if (lo..hi).contains(&here) => {
                START.store(lo, Relaxed);
                END.store(hi, Relaxed);
                1
            }
            _ => 0,
        }
    }
    // SAFETY: `look` only reads what the loader passes it, for the duration of each call.
    unsafe { libc::dl_iterate_phdr(Some(look), std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_code_is_the_shims_and_libcs_is_not() {
        super::init();
        assert!(super::contains(super::init as *const () as usize));
        assert!(!super::contains(libc::getpid as *const () as usize));
        assert!(!super::contains(0));
    }
}
