//! A throwaway PostgreSQL cluster per test: `initdb` into a fresh directory, a
//! server on a free port of 127.0.0.1, and standbys made with `pg_basebackup`
//! streaming from it. Stopped and removed on drop, also when the test panics or
//! its process is killed ([`WATCHDOG`]).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// Stops every server of the cluster (each data directory with a
/// `postmaster.pid`) and removes the cluster's directory once its stdin closes:
/// when the [`Cluster`] is dropped, also while the test panics, and when the test
/// process is killed (as `cargo xtask test`'s watchdog does).
const WATCHDOG: &str = r#"
trap '' INT HUP TERM QUIT
cat >/dev/null
for pid in "$1"/*/postmaster.pid; do
  [ -f "$pid" ] || continue
  data=$(dirname "$pid")
  if [ "$3" = root ]; then
    runuser -u postgres -- "$2" -D "$data" -m immediate -w stop
  else
    "$2" -D "$data" -m immediate -w stop
  fi >/dev/null 2>&1
done
rm -rf "$1"
"#;

/// How a restart shuts the server down (`pg_ctl restart -m MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Sessions are terminated, then a checkpoint.
    Fast,
    /// The server quits at once; the start recovers from the WAL.
    Immediate,
}

impl Shutdown {
    pub fn mode(self) -> &'static str {
        match self {
            Shutdown::Fast => "fast",
            Shutdown::Immediate => "immediate",
        }
    }
}

/// This test's own PostgreSQL cluster: a fresh directory, 127.0.0.1 and a free
/// port only, trust authentication (replication connections too), `fsync=off`
/// (a crash of the server process loses nothing the kernel holds; unlike
/// `synchronous_commit=off`, which would lose acknowledged commits on an
/// immediate shutdown). The first server's data directory is `data`; standbys
/// have their own ([`Standby`]). Stopped and removed on drop.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    as_root: bool,
    /// The first server's port.
    pub port: u16,
    /// `max_connections` of every server.
    max_connections: u32,
    watchdog: Option<Child>,
}

/// A hot standby of a [`Cluster`], streaming from its first server.
#[derive(Debug, Clone)]
pub struct Standby {
    /// Its data directory's name inside the cluster's directory.
    pub name: String,
    /// Its port.
    pub port: u16,
}

/// What every cluster needs; a cluster with standbys needs `pg_basebackup` too.
const BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// Where the PostgreSQL binaries are: `$HOLDFAST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<major>/bin`; with [`BINARIES`] and `more`.
pub fn pg_binaries(more: &[&str]) -> Option<PathBuf> {
    let complete = |dir: &Path| BINARIES.iter().chain(more).all(|b| dir.join(b).is_file());
    if let Some(dir) = std::env::var_os("HOLDFAST_PG_BIN").map(PathBuf::from) {
        return complete(&dir).then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((major, entry.path().join("bin")))
        })
        .filter(|(_, bin)| complete(bin))
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Appends `line` to the tally file `cargo xtask test` counts PostgreSQL tests with.
pub fn tally(line: &str) {
    use std::io::Write as _;
    let Some(path) = std::env::var_os("HOLDFAST_PG_TALLY") else {
        return;
    };
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

pub fn unique_dir() -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!(
        "holdfast-fleet-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no postgres user to run initdb as (id {flag} postgres)"))
    };
    (id("-u"), id("-g"))
}

impl Cluster {
    /// Initialises and starts a cluster for `test` allowing `max_connections`;
    /// `None` after a loud SKIPPED line when there are no binaries (a panic under
    /// `CI=true`).
    pub fn start(test: &str, max_connections: u32) -> Option<Cluster> {
        Cluster::start_with(test, max_connections, "", &[])
    }

    /// [`Cluster::start`] with more server options (`-c name=value ...`) and
    /// more binaries needed (`pg_basebackup` for [`Cluster::add_standby`]).
    pub fn start_with(
        test: &str,
        max_connections: u32,
        extra: &str,
        needs: &[&str],
    ) -> Option<Cluster> {
        let Some(bin) = pg_binaries(needs) else {
            let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
            assert!(
                !ci,
                "{test}: CI=true but no PostgreSQL binaries (HOLDFAST_PG_BIN, /usr/lib/postgresql/*/bin)"
            );
            eprintln!(
                "!!!!!!!! SKIPPED: no PostgreSQL binaries ({}; HOLDFAST_PG_BIN, \
                 /usr/lib/postgresql/*/bin): {test} did not run !!!!!!!!",
                BINARIES
                    .iter()
                    .chain(needs)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            tally(&format!("skipped {test}"));
            return None;
        };
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        let dir = unique_dir();
        std::fs::create_dir(&dir).expect("cluster directory");
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "holdfast-fleet-watchdog"])
            .arg(&dir)
            .arg(bin.join("pg_ctl"))
            .arg(if as_root { "root" } else { "user" })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the cluster watchdog");
        let mut cluster = Cluster {
            dir,
            bin,
            as_root,
            port: 0,
            max_connections,
            watchdog: Some(watchdog),
        };
        if as_root {
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(&cluster.dir, Some(uid), Some(gid))
                .expect("chown to postgres");
        }
        let initdb = cluster
            .as_owner("initdb")
            .arg("-D")
            .arg(cluster.data())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(
            initdb.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        // A port can be taken between choosing it and the server binding it.
        for _ in 0..3 {
            cluster.port = free_port();
            let options = format!("{} {extra}", cluster.options(cluster.port));
            let started = cluster
                .pg_ctl()
                .args(["-w", "-t", "60", "-o", &options, "start"])
                .status()
                .expect("run pg_ctl start");
            if started.success() {
                tally(&format!("ran {test}"));
                return Some(cluster);
            }
        }
        panic!(
            "pg_ctl start failed 3 times; server log:\n{}",
            cluster.server_log()
        );
    }

    /// The options every server of the cluster starts with, on `port`.
    fn options(&self, port: u16) -> String {
        format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections={}",
            self.dir.display(),
            self.max_connections
        )
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `bin/<program>`, as the cluster's owner (`initdb` and `pg_ctl` refuse root).
    fn as_owner(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        }
    }

    /// `pg_ctl -D data -l log`, its output discarded (the server inherits it: a
    /// pipe would never close).
    fn pg_ctl(&self) -> Command {
        self.pg_ctl_of("data", "server.log")
    }

    /// `pg_ctl` of the data directory `data` (inside the cluster's), logging to `log`.
    fn pg_ctl_of(&self, data: &str, log: &str) -> Command {
        let mut cmd = self.as_owner("pg_ctl");
        cmd.arg("-D")
            .arg(self.dir.join(data))
            .arg("-l")
            .arg(self.dir.join(log))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    /// Restarts the server (`pg_ctl restart -m MODE -w`, which keeps the start's
    /// options); returns how long it took, until the server accepted connections.
    pub fn restart(&self, how: Shutdown) -> Duration {
        let began = Instant::now();
        let status = self
            .pg_ctl()
            .args(["-m", how.mode(), "-w", "-t", "60", "restart"])
            .status()
            .expect("run pg_ctl restart");
        assert!(
            status.success(),
            "pg_ctl restart -m {} failed; server log:\n{}",
            how.mode(),
            self.server_log()
        );
        began.elapsed()
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The URL of `database` as `user`.
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    /// A superuser connection to the maintenance database. The superuser keeps the
    /// reserved connection slots, so this works while a fleet fills the others.
    pub async fn admin(&self) -> PgConnection {
        self.connect(&self.url("postgres", "postgres")).await
    }

    /// A connection to `url`, retried for up to 30 s (a server starting up).
    pub async fn connect(&self, url: &str) -> PgConnection {
        let began = Instant::now();
        loop {
            match PgConnection::connect(url).await {
                Ok(conn) => return conn,
                Err(e) if began.elapsed() < Duration::from_secs(30) => {
                    let _ = e;
                    // sleep: retry pause while the server starts, bounded at 30 s.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot connect to {url}: {e}"),
            }
        }
    }

    /// Creates database `name` (owned by `owner`, a new login role without
    /// superuser rights, when given) and returns its URL as that owner.
    pub async fn create_database(&self, name: &str, owner: Option<&str>) -> String {
        let mut admin = self.admin().await;
        let mut sql = format!("CREATE DATABASE \"{name}\"");
        if let Some(owner) = owner {
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE ROLE \"{owner}\" LOGIN")))
                .execute(&mut admin)
                .await
                .expect("create role");
            sql.push_str(&format!(" OWNER \"{owner}\""));
        }
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("create database");
        let _ = admin.close().await;
        self.url(owner.unwrap_or("postgres"), name)
    }
}

