//! Which OpenVPN options a backend may use: an allow-list, as one table ([`OPTIONS`]).
//!
//! `openvpn` runs as root, so an option that names a file (`status`, `replay-persist`,
//! `tls-export-cert`, `askpass`, `http-proxy … authfile`), runs a program or loads code (`up`,
//! `plugin`) or moves management or logging elsewhere would let whoever edits a backend read or
//! write any file on the machine. Only the options of the table marked allowed pass: the
//! `extra` lines of the settings ([`check_extra_line`], at validation) and every line of a
//! `config_file` ([`check_config_text`], when the process is started: the file is read, checked
//! and its checked text is what `openvpn` gets).

/// Where an option may appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// In `extra` and in a `config_file`: tunnel tuning without files or programs.
    Anywhere,
    /// Only in a `config_file` (an `.ovpn` file as a provider hands it out): the connection
    /// settings that inline settings give through their own keys, file names of keys and
    /// certificates, or options the command line overrides.
    ConfigFile,
    /// Only in a `config_file` and without an argument (`auth-user-pass`: the credentials come
    /// from `username`/`password`; a file argument would send that file's lines to the server).
    ConfigFileBare,
    /// Never.
    Refused,
}

/// One row of the allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionRule {
    /// The option name as written in a configuration file (no `--`).
    pub name: &'static str,
    pub allowed: Allowed,
    /// Why it is allowed or refused (the refusal message quotes it).
    pub why: &'static str,
}

const fn rule(name: &'static str, allowed: Allowed, why: &'static str) -> OptionRule {
    OptionRule { name, allowed, why }
}

use Allowed::{Anywhere, ConfigFile, ConfigFileBare, Refused};

const TUNING: &str = "tunes the tunnel; names no file and runs nothing";
const CRYPTO: &str = "chooses ciphers or TLS parameters";
const VERIFY: &str = "verifies the server";
const KEEPALIVE: &str = "keeps the connection alive or reconnects it";
const CONNECTION: &str = "connection setting of a client";
const NO_ROUTES: &str = "has no effect: switchyard applies no pushed routes (--route-noexec)";
const KEY_FILE: &str =
    "names a key or certificate file: in a config_file only (inline settings have their own key)";
const DEVICE: &str = "the command line sets the device (a config_file's value is overridden)";
const PROGRAM: &str = "runs a program or loads code as root";
const FILE_WRITE: &str = "writes a file as root";
const FILE_READ: &str = "reads a file as root and sends or uses its content";
const MANAGED: &str = "switchyard sets it itself";

