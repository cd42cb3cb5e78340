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
//! library opens around its copies of a commit's data into its pool pages
//! (a `PoolWriter`) and closes as soon as they are issued. A stray store by the application,
//! from any thread and at any time, faults (`SIGSEGV`, `SEGV_PKUERR`).
//!
//! Threads that existed before the key was allocated, and signal
//! handlers, start with all access to the key denied (the kernel's default
//! PKRU): every read through a keyed view first makes sure loads are
//! allowed on the calling thread ([`allow_reads`]).

use std::arch::asm;
use std::marker::PhantomData;
use std::sync::OnceLock;

/// The process's protection key for keyed views. Only [`process_key`]
/// makes one, so holding it proves the CPU and kernel have keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key(u32);

impl Key {
    /// The key's number, as `pkey_mprotect` takes it.
    pub fn number(self) -> u32 {
        self.0
    }
}

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
pub fn process_key() -> Option<Key> {
    static KEY: OnceLock<Option<Key>> = OnceLock::new();
    *KEY.get_or_init(|| {
        // SAFETY: pkey_alloc takes two integers and touches no memory of
        // ours. PKEY_DISABLE_WRITE sets this thread's rights for the new
        // key to "loads only".
        let key = unsafe { libc::syscall(libc::SYS_pkey_alloc, 0, PKEY_DISABLE_WRITE) };
        // PKRU holds 16 keys; the kernel never hands out key 0.
        u32::try_from(key)
            .ok()
            .filter(|k| (1..16).contains(k))
            .map(Key)
    })
}

/// This thread's PKRU.
fn rdpkru() -> u32 {
    let eax: u32;
    // SAFETY: RDPKRU reads a register into EAX (and zeroes EDX) with ECX
    // zero; it touches no memory. Every caller holds a `Key`, which only
    // `process_key` makes, and the kernel allocates keys only where
    // CR4.PKE is set (otherwise the instruction would raise #UD).
    unsafe {
        asm!("rdpkru", in("ecx") 0u32, out("eax") eax, out("edx") _,
             options(nomem, nostack, preserves_flags));
    }
    eax
}

/// Sets this thread's PKRU.
///
/// # Safety
///
/// Only with a [`Key`] in hand (PKU enabled). The value must leave key 0
/// (all ordinary memory) accessible.
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

/// Makes sure this thread may load through pages of `key`: a thread
/// denied all access to it gets loads (and still no stores). A register
/// read when it may already, which is nearly always; an open
/// [`WriteWindow`] stays open.
pub fn allow_reads(key: Key) {
    let pkru = rdpkru();
    if pkru & access_denied(key.0) != 0 {
        // SAFETY: a `Key` is never key 0; only its bits change.
        unsafe { wrpkru((pkru & !access_denied(key.0)) | write_denied(key.0)) };
    }
}

/// While it lives, the thread that opened it may store through pages of
/// its key; dropping it denies those stores again (also on unwinding). It
/// cannot leave its thread, whose register it changes.
#[derive(Debug)]
#[must_use = "stores are allowed only while the window lives"]
pub struct WriteWindow {
    key: Key,
    /// Not `Send`: dropped on another thread, it would change that
    /// thread's rights and leave this one's open.
    _thread: PhantomData<*const ()>,
}

impl WriteWindow {
    /// Allows this thread's loads and stores through pages of `key`.
    pub fn open(key: Key) -> WriteWindow {
        let pkru = rdpkru() & !(access_denied(key.0) | write_denied(key.0));
        // SAFETY: a `Key` is never key 0; only its bits change.
        unsafe { wrpkru(pkru) };
        WriteWindow {
            key,
            _thread: PhantomData,
        }
    }
}

impl Drop for WriteWindow {
    fn drop(&mut self) {
        // Only the key's stores are denied again: whatever else changed
        // this thread's rights meanwhile (a nested window of the same key
        // closes the outer one too, so windows are not nested) stays.
        let pkru = (rdpkru() & !access_denied(self.key.0)) | write_denied(self.key.0);
        // SAFETY: a `Key` is never key 0; only its bits change.
        unsafe { wrpkru(pkru) };
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
        let bits = access_denied(key.0) | write_denied(key.0);
        allow_reads(key);
        let before = rdpkru();
        assert_eq!(before & bits, write_denied(key.0));
        {
            let _w = WriteWindow::open(key);
            assert_eq!(rdpkru() & bits, 0);
            // A read inside the window leaves it open.
            allow_reads(key);
            assert_eq!(rdpkru() & bits, 0);
        }
        assert_eq!(rdpkru(), before);
        // A thread whose PKRU denies all access to the key gets loads back,
        // and a window it opens and closes leaves it with loads only.
        std::thread::spawn(move || {
            // SAFETY: only the key's bits change.
            unsafe { wrpkru(rdpkru() | access_denied(key.0)) };
            allow_reads(key);
            assert_eq!(rdpkru() & bits, write_denied(key.0));
            // SAFETY: as above.
            unsafe { wrpkru(rdpkru() | access_denied(key.0)) };
            drop(WriteWindow::open(key));
            assert_eq!(rdpkru() & bits, write_denied(key.0));
        })
        .join()
        .unwrap();
    }
}
