//! A PostgreSQL server for the test suite: the caller's `DATABASE_URL`, or a
//! throwaway cluster started from the local binaries and removed afterwards.
//!
//! The throwaway cluster lives in a fresh temporary directory (data, socket and
//! log), listens on a free port of 127.0.0.1 only, and trusts every local user.
//! `initdb` and `pg_ctl` refuse to run as root, so as root they run as the
//! `postgres` user through `runuser`.
//!
//! Clean-up does not depend on xtask exiting normally: a watchdog shell is started
//! before the cluster, reading a pipe only xtask holds. When that pipe closes (the
//! [`Cluster`] is dropped, xtask panics, is interrupted with Ctrl-C or killed) the
//! watchdog stops the server and removes the directory. The watchdog ignores
//! SIGINT, SIGHUP and SIGTERM so a Ctrl-C cannot stop it before it cleans up.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::{Error, process};

/// Environment variable with the server URL the tests connect to.
pub const DATABASE_URL: &str = "DATABASE_URL";
/// Set to `1` for the tests when no server could be provided: they skip loudly.
pub const SKIP_VAR: &str = "HOLDFAST_PG_SKIP";
/// Overrides where `initdb` and `pg_ctl` are looked for.
pub const BIN_VAR: &str = "HOLDFAST_PG_BIN";

/// Connection attempts on fresh ports before giving up (a port can be taken
/// between choosing it and the server binding it).
const START_ATTEMPTS: usize = 3;

const WATCHDOG: &str = r#"
trap '' INT HUP TERM QUIT
cat >/dev/null
if [ -f "$1/data/postmaster.pid" ]; then
  if [ "$3" = root ]; then
    runuser -u postgres -- "$2" -D "$1/data" -m immediate -w stop
  else
    "$2" -D "$1/data" -m immediate -w stop
  fi >/dev/null 2>&1
fi
rm -rf "$1"
"#;

/// Where the tests' server comes from.
#[derive(Debug)]
pub enum Server {
    /// The caller's `DATABASE_URL`.
    External(String),
    /// A throwaway cluster, stopped and removed on drop.
    Throwaway(Cluster),
    /// No server: the PostgreSQL tests skip themselves loudly.
    Absent(String),
}

impl Server {
    /// The URL to give the tests, if any.
    pub fn url(&self) -> Option<&str> {
        match self {
            Server::External(url) => Some(url),
            Server::Throwaway(cluster) => Some(&cluster.url),
            Server::Absent(_) => None,
        }
    }

    /// A description for the summary, without passwords.
    pub fn describe(&self) -> String {
        match self {
            Server::External(url) => format!("DATABASE_URL {}", redact(url)),
            Server::Throwaway(cluster) => {
                format!(
                    "throwaway cluster {} ({})",
                    cluster.url,
                    cluster.bin.display()
                )
            }
            Server::Absent(reason) => format!("no server ({reason})"),
        }
    }

    /// Sets the environment of a test command: the URL, or the skip flag.
    pub fn configure(&self, cmd: &mut Command) {
        match self.url() {
            Some(url) => {
                cmd.env(DATABASE_URL, url).env_remove(SKIP_VAR);
            }
            None => {
                cmd.env_remove(DATABASE_URL).env(SKIP_VAR, "1");
            }
        }
    }
}

/// Whether we run under CI (`CI=true`), where a missing server is an error.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Provides a server: `DATABASE_URL` if set, else a throwaway cluster, else (only
/// outside CI) nothing, with a loud warning.
pub fn provide() -> Result<Server, Error> {
    if let Some(url) = std::env::var(DATABASE_URL)
        .ok()
        .filter(|u| !u.trim().is_empty())
    {
        eprintln!("postgres: using DATABASE_URL {}", redact(&url));
        return Ok(Server::External(url));
    }
    match find_binaries() {
        Some(bin) => Cluster::start(&bin).map(Server::Throwaway),
        None => {
            let reason = format!(
                "DATABASE_URL is unset and no initdb/pg_ctl found in ${BIN_VAR}, \
                 /usr/lib/postgresql/*/bin or PATH"
            );
            if under_ci() {
                return Err(Error::NoPostgres(format!(
                    "{reason}; CI=true requires a server"
                )));
            }
            let bar = "!".repeat(78);
            eprintln!(
                "{bar}\nWARNING: {reason}.\nWARNING: every PostgreSQL test will SKIP. \
                 Install PostgreSQL or set DATABASE_URL.\n{bar}"
            );
            Ok(Server::Absent(reason))
        }
    }
}

/// What a throwaway cluster needs.
const BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

fn has_binaries(dir: &Path, more: &[&str]) -> bool {
    BINARIES.iter().chain(more).all(|b| dir.join(b).is_file())
}

/// `$HOLDFAST_PG_BIN`, else the newest `/usr/lib/postgresql/<major>/bin`, else the
/// directory of `pg_ctl` on `PATH`.
fn find_binaries() -> Option<PathBuf> {
    find_binaries_with(&[])
}