/// The allow-list. An option not in it is refused as unknown.
pub const OPTIONS: &[OptionRule] = &[
    // Logging to the process's output (switchyard forwards it to its log).
    rule("verb", Anywhere, "log verbosity of the process output"),
    rule("mute", Anywhere, "log verbosity of the process output"),
    rule("mute-replay-warnings", Anywhere, "log verbosity of the process output"),
    // Ciphers, digests, TLS.
    rule("cipher", Anywhere, CRYPTO),
    rule("data-ciphers", Anywhere, CRYPTO),
    rule("data-ciphers-fallback", Anywhere, CRYPTO),
    rule("ncp-ciphers", Anywhere, CRYPTO),
    rule("ncp-disable", Anywhere, CRYPTO),
    rule("auth", Anywhere, CRYPTO),
    rule("tls-cipher", Anywhere, CRYPTO),
    rule("tls-ciphersuites", Anywhere, CRYPTO),
    rule("tls-groups", Anywhere, CRYPTO),
    rule("ecdh-curve", Anywhere, CRYPTO),
    rule("tls-version-min", Anywhere, CRYPTO),
    rule("tls-version-max", Anywhere, CRYPTO),
    rule("tls-timeout", Anywhere, CRYPTO),
    rule("hand-window", Anywhere, CRYPTO),
    rule("tran-window", Anywhere, CRYPTO),
    rule("reneg-sec", Anywhere, CRYPTO),
    rule("reneg-bytes", Anywhere, CRYPTO),
    rule("reneg-pkts", Anywhere, CRYPTO),
    rule("key-direction", Anywhere, CRYPTO),
    rule("replay-window", Anywhere, CRYPTO),
    rule("no-replay", Anywhere, CRYPTO),
    rule("auth-nocache", Anywhere, CRYPTO),
    rule("auth-retry", Anywhere, CRYPTO),
    // Compression.
    rule("comp-lzo", Anywhere, TUNING),
    rule("compress", Anywhere, TUNING),
    rule("allow-compression", Anywhere, TUNING),
    // MTU, buffers, socket.
    rule("tun-mtu", Anywhere, TUNING),
    rule("tun-mtu-extra", Anywhere, TUNING),
    rule("link-mtu", Anywhere, TUNING),
    rule("mssfix", Anywhere, TUNING),
    rule("fragment", Anywhere, TUNING),
    rule("mtu-disc", Anywhere, TUNING),
    rule("sndbuf", Anywhere, TUNING),
    rule("rcvbuf", Anywhere, TUNING),
    rule("fast-io", Anywhere, TUNING),
    rule("txqueuelen", Anywhere, TUNING),
    rule("tcp-nodelay", Anywhere, TUNING),
    rule("tun-ipv6", Anywhere, TUNING),
    rule("disable-occ", Anywhere, TUNING),
    rule("push-peer-info", Anywhere, TUNING),
    // Server verification.
    rule("remote-cert-tls", Anywhere, VERIFY),
    rule("remote-cert-ku", Anywhere, VERIFY),
    rule("remote-cert-eku", Anywhere, VERIFY),
    rule("verify-x509-name", Anywhere, VERIFY),
    rule("ns-cert-type", Anywhere, VERIFY),
    // Keepalive and reconnects.
    rule("keepalive", Anywhere, KEEPALIVE),
    rule("ping", Anywhere, KEEPALIVE),
    rule("ping-restart", Anywhere, KEEPALIVE),
    rule("ping-exit", Anywhere, KEEPALIVE),
    rule("ping-timer-rem", Anywhere, KEEPALIVE),
    rule("inactive", Anywhere, KEEPALIVE),
    rule("persist-key", Anywhere, KEEPALIVE),
    rule("persist-tun", Anywhere, KEEPALIVE),
    rule("persist-remote-ip", Anywhere, KEEPALIVE),
    rule("persist-local-ip", Anywhere, KEEPALIVE),
    rule("resolv-retry", Anywhere, KEEPALIVE),
    rule("connect-retry", Anywhere, KEEPALIVE),
    rule("connect-retry-max", Anywhere, KEEPALIVE),
    rule("connect-timeout", Anywhere, KEEPALIVE),
    rule("server-poll-timeout", Anywhere, KEEPALIVE),
    rule("explicit-exit-notify", Anywhere, KEEPALIVE),
    // The connection itself.
    rule("client", Anywhere, CONNECTION),
    rule("tls-client", Anywhere, CONNECTION),
    rule("pull", Anywhere, CONNECTION),
    rule("nobind", Anywhere, CONNECTION),
    rule("float", Anywhere, CONNECTION),
    rule("remote", Anywhere, CONNECTION),
    rule("remote-random", Anywhere, CONNECTION),
    rule("remote-random-hostname", Anywhere, CONNECTION),
    rule("proto", Anywhere, CONNECTION),
    rule("port", Anywhere, CONNECTION),
    rule("rport", Anywhere, CONNECTION),
    rule("pull-filter", Anywhere, CONNECTION),
    rule("route-nopull", Anywhere, CONNECTION),
    // Pushed or configured routing: never applied.
    rule("redirect-gateway", Anywhere, NO_ROUTES),
    rule("route", Anywhere, NO_ROUTES),
    rule("route-ipv6", Anywhere, NO_ROUTES),
    rule("route-metric", Anywhere, NO_ROUTES),
    rule("route-delay", Anywhere, NO_ROUTES),
    rule("dhcp-option", Anywhere, NO_ROUTES),
    rule("block-outside-dns", Anywhere, NO_ROUTES),
    // Keys and certificates as files (or inline blocks) of a config_file.
    rule("ca", ConfigFile, KEY_FILE),
    rule("cert", ConfigFile, KEY_FILE),
    rule("key", ConfigFile, KEY_FILE),
    rule("tls-auth", ConfigFile, KEY_FILE),
    rule("tls-crypt", ConfigFile, KEY_FILE),
    rule("tls-crypt-v2", ConfigFile, KEY_FILE),
    rule("crl-verify", ConfigFile, KEY_FILE),
    rule("extra-certs", ConfigFile, KEY_FILE),
    rule("pkcs12", ConfigFile, KEY_FILE),
    rule("peer-fingerprint", ConfigFile, KEY_FILE),
    rule("dev", ConfigFile, DEVICE),
    rule("dev-type", ConfigFile, DEVICE),
    rule(
        "auth-user-pass",
        ConfigFileBare,
        "switchyard writes the credentials of `username`/`password`; a file argument would send that file to the server",
    ),
    // Refused with a reason (every other option is refused as unknown).
    rule("up", Refused, PROGRAM),
    rule("down", Refused, PROGRAM),
    rule("down-pre", Refused, PROGRAM),
    rule("up-delay", Refused, PROGRAM),
    rule("up-restart", Refused, PROGRAM),
    rule("route-up", Refused, PROGRAM),
    rule("route-pre-down", Refused, PROGRAM),
    rule("ipchange", Refused, PROGRAM),
    rule("tls-verify", Refused, PROGRAM),
    rule("auth-user-pass-verify", Refused, PROGRAM),
    rule("client-connect", Refused, PROGRAM),
    rule("client-disconnect", Refused, PROGRAM),
    rule("learn-address", Refused, PROGRAM),
    rule("plugin", Refused, PROGRAM),
    rule("iproute", Refused, PROGRAM),
    rule("script-security", Refused, PROGRAM),
    rule(
        "setenv",
        Refused,
        "`setenv opt` applies the option after it unchecked; variables only reach scripts, which switchyard does not run",
    ),
    rule("setenv-safe", Refused, "variables only reach scripts, which switchyard does not run"),
    rule("config", Refused, "includes another file, unchecked"),
    rule("status", Refused, FILE_WRITE),
    rule("replay-persist", Refused, FILE_WRITE),
    rule("tls-export-cert", Refused, FILE_WRITE),
    rule("writepid", Refused, FILE_WRITE),
    rule("log", Refused, FILE_WRITE),
    rule("log-append", Refused, FILE_WRITE),
    rule("tmp-dir", Refused, FILE_WRITE),
    rule("askpass", Refused, FILE_READ),
    rule("http-proxy", Refused, FILE_READ),
    rule("http-proxy-user-pass", Refused, FILE_READ),
    rule("socks-proxy", Refused, FILE_READ),
    rule("secret", Refused, FILE_READ),
    rule("dev-node", Refused, "opens a device file as root"),
    rule("cd", Refused, MANAGED),
    rule("chroot", Refused, MANAGED),
    rule("daemon", Refused, MANAGED),
    rule("syslog", Refused, MANAGED),
    rule("user", Refused, MANAGED),
    rule("group", Refused, MANAGED),
    rule("management", Refused, MANAGED),
    rule("route-noexec", Refused, MANAGED),
    rule("ifconfig-noexec", Refused, MANAGED),
];

