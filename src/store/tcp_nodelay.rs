//! `TCP_NODELAY` on our PostgreSQL connections.
//!
//! sqlx opens its PostgreSQL sockets without `TCP_NODELAY` and writes a
//! large message in several writes, so the last part of a statement bigger
//! than its write buffer waits for the server's delayed ACK (about 40 ms:
//! a 63-lead INSERT took 45 ms). sqlx gives no handle on the socket, so
//! once a connection is made this finds our process's TCP sockets whose
//! peer is the database port and sets the option on them (setting it twice
//! is harmless). With it, intake writes a batch in a few large statements
//! instead of many small ones.

use std::os::fd::RawFd;

/// Sets `TCP_NODELAY` on every TCP socket of this process connected to
/// `port` (a connection the pool just opened among them).
pub(super) fn set_on_connections_to(port: u16) {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in entries.flatten() {
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let fd = entry.file_name().to_string_lossy().parse::<RawFd>();
        if let (true, Ok(fd)) = (is_socket, fd) {
            if peer_port(fd) == Some(port) {
                set_nodelay(fd);
            }
        }
    }
}

/// The peer's port of a connected IPv4 or IPv6 socket.
fn peer_port(fd: RawFd) -> Option<u16> {
    // SAFETY: `address` is a zeroed sockaddr_storage, large enough for any
    // address, and `length` holds its size, as getpeername requires; a
    // descriptor that is not a connected socket makes the call fail.
    let mut address: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let answered = unsafe {
        libc::getpeername(
            fd,
            (&mut address as *mut libc::sockaddr_storage).cast(),
            &mut length,
        )
    };
    if answered != 0 {
        return None;
    }
    // SAFETY: the family says which sockaddr the storage holds.
    let port = match address.ss_family as libc::c_int {
        libc::AF_INET => unsafe {
            (*(&address as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()).sin_port
        },
        libc::AF_INET6 => unsafe {
            (*(&address as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()).sin6_port
        },
        _ => return None,
    };
    Some(u16::from_be(port))
}

fn set_nodelay(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a c_int that outlives the call, and its size is given.
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result != 0 {
        tracing::debug!(fd, "could not set TCP_NODELAY on a database connection");
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::set_on_connections_to;

    #[test]
    fn sockets_to_the_port_get_nodelay_and_others_keep_their_setting() {
        let database = TcpListener::bind("127.0.0.1:0").unwrap();
        let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
        let to_database = TcpStream::connect(database.local_addr().unwrap()).unwrap();
        let to_elsewhere = TcpStream::connect(elsewhere.local_addr().unwrap()).unwrap();
        assert!(!to_database.nodelay().unwrap(), "sockets start without it");

        set_on_connections_to(database.local_addr().unwrap().port());

        assert!(to_database.nodelay().unwrap());
        assert!(!to_elsewhere.nodelay().unwrap());
    }
}
