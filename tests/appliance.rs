//! The appliance end to end: `appliance-image/build.sh` builds a bootable disk image carrying the
//! real binary, qemu (TCG) boots it from its MBR through extlinux, systemd starts the first-boot
//! unit (which prints the API token on the console) and `switchyard server`; a request is proxied
//! through a forwarded port to an nginx on the host's loopback (qemu's user network forwards the
//! guest's 10.0.2.100:80 there, and `restrict=on` lets the guest reach nothing else); the API's
//! health is read with the token; Ctrl-Alt-Del over QMP powers the guest off cleanly. Then
//! `appliance-image/upgrade.sh` installs a newer package into the switched-off disk, and the
//! second boot serves with the same token: the data partition survived the upgrade.
//!
//! Needs root (the build mounts and chroots), mmdebstrap (reaches Debian's mirror; the base is
//! cached in /var/cache/switchyard-appliance), qemu-system-x86_64, extlinux, sfdisk. Under `CI`
//! a missing tool fails the test. Boot-to-serving times are printed, never asserted.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{curl, free_port, require, start_nginx, Proc, BIN};

const PAGE: &[u8] = b"served to the appliance's proxy from the host\n";
const BOOT_LIMIT: Duration = Duration::from_secs(420);
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Runs an appliance script, bounded in time; returns its standard output.
fn script(name: &str, args: &[&str]) -> String {
    let path = repo().join("appliance-image").join(name);
    let out = Command::new("timeout")
        .arg("1500")
        .arg(&path)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run the appliance script");
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One boot of the image under qemu with its serial console in a file.
struct Guest {
    qemu: Proc,
    serial: PathBuf,
    qmp: PathBuf,
    proxy: u16,
    api: u16,
    started: Instant,
}

/// One guest connection (stdin/stdout, from qemu's guestfwd `cmd:`) relayed to the host's
/// 127.0.0.1:PORT.
const GUESTFWD_RELAY: &str = r#"
import os, socket, sys, threading
upstream = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def to_upstream():
    while True:
        data = os.read(0, 65536)
        if not data:
            upstream.shutdown(socket.SHUT_WR)
            return
        upstream.sendall(data)
threading.Thread(target=to_upstream, daemon=True).start()
while True:
    data = upstream.recv(65536)
    if not data:
        break
    os.write(1, data)
"#;

impl Guest {
    fn boot(image: &Path, dir: &Path, run: &str, origin_port: u16) -> Guest {
        let (proxy, api) = (free_port(), free_port());
        let serial = dir.join(format!("serial-{run}.log"));
        let qmp = dir.join(format!("qmp-{run}.sock"));
        // guestfwd to a `tcp:` chardev is one connection, opened when qemu starts: nginx closed
        // it after 60 s without a request whenever the boot took longer (TCG beside a loaded
        // CPU), and the guest's request then hung. `cmd:` starts the relay per connection.
        let relay = dir.join("guestfwd_relay.py");
        std::fs::write(&relay, GUESTFWD_RELAY).expect("relay script");
        let net = format!(
            "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{proxy}-:7080,\
             hostfwd=tcp:127.0.0.1:{api}-:7082,\
             guestfwd=tcp:10.0.2.100:80-cmd:python3 {} {origin_port}",
            relay.display()
        );
        let child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-cpu", "max", "-m", "768", "-smp", "2"])
            .arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", image.display()))
            .args(["-netdev", &net, "-device", "virtio-net-pci,netdev=n0"])
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server,nowait", qmp.display()))
            .args(["-display", "none", "-no-reboot"])
            .stdin(Stdio::null())
            .spawn()
            .expect("start qemu");
        Guest {
            qemu: Proc {
                child,
                name: format!("qemu {run}"),
            },
            serial,
            qmp,
            proxy,
            api,
            started: Instant::now(),
        }
    }

    fn console(&self) -> String {
        std::fs::read_to_string(&self.serial).unwrap_or_default()
    }

    /// Waits until `/api/v1/health` answers 200 with the token; returns how long it took.
    fn wait_serving(&mut self, token: &str) -> Duration {
        let url = format!("http://127.0.0.1:{}/api/v1/health", self.api);
        let auth = format!("Authorization: Bearer {token}");
        while self.started.elapsed() < BOOT_LIMIT {
            if let Ok(Some(status)) = self.qemu.child.try_wait() {
                panic!("qemu exited ({status}) before serving:\n{}", self.console());
            }
            let code = support::http_code(&["-m", "5", "-H", &auth, &url]);
            if code == "200" {
                return self.started.elapsed();
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        panic!(
            "the appliance did not serve within {BOOT_LIMIT:?}:\n{}",
            self.console()
        );
    }

    /// A request through the guest's proxy to the host's nginx (the guest's 10.0.2.100:80).
    /// Under TCG on a loaded 2-CPU host one request can take longer than curl's 60 s (a run
    /// beside a CPU hog timed out at 30 s): up to three attempts, a bound, not a speed claim.
    fn assert_proxies_the_origin(&self) {
        let fetch = || {
            curl(&[
                "-sS",
                "-m",
                "60",
                "-x",
                &format!("http://127.0.0.1:{}", self.proxy),
                "http://10.0.2.100/index.html",
            ])
        };
        let mut out = fetch();
        for _ in 1..3 {
            if out.status.success() {
                break;
            }
            out = fetch();
        }
        assert_eq!(
            out.stdout,
            PAGE,
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.console()
        );
    }

    /// Ctrl-Alt-Del over QMP (the image maps it to poweroff); waits for qemu to exit.
    fn power_off(mut self) {
        let mut qmp = UnixStream::connect(&self.qmp).expect("QMP socket");
        qmp.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("QMP timeout");
        let mut replies = BufReader::new(qmp.try_clone().expect("QMP socket"));
        let mut line = String::new();
        replies.read_line(&mut line).expect("QMP greeting");
        for command in [
            r#"{"execute":"qmp_capabilities"}"#,
            r#"{"execute":"send-key","arguments":{"keys":[{"type":"qcode","data":"ctrl"},{"type":"qcode","data":"alt"},{"type":"qcode","data":"delete"}]}}"#,
        ] {
            writeln!(qmp, "{command}").expect("QMP command");
            loop {
                line.clear();
                replies.read_line(&mut line).expect("QMP reply");
                if line.contains("\"return\"") || line.contains("\"error\"") {
                    break;
                }
            }
            assert!(line.contains("\"return\""), "QMP {command}: {line}");
        }
        let asked = Instant::now();
        while asked.elapsed() < SHUTDOWN_LIMIT {
            if let Ok(Some(status)) = self.qemu.child.try_wait() {
                assert!(status.success(), "qemu exit status {status}");
                let console = self.console();
                assert!(
                    console.contains("reboot: Power down"),
                    "no clean power-off on the console:\n{console}"
                );
                eprintln!("powered off in {:?}", asked.elapsed());
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "the guest did not power off within {SHUTDOWN_LIMIT:?}:\n{}",
            self.console()
        );
    }
}

/// The API token the first boot printed on the console.
fn printed_token(console: &str) -> Option<String> {
    let at = console.find("SWITCHYARD_API_TOKEN=")? + "SWITCHYARD_API_TOKEN=".len();
    let token: String = console[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (!token.is_empty()).then_some(token)
}

fn wait_token(guest: &mut Guest) -> String {
    while guest.started.elapsed() < BOOT_LIMIT {
        if let Some(token) = printed_token(&guest.console()) {
            return token;
        }
        if let Ok(Some(status)) = guest.qemu.child.try_wait() {
            panic!("qemu exited ({status}):\n{}", guest.console());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    panic!("no API token on the console:\n{}", guest.console());
}

#[test]
fn image_boots_serves_powers_off_and_upgrades_keeping_its_data() {
    if cannot_run() {
        return;
    }
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let out_s = out.to_str().expect("utf-8 path");
    let built = Instant::now();
    let image = script(
        "build.sh",
        &[
            "--binary",
            BIN,
            "--out",
            out_s,
            "--version",
            "1.0.0~test1",
            "--console-log",
        ],
    );
    let image = PathBuf::from(image.trim());
    eprintln!("image built in {:?}: {}", built.elapsed(), image.display());
    let manifest = std::fs::read_to_string(out.join("manifest.txt")).unwrap_or_default();
    eprintln!("{manifest}");

    // first boot: secrets generated and shown once, the server serves
    let mut guest = Guest::boot(&image, dir.path(), "first", origin.port);
    let token = wait_token(&mut guest);
    let took = guest.wait_serving(&token);
    eprintln!("first boot to serving: {took:?}");
    guest.assert_proxies_the_origin();
    let health = curl(&[
        "-sS",
        "-m",
        "10",
        "-H",
        &format!("Authorization: Bearer {token}"),
        &format!("http://127.0.0.1:{}/api/v1/health", guest.api),
    ]);
    let health: serde_json::Value = serde_json::from_slice(&health.stdout).expect("health JSON");
    assert_eq!(health["status"], "healthy", "{health}");
    // the API is open to the network only with the generated token
    let stats = format!("http://127.0.0.1:{}/api/v1/stats", guest.api);
    assert_eq!(support::http_code(&["-m", "10", &stats]), "401");
    let console = guest.console();
    assert!(
        !console.contains("panicked"),
        "a panic on the console:\n{console}"
    );
    guest.power_off();

    // offline upgrade to a newer package; the data partition (and so the token) is kept
    let deb_out = dir.path().join("v2");
    script(
        "build.sh",
        &[
            "--binary",
            BIN,
            "--out",
            deb_out.to_str().expect("utf-8 path"),
            "--version",
            "1.0.0~test2",
            "--package-only",
        ],
    );
    let deb = deb_out.join("switchyard_1.0.0~test2_amd64.deb");
    let said = script(
        "upgrade.sh",
        &[
            image.to_str().expect("utf-8 path"),
            deb.to_str().expect("utf-8 path"),
        ],
    );
    assert_eq!(said.trim(), "switchyard 1.0.0~test1 -> 1.0.0~test2");

    let mut guest = Guest::boot(&image, dir.path(), "upgraded", origin.port);
    let took = guest.wait_serving(&token);
    eprintln!("boot after the upgrade to serving: {took:?}");
    let console = guest.console();
    assert!(
        printed_token(&console).is_none(),
        "the first-boot secrets were generated again: the data partition was lost\n{console}"
    );
    guest.assert_proxies_the_origin();
    guest.power_off();
}

/// Root and the image tools, or a printed reason (a failure under CI).
fn cannot_run() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    if !root {
        assert!(
            std::env::var_os("CI").is_none(),
            "the appliance test needs root in CI"
        );
        eprintln!("SKIP: the appliance test needs root (it mounts and chroots)");
        return true;
    }
    [
        "mmdebstrap",
        "qemu-system-x86_64",
        "extlinux",
        "sfdisk",
        "mkfs.ext4",
        "objcopy",
        "python3",
    ]
    .iter()
    .any(|tool| require(tool).is_none())
}
