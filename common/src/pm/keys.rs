//! Memory protection keys (x86 PKU): how a client's view of the region can
//! be writable for the library's own copies and read-only for everything
//! else the application does, without a page-table change per commit.
//!
//! A page's protection key is a 4-bit tag in its page-table entry; each
//! thread's PKRU register says, per key, whether loads and stores through
//! pages of that key are allowed. Changing PKRU is one unprivileged
//! instruction (tens of nanoseconds), where `mprotect` costs a system call
//! and a TLB flush on every core the process runs on.
//!
//! The process allocates one key, once, for every view it maps under
//! [`Protection::Keys`](super::Protection::Keys). Each thread's PKRU denies
//! stores through that key, except inside a [`WriteWindow`], which the
//! library opens around its copy of a write's data into its pool pages and
//! closes as soon as the copy is issued. A stray store by the application,
//! from any thread and at any time, faults (`SIGSEGV`, `SEGV_PKUERR`).
//!
//! Threads that existed before the key was allocated, and signal
//! handlers, start with all access to the key denied (the kernel's default
//! PKRU): every read through a keyed view first makes sure loads are
//! allowed on the calling thread ([`allow_reads`]).

use std::arch::asm;
use std::sync::OnceLock;

/// `pkey_alloc`'s access right "no stores" (linux/mman.h).
const PKEY_DISABLE_WRITE: libc::c_long = 2;

/// The PKRU bit that denies all access through pages of `key`.
fn access_denied(key: u32) -> u32 {
    1 << (2 * key)
}

/// The PKRU bit that denies stores through pages of `key`.
fn write_denied(key: u32) -> u32 {
    2 << (2 * key)
}

/// The process's key for keyed views; `None` where the CPU or kernel has
/// no protection keys, or all of them are taken.
pub fn process_key() -> Option<u32> {
    static KEY: OnceLock<Option<u32>> = OnceLock::new();
    *KEY.get_or_init(|| {
        // SAFETY: pkey_alloc takes two integers and touches no memory of
        // ours. PKEY_DISABLE_WRITE sets this thread's rights for the new
        // key to "loads only".
        let key = unsafe { libc::syscall(libc::SYS_pkey_alloc, 0, PKEY_DISABLE_WRITE) };
        // PKRU holds 16 keys; the kernel never hands out key 0.
        (1..16).contains(&key).then_some(key as u32)
    })
}

/// This thread's PKRU.
fn rdpkru() -> u32 {
    let (eax, _edx): (u32, u32);
    // SAFETY: RDPKRU reads a register into EAX (and zeroes EDX) with ECX
    // zero; it touches no memory. It is only reached once `process_key`
    // returned a key, which the kernel allocates only where CR4.PKE is set
    // (otherwise the instruction would raise #UD).
    unsafe {
        asm!("rdpkru", in("ecx") 0u32, out("eax") eax, out("edx") _edx,
             options(nomem, nostack, preserves_flags));
    }
    eax
}

/// Sets this thread's PKRU.
///
/// # Safety
///
/// Only after [`process_key`] returned a key (PKU enabled). The value must
/// leave key 0 (all ordinary memory) accessible.
unsafe fn wrpkru(value: u32) {
    // SAFETY: WRPKRU writes EAX to PKRU with ECX and EDX zero; it is
    // ordered with earlier and later memory accesses, so no load or store
    // moves across it (hence no `nomem`: the compiler must not move them
    // either).
    unsafe {
        asm!("wrpkru", in("eax") value, in("ecx") 0u32, in("edx") 0u32,
             options(nostack, preserves_flags));
    }
}

/// Makes sure this thread may load through pages of `key` (stores stay
/// denied). A register read when it may already, which is nearly always.
pub fn allow_reads(key: u32) {
    let pkru = rdpkru();
    let want = (pkru & !access_denied(key)) | write_denied(key);
    if pkru != want {
        // SAFETY: `key` came from `process_key`; only its bits change.
        unsafe { wrpkru(want) };
    }
}

/// While it lives, this thread may store through pages of the key it was
/// opened for; dropping it denies stores again (also on unwinding).
#[derive(Debug)]
#[must_use = "stores are allowed only while the window lives"]
pub struct WriteWindow {
    closed: u32,
}

impl WriteWindow {
    /// Allows this thread's stores through pages of `key`.
    pub fn open(key: u32) -> WriteWindow {
        let pkru = rdpkru();
        let closed = (pkru & !access_denied(key)) | write_denied(key);
        // SAFETY: `key` came from `process_key`; only its bits change.
        unsafe { wrpkru(closed & !write_denied(key)) };
        WriteWindow { closed }
    }
}

impl Drop for WriteWindow {
    fn drop(&mut self) {
        // SAFETY: the value `open` computed from this thread's PKRU, with
        // stores through the key denied again.
        unsafe { wrpkru(self.closed) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bits_of_a_key_are_its_pair_in_pkru() {
        assert_eq!(access_denied(1), 0b0100);
        assert_eq!(write_denied(1), 0b1000);
        assert_eq!(write_denied(15), 1 << 31);
    }

    #[test]
    fn a_window_allows_stores_and_closing_it_denies_them_again() {
        let Some(key) = process_key() else {
            println!("SKIPPED: this CPU or kernel has no memory protection keys");
            return;
        };
        allow_reads(key);
        let before = rdpkru();
        assert_eq!(
            before & (access_denied(key) | write_denied(key)),
            write_denied(key)
        );
        {
            let _w = WriteWindow::open(key);
            assert_eq!(rdpkru() & (access_denied(key) | write_denied(key)), 0);
        }
        assert_eq!(rdpkru(), before);
        // A thread whose PKRU denies all access to the key gets loads back.
        std::thread::spawn(move || {
            // SAFETY: only the key's bits change.
            unsafe { wrpkru(rdpkru() | access_denied(key)) };
            allow_reads(key);
            assert_eq!(
                rdpkru() & (access_denied(key) | write_denied(key)),
                write_denied(key)
            );
        })
        .join()
        .unwrap();
    }
}
