//! A real OpenLDAP directory for tests: Debian's `slapd` with its own config in a temp dir, the
//! entries of an LDIF loaded with `slapadd`, plain LDAP (with StartTLS) and LDAPS on random
//! loopback ports, certificates from a test CA made with `openssl`, and its `stats` log kept so
//! tests can count the binds that reached the directory.

use super::{free_port, require, Proc};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const BASE_DN: &str = "dc=example,dc=org";
pub const PEOPLE_DN: &str = "ou=people,dc=example,dc=org";

pub struct Slapd {
    pub proc: Proc,
    /// `ldap://127.0.0.1:PORT` (StartTLS available).
    pub ldap_url: String,
    /// `ldaps://127.0.0.1:PORT`.
    pub ldaps_url: String,
    pub ldap_port: u16,
    /// The CA that signed the directory's certificate (PEM).
    pub ca_cert: PathBuf,
    pub dir: tempfile::TempDir,
}

/// `users`: (uid, password) entries under [`PEOPLE_DN`].
pub fn start_slapd(users: &[(&str, &str)]) -> Option<Slapd> {
    start_slapd_at(users, None)
}

/// [`start_slapd`] with the plain-LDAP port chosen by the caller (a test that first finds
/// nothing there).
pub fn start_slapd_on(users: &[(&str, &str)], ldap_port: u16) -> Option<Slapd> {
    start_slapd_at(users, Some(ldap_port))
}

fn start_slapd_at(users: &[(&str, &str)], fixed_port: Option<u16>) -> Option<Slapd> {
    let slapd = require("slapd")?;
    let slapadd = require("slapadd")?;
    let openssl = require("openssl")?;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    make_certificates(&openssl, d);
    std::fs::create_dir_all(d.join("db")).expect("db dir");
    let conf = format!(
        "include /etc/ldap/schema/core.schema\ninclude /etc/ldap/schema/cosine.schema\n\
         include /etc/ldap/schema/inetorgperson.schema\ninclude /etc/ldap/schema/nis.schema\n\
         modulepath /usr/lib/ldap\nmoduleload back_mdb\n\
         pidfile {d}/slapd.pid\nargsfile {d}/slapd.args\nloglevel stats\n\
         TLSCACertificateFile {d}/ca.crt\nTLSCertificateFile {d}/server.crt\nTLSCertificateKeyFile {d}/server.key\n\
         database mdb\nmaxsize 10485760\nsuffix \"{BASE_DN}\"\nrootdn \"cn=admin,{BASE_DN}\"\n\
         rootpw admin-secret\ndirectory {d}/db\n",
        d = d.display()
    );
    std::fs::write(d.join("slapd.conf"), conf).expect("slapd.conf");
    let mut ldif = format!(
        "dn: {BASE_DN}\nobjectClass: dcObject\nobjectClass: organization\no: Example\ndc: example\n\n\
         dn: {PEOPLE_DN}\nobjectClass: organizationalUnit\nou: people\n\n"
    );
    for (uid, password) in users {
        ldif.push_str(&format!(
            "dn: uid={uid},{PEOPLE_DN}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {uid}\nsn: {uid}\nuserPassword: {password}\n\n"
        ));
    }
    std::fs::write(d.join("users.ldif"), ldif).expect("ldif");
    let added = Command::new(slapadd)
        .arg("-f")
        .arg(d.join("slapd.conf"))
        .arg("-l")
        .arg(d.join("users.ldif"))
        .output()
        .expect("run slapadd");
    assert!(
        added.status.success(),
        "slapadd: {}",
        String::from_utf8_lossy(&added.stderr)
    );
    // A port picked free may be taken by the time slapd binds it (other tests run in
    // parallel): slapd then exits, and another attempt picks again.
    for _ in 0..5 {
        let ldap_port = fixed_port.unwrap_or_else(free_port);
        let ldaps_port = free_port();
        let ldap_url = format!("ldap://127.0.0.1:{ldap_port}");
        let ldaps_url = format!("ldaps://127.0.0.1:{ldaps_port}");
        let log = std::fs::File::create(d.join("slapd.log")).expect("log");
        // -d keeps slapd in the foreground (so it is our child, killed by PID) and logs to
        // stderr.
        let child = Command::new(&slapd)
            .arg("-f")
            .arg(d.join("slapd.conf"))
            .arg("-h")
            .arg(format!("{ldap_url}/ {ldaps_url}/"))
            .args(["-d", "stats"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start slapd");
        let mut proc = Proc {
            child,
            name: "slapd".into(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let up = |port| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        loop {
            if matches!(proc.child.try_wait(), Ok(Some(_))) {
                break;
            }
            if up(ldap_port) && up(ldaps_port) {
                return Some(Slapd {
                    proc,
                    ldap_url,
                    ldaps_url,
                    ldap_port,
                    ca_cert: d.join("ca.crt"),
                    dir,
                });
            }
            assert!(
                Instant::now() < deadline,
                "slapd did not start: {}",
                slapd_log(d)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("slapd did not start: {}", slapd_log(d));
}

fn slapd_log(d: &Path) -> String {
    std::fs::read_to_string(d.join("slapd.log")).unwrap_or_default()
}

/// A CA and a server certificate for 127.0.0.1 / localhost signed by it.
fn make_certificates(openssl: &Path, d: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new(openssl)
            .current_dir(d)
            .args(args)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=switchyard test CA",
    ]);
    run(&ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    run(&csr);
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("ext");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
}

impl Slapd {
    pub fn log(&self) -> String {
        slapd_log(self.dir.path())
    }

    /// Simple binds as `uid` that reached the directory (requests, successful or not).
    pub fn binds_as(&self, uid: &str) -> usize {
        let dn = format!("BIND dn=\"uid={uid},{PEOPLE_DN}\" method=");
        self.log().lines().filter(|l| l.contains(&dn)).count()
    }

    /// Searches that reached the directory.
    pub fn searches(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains(" SRCH base="))
            .count()
    }

    /// Connections on which anything was bound (the proxy's connections).
    pub fn bound_connections(&self) -> std::collections::BTreeSet<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(" BIND dn="))
            .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("conn=")))
            .map(str::to_owned)
            .collect()
    }

    /// Whether a StartTLS extended operation reached the directory.
    pub fn saw_starttls(&self) -> bool {
        self.log().contains("oid=1.3.6.1.4.1.1466.20037")
    }
}