/// [`find_binaries`] where `more` (such as `pg_basebackup`) are there too.
pub fn find_binaries_with(more: &[&str]) -> Option<PathBuf> {
    let has_binaries = |dir: &Path| has_binaries(dir, more);
    if let Some(dir) = std::env::var_os(BIN_VAR).map(PathBuf::from) {
        return has_binaries(&dir).then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((major, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_binaries(bin))
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).find(|dir| has_binaries(dir))
}

/// A running throwaway cluster. Dropping it stops the server and removes its
/// directory (through the watchdog, see the module docs).
#[derive(Debug)]
pub struct Cluster {
    url: String,
    dir: PathBuf,
    bin: PathBuf,
    watchdog: Option<Child>,
}

impl Cluster {
    /// Initialises and starts a cluster from the binaries in `bin`.
    pub fn start(bin: &Path) -> Result<Cluster, Error> {
        let started = Instant::now();
        let as_root = is_root()?;
        let dir = fresh_dir()?;
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io {
                action,
                path,
                source,
            }
        };
        std::fs::create_dir(&dir).map_err(io("creating", &dir))?;
        // The watchdog first: from here on, whatever happens, the directory goes away.
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "holdfast-pg-watchdog"])
            .arg(&dir)
            .arg(bin.join("pg_ctl"))
            .arg(if as_root { "root" } else { "user" })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|source| Error::Spawn {
                command: "sh (postgres watchdog)".to_owned(),
                source,
            })?;
        let mut cluster = Cluster {
            url: String::new(),
            dir,
            bin: bin.to_path_buf(),
            watchdog: Some(watchdog),
        };
        if as_root {
            let (uid, gid) = (id_of("-u")?, id_of("-g")?);
            std::os::unix::fs::chown(&cluster.dir, Some(uid), Some(gid))
                .map_err(io("chown to postgres", &cluster.dir))?;
        }
        let data = cluster.dir.join("data");
        process::output(
            cluster
                .as_owner(as_root, "initdb")
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]),
        )
        .map_err(|e| Error::Cluster(format!("initdb: {e}")))?;

        let log = cluster.dir.join("server.log");
        let mut last_failure = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let options = format!(
                "-p {port} -c listen_addresses=127.0.0.1 -k {} -c fsync=off \
                 -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
                cluster.dir.display()
            );
            let mut cmd = cluster.as_owner(as_root, "pg_ctl");
            cmd.arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "60", "-o", &options, "start"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let status = cmd.status().map_err(|source| Error::Spawn {
                command: process::describe(&cmd),
                source,
            })?;
            if status.success() {
                cluster.url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
                eprintln!(
                    "postgres: throwaway cluster at {} ready in {:.1}s (data in {})",
                    cluster.url,
                    started.elapsed().as_secs_f64(),
                    cluster.dir.display()
                );
                return Ok(cluster);
            }
            last_failure = log_tail(&log);
        }
        Err(Error::Cluster(format!(
            "pg_ctl start failed {START_ATTEMPTS} times; server log ends with:\n{last_failure}"
        )))
    }

    /// A command running `bin/<program>` as the cluster's owner.
    fn as_owner(&self, as_root: bool, program: &str) -> Command {
        let path = self.bin.join(program);
        if as_root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            // Closing its stdin tells the watchdog to stop the server and remove the dir.
            drop(watchdog.stdin.take());
            match watchdog.wait() {
                Ok(status) if status.success() => {
                    eprintln!("postgres: throwaway cluster stopped and removed");
                }
                Ok(status) => eprintln!(
                    "postgres: WARNING: clean-up of {} exited with {status}",
                    self.dir.display()
                ),
                Err(err) => eprintln!(
                    "postgres: WARNING: clean-up of {} not awaited: {err}",
                    self.dir.display()
                ),
            }
        }
    }
}

fn is_root() -> Result<bool, Error> {
    let out = process::output(Command::new("id").arg("-u"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// The uid (`-u`) or gid (`-g`) of the `postgres` user.
fn id_of(flag: &str) -> Result<u32, Error> {
    let mut cmd = Command::new("id");
    cmd.args([flag, "postgres"]);
    let command = process::describe(&cmd);
    let out = process::output(&mut cmd)?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().map_err(|_| Error::BadOutput {
        command,
        detail: format!("{:?} is not a numeric id", text.trim()),
    })
}

fn fresh_dir() -> Result<PathBuf, Error> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Ok(std::env::temp_dir().join(format!("holdfast-pg-{}-{nanos}", std::process::id())))
}

fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
        action: "binding a probe socket on",
        path: PathBuf::from("127.0.0.1:0"),
        source,
    })?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|source| Error::Io {
            action: "reading the probe socket address of",
            path: PathBuf::from("127.0.0.1:0"),
            source,
        })
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// `url` with the password of its user info replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    let authority = &url[scheme_end..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    match authority[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &authority[..colon],
            &url[scheme_end + at..]
        ),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("postgres://app:s3cr%40t@db:5432/holdfast?sslmode=require"),
            "postgres://app:***@db:5432/holdfast?sslmode=require"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
        assert_eq!(redact("postgres://a:b@c@h/db"), "postgres://a:***@h/db");
        assert_eq!(redact("not a url"), "not a url");
    }
}