impl Cluster {
    /// Makes a hot standby `name` of the first server (`pg_basebackup -R`) and
    /// starts it on a free port with `extra` options; it streams from
    /// `upstream_port` (the first server's, or a link's in front of it).
    pub fn add_standby(&self, name: &str, upstream_port: u16, extra: &str) -> Standby {
        let backup = self
            .as_owner("pg_basebackup")
            .arg("-D")
            .arg(self.dir.join(name))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"])
            .output()
            .expect("run pg_basebackup");
        assert!(
            backup.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&backup.stderr)
        );
        let log = format!("{name}.log");
        for _ in 0..3 {
            let port = free_port();
            // On the command line, so they override what the backup copied: the
            // upstream, and no synchronous standby of its own (promoted, it would
            // wait for one forever).
            let options = format!(
                "{} -c synchronous_standby_names='' \
                 -c primary_conninfo='host=127.0.0.1 port={upstream_port} user=postgres application_name={name}' {extra}",
                self.options(port)
            );
            let started = self
                .pg_ctl_of(name, &log)
                .args(["-w", "-t", "60", "-o", &options, "start"])
                .status()
                .expect("run pg_ctl start");
            if started.success() {
                return Standby {
                    name: name.to_owned(),
                    port,
                };
            }
        }
        panic!(
            "the standby {name} did not start 3 times; its log:\n{}",
            std::fs::read_to_string(self.dir.join(&log)).unwrap_or_default()
        );
    }

    /// Stops the first server (`pg_ctl stop -m MODE`); how long it took.
    pub fn stop(&self, how: Shutdown) -> Duration {
        let began = Instant::now();
        let status = self
            .pg_ctl()
            .args(["-m", how.mode(), "-w", "-t", "60", "stop"])
            .status()
            .expect("run pg_ctl stop");
        assert!(status.success(), "pg_ctl stop -m {} failed", how.mode());
        began.elapsed()
    }

    /// Promotes `standby` (`pg_ctl promote -w`: returns once it takes writes);
    /// how long it took.
    pub fn promote(&self, standby: &Standby) -> Duration {
        let began = Instant::now();
        let log = format!("{}.log", standby.name);
        let status = self
            .pg_ctl_of(&standby.name, &log)
            .args(["-w", "-t", "60", "promote"])
            .status()
            .expect("run pg_ctl promote");
        assert!(
            status.success(),
            "pg_ctl promote failed; its log:\n{}",
            std::fs::read_to_string(self.dir.join(&log)).unwrap_or_default()
        );
        began.elapsed()
    }

    /// The URL of `database` on `standby`, as `postgres`.
    pub fn standby_url(&self, standby: &Standby, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", standby.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            drop(watchdog.stdin.take());
            if !watchdog.wait().is_ok_and(|s| s.success()) {
                eprintln!(
                    "warning: clean-up of the cluster in {} failed",
                    self.dir.display()
                );
            }
        }
    }
}

/// One fleet test at a time on this machine, across test processes (nextest runs
/// each test in its own): two fleets on two cores would measure each other. The
/// turn is a `flock` held by a child process until the guard drops (or the test
/// process dies); without `flock` the tests run unserialised, with a note.
#[derive(Debug)]
pub struct Turn(Option<Child>);

pub fn turn() -> Turn {
    let lock = std::env::temp_dir().join("holdfast-fleet-faults.lock");
    let child = Command::new("flock")
        .args(["-w", "600"])
        .arg(&lock)
        .args(["-c", "echo held; exec cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("note: no flock; fleet tests may run at the same time");
        return Turn(None);
    };
    let mut line = String::new();
    let stdout = child.stdout.take().expect("flock stdout");
    let _ = BufReader::new(stdout).read_line(&mut line);
    if line.trim() != "held" {
        eprintln!("note: flock did not give the turn; running anyway");
    }
    Turn(Some(child))
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}
