//! Fresh databases for each strategy of a run, so no strategy sees another's
//! locks, spent tokens or statistics.
//!
//! - SQLite: a new file in a new directory (under the system temp directory, or
//!   beside the file `--db` names); the directory is removed afterwards.
//! - PostgreSQL: `CREATE DATABASE` through the server `--db` points at; the
//!   database is dropped afterwards (`WITH (FORCE)`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

// `with_database`: the URL of another database on the same server, cut where the
// adapter cuts URLs, so a password holding `/` or `?` stays whole.
pub use holdfast_adapters_postgres::with_database;
use holdfast_adapters_postgres::{redact_url, scrub_password};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use holdfast::backend::{BackendError, BackendKind};

/// Why a fresh database could not be made or removed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The URL is not usable.
    #[error(transparent)]
    Url(#[from] BackendError),
    /// A directory or file could not be created.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The PostgreSQL server refused.
    #[error("PostgreSQL at {url}: {action}: {message}")]
    Postgres {
        /// The server URL, password redacted.
        url: String,
        /// What was attempted.
        action: String,
        /// The server's message, password scrubbed.
        message: String,
    },
}

/// Where the fresh databases of a run are made.
#[derive(Debug, Clone)]
pub enum Provisioner {
    /// SQLite files under this directory (created on first use).
    Sqlite {
        /// The run's directory.
        dir: PathBuf,
    },
    /// Databases on the server of this URL.
    Postgres {
        /// The URL given (its database is used only to connect).
        admin_url: String,
    },
}

/// A fresh database; [`Provisioner::remove`] deletes it.
#[derive(Debug, Clone)]
pub struct FreshDb {
    /// The URL to open it with.
    pub url: String,
    name: String,
}

static RUN: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    )
}

impl Provisioner {
    /// A provisioner for `db` (`None`: SQLite under the system temp directory).
    pub fn for_url(db: Option<&str>) -> Result<Provisioner, ProvisionError> {
        let Some(url) = db else {
            return Ok(Provisioner::Sqlite {
                dir: std::env::temp_dir().join(unique("holdfast-sim")),
            });
        };
        match BackendKind::of_url(url)? {
            BackendKind::Postgres => Ok(Provisioner::Postgres {
                admin_url: url.to_owned(),
            }),
            BackendKind::Sqlite => {
                let path = url
                    .strip_prefix("sqlite://")
                    .or_else(|| url.strip_prefix("sqlite:"))
                    .unwrap_or(url);
                let parent = Path::new(path)
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map_or_else(std::env::temp_dir, Path::to_path_buf);
                Ok(Provisioner::Sqlite {
                    dir: parent.join(unique("holdfast-sim")),
                })
            }
        }
    }

    /// The backend kind the databases are of.
    pub fn kind(&self) -> BackendKind {
        match self {
            Provisioner::Sqlite { .. } => BackendKind::Sqlite,
            Provisioner::Postgres { .. } => BackendKind::Postgres,
        }
    }

    /// Makes a fresh, empty database for `label` (a strategy name).
    pub async fn create(&self, label: &str) -> Result<FreshDb, ProvisionError> {
        let label: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        match self {
            Provisioner::Sqlite { dir } => {
                std::fs::create_dir_all(dir).map_err(|source| ProvisionError::Io {
                    path: dir.display().to_string(),
                    source,
                })?;
                let file = dir.join(format!("{}.db", unique(&label)));
                Ok(FreshDb {
                    url: file.display().to_string(),
                    name: file.display().to_string(),
                })
            }
            Provisioner::Postgres { admin_url } => {
                let name = unique(&format!("holdfast_sim_{label}")).to_ascii_lowercase();
                self.admin(admin_url, &format!("CREATE DATABASE \"{name}\""))
                    .await?;
                Ok(FreshDb {
                    url: with_database(admin_url, &name),
                    name,
                })
            }
        }
    }

    /// Deletes a database made by [`Provisioner::create`] (its backends must be closed).
    pub async fn remove(&self, db: &FreshDb) -> Result<(), ProvisionError> {
        match self {
            Provisioner::Sqlite { .. } => {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", db.name));
                }
                Ok(())
            }
            Provisioner::Postgres { admin_url } => {
                self.admin(
                    admin_url,
                    &format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", db.name),
                )
                .await
            }
        }
    }

    /// Gathers the planner's statistics of the seeded `tokens` table, as a
    /// running server's autovacuum has them (PostgreSQL; SQLite plans by its
    /// indexes alone). Without them the planner takes the seeded table for
    /// empty: it read a consumer's selections by sorting a sequential scan of
    /// every token. The tables the run fills are left alone: analyzed empty,
    /// they kept connections on plans that read them whole as they grew
    /// (`docs/simulate.md`, "Fresh databases").
    pub async fn analyze(&self, db: &FreshDb) -> Result<(), ProvisionError> {
        match self {
            Provisioner::Sqlite { .. } => Ok(()),
            Provisioner::Postgres { .. } => self.admin(&db.url, "ANALYZE tokens").await,
        }
    }

    /// Removes what the run left (the SQLite directory, if empty).
    pub fn finish(&self) {
        if let Provisioner::Sqlite { dir } = self {
            let _ = std::fs::remove_dir(dir);
        }
    }

    async fn admin(&self, admin_url: &str, statement: &str) -> Result<(), ProvisionError> {
        let failed = |action: &str, e: sqlx::Error| ProvisionError::Postgres {
            url: redact_url(admin_url),
            action: action.to_owned(),
            message: scrub_password(&e.to_string(), admin_url),
        };
        let mut conn = PgConnection::connect(admin_url)
            .await
            .map_err(|e| failed("connect", e))?;
        let result = sqlx::query(AssertSqlSafe(statement.to_owned()))
            .execute(&mut conn)
            .await
            .map_err(|e| failed(statement, e));
        let _ = conn.close().await;
        result.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_replaced_keeping_the_query() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
        assert_eq!(with_database("postgresql://h/db", "x"), "postgresql://h/x");
        // An unescaped password is not mistaken for the path.
        assert_eq!(
            with_database("postgres://u:p/w?d@h:5432/app?sslmode=disable", "x"),
            "postgres://u:p/w?d@h:5432/x?sslmode=disable"
        );
    }
}
