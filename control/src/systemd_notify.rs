//! The systemd notify protocol (`sd_notify(3)`) without libsystemd: one datagram per message to
//! the socket in `NOTIFY_SOCKET` (a path, or an abstract name written with a leading `@`).
//! `READY=1` once the service serves, `STOPPING=1` when it begins to stop, `STATUS=` lines for
//! `systemctl status`, and `WATCHDOG=1` keep-alives when the unit has `WatchdogSec=` (systemd
//! passes `WATCHDOG_USEC`, and `WATCHDOG_PID` when the keep-alives are meant for one process).
//!
//! Without `NOTIFY_SOCKET` (not started by systemd) a [`Notifier`] sends nothing. The variables
//! are removed from the environment when read, so child processes (`openvpn` backends, which
//! speak the same protocol) do not report to the server's unit.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads and removes `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`. Call before any
    /// other thread exists (it changes the environment).
    pub fn from_env() -> Self {
        let socket = std::env::var_os("NOTIFY_SOCKET");
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        for name in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
            std::env::remove_var(name);
        }
        let target = socket.and_then(|s| match connect(&s) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(socket = ?s, error = %e, "NOTIFY_SOCKET is set but unusable: systemd is not told when the service is ready");
                None
            }
        });
        let watchdog = target.as_ref().and(watchdog_interval(
            usec.as_deref(),
            pid.as_deref(),
            std::process::id(),
        ));
        Self { target, watchdog }
    }

    /// `WATCHDOG_USEC`: how long systemd waits for a keep-alive before it kills the service.
    pub fn watchdog_timeout(&self) -> Option<Duration> {
        self.watchdog
    }

    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping");
    }

    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    pub fn watchdog(&self) {
        if self.watchdog.is_some() {
            self.send("WATCHDOG=1");
        }
    }

    fn send(&self, message: &str) {
        let Some((socket, addr)) = &self.target else {
            tracing::debug!(message, "no NOTIFY_SOCKET: not sent");
            return;
        };
        if let Err(e) = socket.send_to_addr(message.as_bytes(), addr) {
            tracing::warn!(error = %e, message, "cannot notify systemd");
        }
    }
}

/// `@name` is an abstract socket; anything else a path.
fn connect(socket: &std::ffi::OsStr) -> std::io::Result<(UnixDatagram, SocketAddr)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = socket.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        None => SocketAddr::from_pathname(socket)?,
    };
    Ok((UnixDatagram::unbound()?, addr))
}

/// The keep-alive deadline systemd set for this process: `WATCHDOG_USEC` when it is a positive
/// number and `WATCHDOG_PID` is unset or names `own_pid`.
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if pid.is_some_and(|p| p.trim().parse::<u32>().ok() != Some(own_pid)) {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// A `STATUS=` value must not break the message into further assignments.
fn one_line(text: &str) -> String {
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_only_for_this_process_and_a_positive_interval() {
        assert_eq!(
            watchdog_interval(Some("2000000"), None, 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            watchdog_interval(Some("500000"), Some("7"), 7),
            Some(Duration::from_millis(500))
        );
        assert_eq!(watchdog_interval(Some("500000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
        assert_eq!(watchdog_interval(None, Some("7"), 7), None);
    }

    fn receive(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn messages_reach_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).expect("bind");
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let n = Notifier {
            target: Some(connect(path.as_os_str()).expect("path")),
            watchdog: Some(Duration::from_secs(1)),
        };
        n.ready("serving\non two cores");
        assert_eq!(receive(&listener), "READY=1\nSTATUS=serving on two cores");
        n.watchdog();
        assert_eq!(receive(&listener), "WATCHDOG=1");
        n.stopping();
        assert_eq!(receive(&listener), "STOPPING=1\nSTATUS=stopping");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("switchyard-notify-test-{}", std::process::id());
        let listener = UnixDatagram::bind_addr(
            &SocketAddr::from_abstract_name(name.as_bytes()).expect("name"),
        )
        .expect("bind abstract");
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let n = Notifier {
            target: Some(connect(std::ffi::OsStr::new(&format!("@{name}"))).expect("abstract")),
            watchdog: None,
        };
        n.watchdog(); // no WatchdogSec: nothing
        n.status("x");
        assert_eq!(receive(&listener), "STATUS=x");
    }
}
