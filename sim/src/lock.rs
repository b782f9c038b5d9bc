//! A poisoned mutex still holds consistent data here (every critical
//! section is a single insert, push or read), so a panicking task must not
//! take the whole run down with it.

use std::sync::Mutex;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
