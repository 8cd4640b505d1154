//! A throwaway PostgreSQL cluster for the inventory and mesh registry tests, shared by every test of one test
//! binary and started by the tests themselves (Debian's server binaries, `initdb` into a
//! directory under the temp dir, a free loopback port, `fsync=off`).
//!
//! Why a lease across processes: nextest runs each test in its own process, so a `static`
//! cluster would mean one `initdb` per test. Instead the cluster lives in a directory named
//! after the test binary, and two lock files coordinate its users:
//! - `control.lock` (exclusive) serialises starting and stopping;
//! - `users.lock` is held shared by every live lease. Whoever releases the last lease (its
//!   exclusive `try_lock` succeeds under the control lock) stops the server by the PID in
//!   `postmaster.pid` (SIGINT, fast shutdown) and removes the data directory.
//!
//! A killed test process releases its locks with its file descriptors; a cluster left running
//! that way is reused by the next run and stopped by its last lease.
//!
//! As root the server runs as the `postgres` user (PostgreSQL refuses to run as root), through
//! `runuser`. Each test gets its own database per service data directory ([`Lease::database`]).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One user's claim on the shared cluster; the last one dropped stops it.
pub struct Lease {
    users: Option<File>,
    root: PathBuf,
    bin: PathBuf,
    port: u16,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The newest installed server's bin directory (`/usr/lib/postgresql/N/bin`).
fn server_bin() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("postgres").exists())
        .max_by_key(|b| {
            // "15" < "16" numerically, not lexically ("9.6" vs "10")
            b.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.split('.').next())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        })
}

fn open_lock(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// The cluster directory of this test binary: one per executable path.
fn cluster_root() -> PathBuf {
    use std::hash::{Hash as _, Hasher as _};
    let exe = std::env::current_exe().unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    exe.hash(&mut h);
    std::env::temp_dir().join(format!("switchyard-inventory-pg-{:016x}", h.finish()))
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The postmaster's PID from `DATA/postmaster.pid`, if that process is alive.
fn postmaster_pid(data: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    pid_alive(pid).then_some(pid)
}

impl Lease {
    /// A lease on the running cluster, starting it when nobody runs it. `None` (reason printed)
    /// when no PostgreSQL server is installed; under `CI` that is a failure instead.
    pub fn acquire() -> Option<Lease> {
        let Some(bin) = server_bin() else {
            if std::env::var_os("CI").is_some() {
                panic!(
                    "PostgreSQL server binaries are required in CI (tests/run installs postgresql)"
                );
            }
            eprintln!(
                "SKIP: no PostgreSQL server in /usr/lib/postgresql (apt install postgresql; tests/run does it as root)"
            );
            return None;
        };
        let root = cluster_root();
        std::fs::create_dir_all(&root).expect("cluster directory");
        let control = open_lock(&root.join("control.lock"));
        control.lock().expect("lock control.lock");
        let data = root.join("data");
        let port = match (
            postmaster_pid(&data),
            std::fs::read_to_string(root.join("port")),
        ) {
            (Some(_), Ok(p)) if p.trim().parse::<u16>().is_ok() => {
                p.trim().parse().unwrap_or_default()
            }
            _ => start_cluster(&bin, &root),
        };
        let users = open_lock(&root.join("users.lock"));
        users.lock_shared().expect("lock users.lock shared");
        drop(control);
        Some(Lease {
            users: Some(users),
            root,
            bin,
            port,
        })
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The database of one service data directory: created on first use (name kept in
    /// `DIR/postgres-database`, so a restarted service finds its data again).
    pub fn database(&self, dir: &Path) -> String {
        let marker = dir.join("postgres-database");
        if let Ok(name) = std::fs::read_to_string(&marker) {
            return self.url(name.trim());
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("inventory_{}_{nanos}", std::process::id());
        let out = Command::new(self.bin.join("psql"))
            .arg(self.url("postgres"))
            .args(["-v", "ON_ERROR_STOP=1", "-qc"])
            .arg(format!("CREATE DATABASE {name}"))
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "CREATE DATABASE {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&marker, &name).expect("write the database marker");
        self.url(&name)
    }
}

/// A command running `prog` from the server's bin directory, as `postgres` when we are root.
fn server_cmd(bin: &Path, prog: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(prog));
        c
    } else {
        Command::new(bin.join(prog))
    }
}

/// `initdb` a new cluster under `root/data` and start it on a free port (retried when another
/// process takes the port first). Returns the port. Called under the control lock.
fn start_cluster(bin: &Path, root: &Path) -> u16 {
    let data = root.join("data");
    let _ = std::fs::remove_dir_all(&data);
    if is_root() {
        let ok = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(root)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown {} to postgres", root.display());
    }
    let out = server_cmd(bin, "initdb")
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
        .output()
        .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut last_error = String::new();
    for _ in 0..5 {
        let port = free_port();
        // Unix socket in the cluster directory (not /var/run/postgresql), TCP on loopback only.
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=300",
            root.display()
        );
        let out = server_cmd(bin, "pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-o", &opts, "-w", "-t", "60", "-l"])
            .arg(root.join("server.log"))
            .arg("start")
            .output()
            .expect("run pg_ctl start");
        if out.status.success() {
            std::fs::write(root.join("port"), port.to_string()).expect("write port");
            return port;
        }
        last_error = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(root.join("server.log")).unwrap_or_default()
        );
    }
    panic!("PostgreSQL did not start: {last_error}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Fast shutdown of the postmaster by its PID (SIGINT), waiting for it to exit.
fn stop_cluster(root: &Path) {
    let data = root.join("data");
    if let Some(pid) = postmaster_pid(&data) {
        let _ = Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while pid_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if pid_alive(pid) {
            eprintln!("PostgreSQL {pid} ignored SIGINT for 30 s; sending SIGKILL");
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_file(root.join("port"));
}

impl Drop for Lease {
    fn drop(&mut self) {
        let control = open_lock(&self.root.join("control.lock"));
        if control.lock().is_err() {
            return;
        }
        drop(self.users.take());
        let probe = open_lock(&self.root.join("users.lock"));
        if probe.try_lock().is_ok() {
            stop_cluster(&self.root);
        }
    }
}

/// The database a test's services use.
pub enum Db {
    Sqlite,
    Postgres(Lease),
}

/// Generates `sqlite::NAME` and `postgres::NAME` for each `async fn NAME(db: Db)` (the
/// including file names this module `pg`, with `#[macro_use]`, and imports [`Db`]). The
/// PostgreSQL variants sit together in one module so that a runner going through them in order
/// (nextest lists by name) keeps the shared cluster busy instead of stopping and restarting it.
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod sqlite {$(
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                super::$name(super::Db::Sqlite).await
            }
        )*}

        mod postgres {$(
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                let Some(lease) = super::pg::Lease::acquire() else {
                    return;
                };
                super::$name(super::Db::Postgres(lease)).await
            }
        )*}
    };
}
