//! The service's own threads: named, so that `top -H` and `ps -L` tell
//! intake from routing, and routing's run at a lower CPU priority.
//!
//! A sender waits for intake; a lead waiting to be sold waits for no one
//! (see `actors::yielding`). The yield keeps routing's database work from
//! intake's commits; the priority keeps routing's CPU work from intake's
//! handlers: when both want the CPU, the kernel runs the HTTP workers and
//! the intake thread first, and routing takes what they leave. Routing
//! never stops: a lower priority is a smaller share under contention, not
//! none.
//!
//! On Linux names and nice values belong to each thread. Elsewhere a nice
//! value would lower the whole process, intake included, so there this
//! does nothing.

/// Nice value added to a routing thread: at +10 the kernel gives it about a
/// tenth of the CPU share of a thread at the process's own priority when
/// both are runnable.
#[cfg(target_os = "linux")]
const ROUTING_NICE: libc::c_int = 10;

/// Names the calling thread intake's (`lr-intake`): intake and the spool
/// drainer.
pub fn become_intake() {
    name_this_thread(c"lr-intake");
}

/// Names the calling thread routing's (`lr-routing`: the router, buyers and
/// walks) and lowers its priority.
pub fn become_routing() {
    name_this_thread(c"lr-routing");
    lower_this_thread();
}

/// Names the calling thread the attempt writer's (`lr-attempts`: routing's
/// writes) and lowers its priority.
pub fn become_attempt_writer() {
    name_this_thread(c"lr-attempts");
    lower_this_thread();
}

/// Lowers the calling thread's priority. Threads it starts later (a SQLite
/// connection's worker) inherit it.
fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: errno is this thread's; nice(2) changes only the calling
        // thread's scheduling priority on Linux.
        let lowered = unsafe {
            *libc::__errno_location() = 0;
            libc::nice(ROUTING_NICE)
        };
        let error = std::io::Error::last_os_error();
        if lowered == -1 && error.raw_os_error() != Some(0) {
            tracing::warn!(%error, "routing runs at intake's CPU priority");
        }
    }
}

/// At most 15 bytes: the kernel keeps no more.
fn name_this_thread(name: &std::ffi::CStr) {
    #[cfg(target_os = "linux")]
    // SAFETY: `name` is NUL-terminated; PR_SET_NAME names the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
    }
    #[cfg(not(target_os = "linux"))]
    let _ = name;
}
