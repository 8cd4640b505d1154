//! The cookie of a network namespace, as `bpf_get_netns_cookie()` reports it to the programs: read
//! with `getsockopt(SO_NETNS_COOKIE)` (Linux 5.14) on a socket created in that namespace.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::Error;

/// `SO_NETNS_COOKIE` of `<asm-generic/socket.h>` (the same on every architecture the build knows,
/// see build.rs; libc has it only under its newer uapi tree).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The netns cookie of the socket `fd`.
fn socket_netns_cookie(fd: &impl AsRawFd) -> std::io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of the sizes given, and the kernel writes at
    // most `len` bytes; the descriptor is open for the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The cookie of this thread's network namespace.
fn current_netns_cookie() -> Result<u64, Error> {
    // any socket carries its namespace; an unbound unix socket needs no interface
    let sock = std::os::unix::net::UnixDatagram::unbound()
        .map_err(|e| Error::Io("create a socket".into(), e))?;
    socket_netns_cookie(&sock).map_err(|e| Error::Io("getsockopt SO_NETNS_COOKIE".into(), e))
}

/// Enters the network namespace of the nsfs file `path` (`/run/netns/NAME`) on this thread only.
fn enter_netns(path: &Path) -> Result<(), Error> {
    let file =
        std::fs::File::open(path).map_err(|e| Error::Io(format!("open {}", path.display()), e))?;
    // SAFETY: plain syscall on an open descriptor; CLONE_NEWNET changes only the calling thread's
    // namespace (allowed in a multi-threaded process), and that thread ends right after.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(Error::Io(
            format!("setns {}", path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The netns cookie of the namespace `netns` (an nsfs file such as `/run/netns/NAME`), or of the
/// caller's own namespace with `None`. Never 0 on success.
pub fn netns_cookie(netns: Option<&Path>) -> Result<u64, Error> {
    let cookie = match netns {
        None => current_netns_cookie()?,
        Some(path) => {
            let path: PathBuf = path.to_path_buf();
            // a short-lived thread enters the namespace, so the caller's threads stay where they are
            std::thread::spawn(move || {
                enter_netns(&path)?;
                current_netns_cookie()
            })
            .join()
            .map_err(|_| {
                Error::Io(
                    "reading a netns cookie".into(),
                    std::io::Error::other("the thread panicked"),
                )
            })??
        }
    };
    if cookie == 0 {
        return Err(Error::Io(
            "getsockopt SO_NETNS_COOKIE".into(),
            std::io::Error::other("the kernel reported cookie 0"),
        ));
    }
    Ok(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_has_one_stable_cookie() {
        let a = netns_cookie(None).expect("cookie");
        assert_ne!(a, 0);
        assert_eq!(netns_cookie(None).expect("cookie"), a);
        // the same namespace entered through its nsfs file gives the same cookie
        assert_eq!(
            netns_cookie(Some(Path::new("/proc/self/ns/net"))).expect("cookie via setns"),
            a
        );
    }
}