/// The row of `name` (exact, lower case as OpenVPN spells options).
pub fn rule_of(name: &str) -> Option<&'static OptionRule> {
    OPTIONS.iter().find(|r| r.name == name)
}

/// Why `name` may not appear where `in_file` says (a `config_file` or an `extra` line);
/// `None` when it may. `bare` tells whether the line has no argument.
fn refusal(name: &str, in_file: bool, bare: bool) -> Option<String> {
    let shown = shown_name(name);
    let Some(r) = rule_of(name) else {
        if name.starts_with("management") {
            return Some(format!("`{shown}` is not allowed: {MANAGED}"));
        }
        return Some(format!(
            "`{shown}` is not on the list of options known to be safe for a client tunnel"
        ));
    };
    let ok = match r.allowed {
        Anywhere => true,
        ConfigFile => in_file,
        ConfigFileBare => in_file && bare,
        Refused => false,
    };
    if ok {
        return None;
    }
    let why = match (r.allowed, in_file) {
        (ConfigFileBare, true) => format!("only without an argument: {}", r.why),
        _ => r.why.to_owned(),
    };
    Some(format!("`{shown}` is not allowed: {why}"))
}

/// The option name for a message: only when it looks like one, so that a file that is not an
/// OpenVPN configuration at all does not have its first words copied into the log.
fn shown_name(name: &str) -> &str {
    let plausible = !name.is_empty()
        && name.len() <= 40
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if plausible {
        name
    } else {
        "(not an option name)"
    }
}

