//! The crate's one way to take a lock: poisoning is recovered from, never propagated.
//!
//! Owns [`lock`], [`read`] and [`write()`], what every `Mutex` and `RwLock` in
//! the crate is taken with. A lock is poisoned when a thread panicked while holding it; every
//! lock here guards data that stays whole through such a panic (a queue, a slot, a cache,
//! counters: nothing is left half written), so the next holder takes it as it is. Propagating
//! the poison instead would turn one panicked thread into a panic on the relay or a refused
//! batch, which a sensor that must never stop the wrapped server and an ingest that must keep
//! serving cannot afford. Must never guard data whose invariants a panic midway could break:
//! such data needs its own recovery.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `m.lock()`, taking the data as it is if another holder panicked.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `l.read()`, taking the data as it is if a writer panicked.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// `l.write()`, taking the data as it is if a writer panicked.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let l = std::sync::Arc::new(RwLock::new(2));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            let _w = l2.write();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        lock(&m).push(3);
        assert_eq!(*lock(&m), vec![1, 3]);
        *write(&l) += 1;
        assert_eq!(*read(&l), 3);
    }
}
