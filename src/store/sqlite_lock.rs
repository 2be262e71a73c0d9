//! Waiting for SQLite's one write lock in short steps.
//!
//! SQLite's own busy handler (what `busy_timeout` installs) sleeps 1, 2, 5,
//! 10, … and then 100 ms between tries, so a write that finds the lock held
//! (by routing's writes, or another pool's connection) may sleep a tenth of a
//! second after the lock is free again: with routing busy, intake's p99 grew
//! to several hundred milliseconds. The handler installed here tries again
//! every quarter of a millisecond until the same timeout runs out.

use std::os::raw::{c_int, c_void};
use std::time::Duration;

use sea_orm::sqlx::sqlite::SqliteConnection;

/// Time between two tries at the lock.
const STEP: Duration = Duration::from_micros(250);

/// Replaces the connection's busy handler: give up after `timeout`.
pub(super) async fn wait_in_short_steps(
    connection: &mut SqliteConnection,
    timeout: Duration,
) -> Result<(), sea_orm::sqlx::Error> {
    let tries = (timeout.as_micros() / STEP.as_micros()).max(1) as usize;
    let mut handle = connection.lock_handle().await?;
    // SAFETY: the handle is the connection's open database, locked for this
    // call; the callback keeps no state and reads its argument as the
    // number it is (`tries`), never as a pointer.
    let code = unsafe {
        libsqlite3_sys::sqlite3_busy_handler(
            handle.as_raw_handle().as_ptr(),
            Some(try_again),
            tries as *mut c_void,
        )
    };
    if code == libsqlite3_sys::SQLITE_OK {
        Ok(())
    } else {
        Err(sea_orm::sqlx::Error::Protocol(format!(
            "sqlite3_busy_handler failed with code {code}"
        )))
    }
}

/// SQLite's busy callback: `count` tries have failed so far.
extern "C" fn try_again(tries: *mut c_void, count: c_int) -> c_int {
    if usize::try_from(count).unwrap_or(usize::MAX) >= tries as usize {
        return 0;
    }
    std::thread::sleep(STEP);
    1
}