/// The option name of a line: its first word without OpenVPN's optional `--` prefix.
pub fn directive_of(line: &str) -> &str {
    let first = line.split_whitespace().next().unwrap_or_default();
    first.strip_prefix("--").unwrap_or(first)
}

/// Checks one `extra` line; the message says why it is refused.
pub fn check_extra_line(line: &str) -> Result<(), String> {
    if line.contains(['\n', '\r']) {
        return Err("one directive per entry".into());
    }
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return Err("empty directive".into());
    }
    if trimmed.starts_with('#') || trimmed.starts_with(';') {
        return Ok(());
    }
    let name = directive_of(trimmed);
    if name.starts_with('<') {
        return Err(format!(
            "inline blocks (`{}`) are not allowed; use the PEM fields",
            shown_name(name.trim_matches(['<', '>', '/']))
        ));
    }
    let bare = trimmed.split_whitespace().nth(1).is_none();
    match refusal(name, false, bare) {
        Some(message) => Err(message),
        None => Ok(()),
    }
}

/// A refused line of a `config_file`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct FileOptionError {
    /// 1-based line number.
    pub line: usize,
    pub message: String,
}

/// Inline blocks a `config_file` may hold: key and certificate material (its content is not
/// read as options) and `<connection>` (its lines are options, checked the same way).
const INLINE_BLOCKS: [&str; 10] = [
    "ca",
    "cert",
    "key",
    "tls-auth",
    "tls-crypt",
    "tls-crypt-v2",
    "crl-verify",
    "extra-certs",
    "pkcs12",
    "peer-fingerprint",
];

