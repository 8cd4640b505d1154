//! A real Kerberos realm for the SPNEGO tests: Debian's MIT `krb5kdc` with a realm created in a
//! temp dir (`kdb5_util`, principals and the proxy's keytab made with `kadmin.local`) on a random
//! loopback port, and `kinit` to get a user's tickets into a ccache of the test's own.

use super::{free_port, require, Proc};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const REALM: &str = "SYTEST.ORG";
/// The proxy's principal: curl asks for `HTTP@<proxy host>`, and the tests reach the proxy as
/// `localhost`.
pub const SERVICE: &str = "HTTP/localhost";

pub struct Kdc {
    pub proc: Proc,
    pub dir: tempfile::TempDir,
    pub keytab: PathBuf,
}

impl Kdc {
    pub fn krb5_conf(&self) -> PathBuf {
        self.dir.path().join("krb5.conf")
    }

    /// Environment for Kerberos programs using this realm.
    pub fn env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![
            ("KRB5_CONFIG", self.krb5_conf().into_os_string()),
            (
                "KRB5_KDC_PROFILE",
                self.dir.path().join("kdc.conf").into_os_string(),
            ),
            ("KRB5RCACHEDIR", self.dir.path().as_os_str().to_owned()),
        ]
    }

    fn kadmin(&self, query: &str) {
        let out = Command::new("kadmin.local")
            .envs(self.env())
            .args(["-r", REALM, "-q", query])
            .output()
            .expect("run kadmin.local");
        assert!(
            out.status.success(),
            "kadmin.local {query}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Adds `user` with `password`.
    pub fn add_user(&self, user: &str, password: &str) {
        self.kadmin(&format!("addprinc -pw {password} {user}"));
    }

    /// A ccache holding `user`'s ticket-granting ticket (from `kinit`).
    pub fn kinit(&self, user: &str, password: &str) -> PathBuf {
        let cache = self.dir.path().join(format!("cc-{user}"));
        let mut child = Command::new("kinit")
            .envs(self.env())
            .env("KRB5CCNAME", format!("FILE:{}", cache.display()))
            .arg(user)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kinit");
        if let Some(mut stdin) = child.stdin.take() {
            writeln!(stdin, "{password}").expect("password to kinit");
        }
        let out = child.wait_with_output().expect("kinit");
        assert!(
            out.status.success(),
            "kinit {user}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cache
    }
}

pub fn start_kdc() -> Option<Kdc> {
    for program in ["krb5kdc", "kdb5_util", "kadmin.local", "kinit"] {
        require(program)?;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let port = free_port();
    std::fs::write(
        dir.path().join("krb5.conf"),
        format!(
            "[libdefaults]\n  default_realm = {REALM}\n  dns_lookup_realm = false\n  dns_lookup_kdc = false\n\
             rdns = false\n  dns_canonicalize_hostname = false\n  udp_preference_limit = 1\n\
             [realms]\n  {REALM} = {{\n    kdc = 127.0.0.1:{port}\n  }}\n"
        ),
    )
    .expect("krb5.conf");
    std::fs::write(
        dir.path().join("kdc.conf"),
        format!(
            "[kdcdefaults]\n  kdc_ports = {port}\n  kdc_tcp_ports = {port}\n[realms]\n  {REALM} = {{\n\
             database_name = {d}/principal\n    key_stash_file = {d}/stash\n    acl_file = {d}/kadm5.acl\n\
             kdc_ports = {port}\n    kdc_tcp_ports = {port}\n  }}\n[logging]\n  kdc = FILE:{d}/kdc.log\n"
        ),
    )
    .expect("kdc.conf");
    let keytab = dir.path().join("proxy.keytab");
    let kdc = |proc| Kdc {
        proc,
        dir,
        keytab: keytab.clone(),
    };
    let env = [
        ("KRB5_CONFIG", format!("{d}/krb5.conf")),
        ("KRB5_KDC_PROFILE", format!("{d}/kdc.conf")),
    ];
    let created = Command::new("kdb5_util")
        .envs(env.clone())
        .args(["create", "-s", "-r", REALM, "-P", "master-secret", "-d"])
        .arg(format!("{d}/principal"))
        .output()
        .expect("run kdb5_util");
    assert!(
        created.status.success(),
        "kdb5_util: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let child = Command::new("krb5kdc")
        .envs(env)
        .args(["-n", "-r", REALM])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start krb5kdc");
    let kdc = kdc(Proc {
        child,
        name: "krb5kdc".into(),
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "krb5kdc did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    kdc.kadmin(&format!("addprinc -randkey {SERVICE}"));
    kdc.kadmin(&format!("ktadd -k {} {SERVICE}", keytab.display()));
    Some(kdc)
}
