//! The lines of OpenVPN's management interface that the supervisor reads: the connection state
//! (`>STATE:` notifications after `state on`, and the answer to `state`) and the byte counts
//! (`>BYTECOUNT:` after `bytecount N`). Runtime-free.

use std::net::Ipv4Addr;

/// The commands sent once connected: state notifications on, byte counts every 5 s, and the
/// current state (the process may have connected before we attached).
pub const HELLO: &str = "state on\nbytecount 5\nstate\n";

/// Asks the process to exit cleanly (it removes its device).
pub const TERMINATE: &str = "signal SIGTERM\n";

/// One message the supervisor acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `CONNECTING`, `WAIT`, `AUTH`, `GET_CONFIG`, `ASSIGN_IP`, `ADD_ROUTES`, `CONNECTED`,
    /// `RECONNECTING`, `EXITING`, `RESOLVE`, `TCP_CONNECT`, `AUTH_PENDING`, … and the tunnel's
    /// IPv4 address once assigned.
    State {
        name: String,
        detail: String,
        local_ipv4: Option<Ipv4Addr>,
    },
    /// Bytes received from / sent to the server since the process started.
    Bytecount { received: u64, sent: u64 },
}

/// Parses one line; `None` for lines the supervisor ignores (`>LOG`, `SUCCESS:`, `END`, …).
pub fn parse(line: &str) -> Option<Message> {
    let line = line.trim_end_matches(['\r', '\n']);
    if let Some(rest) = line.strip_prefix(">STATE:") {
        return parse_state(rest);
    }
    if let Some(rest) = line.strip_prefix(">BYTECOUNT:") {
        let (received, sent) = rest.split_once(',')?;
        return Some(Message::Bytecount {
            received: received.trim().parse().ok()?,
            sent: sent.trim().parse().ok()?,
        });
    }
    // The answer to `state`: the same fields without the prefix, starting with a timestamp.
    if line.starts_with(|c: char| c.is_ascii_digit()) {
        return parse_state(line);
    }
    None
}

/// `time,STATE,detail,local_ip,remote_ip,remote_port,local_addr,local_port,local_ipv6`
fn parse_state(fields: &str) -> Option<Message> {
    let mut it = fields.split(',');
    it.next()?.parse::<u64>().ok()?;
    let name = it.next()?.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return None;
    }
    let detail = it.next().unwrap_or_default().to_owned();
    let local_ipv4 = it.next().and_then(|ip| ip.trim().parse().ok());
    Some(Message::State {
        name: name.to_owned(),
        detail,
        local_ipv4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_counts() {
        let connected = parse(">STATE:1700000000,CONNECTED,SUCCESS,10.8.0.2,192.0.2.1,1194,,\r\n")
            .expect("state");
        assert_eq!(
            connected,
            Message::State {
                name: "CONNECTED".into(),
                detail: "SUCCESS".into(),
                local_ipv4: Some(Ipv4Addr::new(10, 8, 0, 2)),
            }
        );
        let answer = parse("1700000001,RECONNECTING,ping-restart,,,,,").expect("answer");
        assert!(
            matches!(answer, Message::State { ref name, local_ipv4: None, .. } if name == "RECONNECTING")
        );
        assert_eq!(
            parse(">BYTECOUNT:1234,5678"),
            Some(Message::Bytecount {
                received: 1234,
                sent: 5678
            })
        );
        assert!(
            matches!(parse(">STATE:1,EXITING,SIGTERM,,,,,"), Some(Message::State { ref name, .. }) if name == "EXITING")
        );
    }

    #[test]
    fn other_lines_are_ignored() {
        for line in [
            ">INFO:OpenVPN Management Interface Version 5 -- type 'help' for more info",
            "SUCCESS: real-time state notification set to ON",
            "END",
            ">LOG:1700000000,I,Initialization Sequence Completed",
            ">BYTECOUNT:x,1",
            ">STATE:notatime,CONNECTED",
            "",
            "12abc",
        ] {
            assert_eq!(parse(line), None, "{line}");
        }
    }
}