/// Checks every line of a `config_file`'s text: each option must be allowed in a file, inline
/// blocks must be key material or `<connection>` and be closed. The first refused line is the
/// error.
pub fn check_config_text(text: &str) -> Result<(), FileOptionError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let fail = |line: usize, message: String| Err(FileOptionError { line, message });
    // The inline block being skipped (key material) and where it started.
    let mut skipping: Option<(&str, usize)> = None;
    let mut in_connection: Option<usize> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.trim();
        if let Some((tag, _)) = skipping {
            if line.strip_prefix("</").and_then(|l| l.strip_suffix('>')) == Some(tag) {
                skipping = None;
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(tag) = line.strip_prefix("</").and_then(|l| l.strip_suffix('>')) {
            if tag == "connection" && in_connection.is_some() {
                in_connection = None;
                continue;
            }
            return fail(number, "a closing tag without its block".into());
        }
        if let Some(tag) = line.strip_prefix('<').and_then(|l| l.strip_suffix('>')) {
            if tag == "connection" && in_connection.is_none() {
                in_connection = Some(number);
            } else if let Some(block) = INLINE_BLOCKS.iter().find(|b| **b == tag) {
                skipping = Some((block, number));
            } else {
                return fail(
                    number,
                    format!(
                        "inline block `<{}>` is not allowed (only key material and <connection>)",
                        shown_name(tag)
                    ),
                );
            }
            continue;
        }
        let name = directive_of(line);
        let bare = line.split_whitespace().nth(1).is_none();
        if let Some(message) = refusal(name, true, bare) {
            return fail(number, message);
        }
    }
    if let Some((tag, start)) = skipping {
        return fail(start, format!("inline block `<{tag}>` is not closed"));
    }
    if let Some(start) = in_connection {
        return fail(start, "inline block `<connection>` is not closed".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_listed_once_in_lower_case() {
        let mut names: Vec<&str> = OPTIONS.iter().map(|r| r.name).collect();
        assert!(names.iter().all(|n| *n == n.to_ascii_lowercase()));
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name is listed twice");
    }

    #[test]
    fn extra_lines_pass_only_options_allowed_anywhere() {
        for ok in [
            "verb 4",
            "--mssfix 1400",
            "remote-cert-tls server",
            "verify-x509-name vpn.example name",
            "tls-version-min 1.2",
            "comp-lzo no",
            "keepalive 10 60",
            "# a comment",
            "; another",
        ] {
            assert_eq!(check_extra_line(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("status /etc/cron.d/x", "writes a file"),
            ("replay-persist /root/.bashrc", "writes a file"),
            ("tls-export-cert /etc", "writes a file"),
            ("askpass /etc/shadow", "reads a file"),
            (
                "http-proxy 127.0.0.1 3128 /etc/shadow basic",
                "reads a file",
            ),
            ("up /bin/sh", "runs a program"),
            ("--plugin /x.so", "loads code"),
            ("script-security 2", "runs a program"),
            ("management 127.0.0.1 7505", "sets it itself"),
            ("management-hold", "sets it itself"),
            ("ca /etc/ca.pem", "in a config_file only"),
            ("auth-user-pass /etc/shadow", "send that file"),
            ("dev tun0", "sets the device"),
            ("echo hello", "not on the list"),
            ("\"up\" /bin/sh", "not on the list"),
            ("UP /bin/sh", "not on the list"),
            ("<ca>", "inline blocks"),
            ("", "empty"),
            ("verb 3\nup /bin/sh", "one directive"),
        ] {
            let e = check_extra_line(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_provider_style_file_passes() {
        let text = "\u{feff}client\ndev tun\nproto udp\nremote 10.0.0.1 1194\nresolv-retry infinite\n\
            nobind\npersist-key\npersist-tun\nremote-cert-tls server\nauth-user-pass\ncipher AES-256-GCM\n\
            auth SHA512\ncomp-lzo no\nverb 3\nkey-direction 1\n<ca>\n-----BEGIN CERTIFICATE-----\n\
            up /bin/sh\n-----END CERTIFICATE-----\n</ca>\n<connection>\nremote 10.0.0.2 443 tcp\n</connection>\n\
            cert client.crt\nkey client.key\npeer-fingerprint AB:CD\n";
        assert_eq!(check_config_text(text), Ok(()));
    }

    #[test]
    fn a_file_is_refused_at_the_first_bad_line_with_its_number() {
        let cases = [
            ("client\nverb 3\nplugin /x.so\n", 3, "plugin"),
            ("client\n  up /bin/sh\n", 2, "runs a program"),
            ("script-security 2\n", 1, "script-security"),
            (
                "auth-user-pass /etc/shadow\n",
                1,
                "only without an argument",
            ),
            ("config other.ovpn\n", 1, "includes another file"),
            (
                "<connection>\nhttp-proxy p 80 /etc/shadow\n</connection>\n",
                2,
                "http-proxy",
            ),
            ("<ca>\n-----BEGIN\n", 1, "not closed"),
            ("<connection>\nremote h\n", 1, "not closed"),
            (
                "<http-proxy-user-pass>\nu\np\n</http-proxy-user-pass>\n",
                1,
                "inline block",
            ),
            ("</ca>\n", 1, "closing tag"),
            (
                "client\nroot:$6$secret:19000:0:99999:7:::\n",
                2,
                "(not an option name)",
            ),
        ];
        for (text, line, says) in cases {
            let e = check_config_text(text).expect_err(text);
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(e.message.contains(says), "{text}: {e}");
            assert!(!e.message.contains("$6$"), "{e}");
        }
    }
}
