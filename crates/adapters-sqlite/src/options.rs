//! Where the database lives and how to open it: [`SqliteOptions`] and [`Location`].

use std::path::PathBuf;
use std::time::Duration;

use crate::error::OpenError;

/// Options of [`crate::SqliteBackend::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How long a statement waits for another connection's write lock before it
    /// fails with [`StoreFault::Busy`](holdfast_ports::StoreFault::Busy). Default 5 s; at most [`MAX_BUSY_TIMEOUT`].
    /// Once a write waited it out in vain, the writes after it try for the lock
    /// for a tenth of it (at most 50 ms) until one gets the lock, so a select
    /// waits about one busy timeout in all (the crate docs).
    pub busy_timeout: Duration,
    /// Reader connections beside the one writer connection, so reads run while a
    /// write is in progress. Default 4; 1 to [`MAX_READERS`].
    pub readers: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: Duration::from_secs(5),
            readers: 4,
        }
    }
}

/// The longest accepted busy timeout (one hour).
pub const MAX_BUSY_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most reader connections accepted.
pub const MAX_READERS: usize = 64;

/// Where a database lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A private in-memory database (one connection; gone when closed).
    Memory,
    /// A database file, created if missing.
    File(PathBuf),
}

impl Location {
    /// Parses `sqlite://path`, `sqlite:path`, `sqlite::memory:`, `:memory:` or a plain
    /// file path. `sqlite:///abs/file.db` is the absolute path `/abs/file.db`;
    /// `sqlite://data/x.db` is the relative path `data/x.db`.
    pub fn parse(input: &str) -> Result<Location, OpenError> {
        let invalid = |reason: &'static str| OpenError::InvalidLocation {
            input: input.to_owned(),
            reason,
        };
        if input.contains('\0') {
            return Err(invalid("contains a NUL character"));
        }
        let path = if let Some(rest) = input.strip_prefix("sqlite://") {
            rest
        } else if let Some(rest) = input.strip_prefix("sqlite:") {
            rest
        } else if let Some((scheme, _)) = input.split_once("://") {
            if !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+')
            {
                // Only the scheme is echoed: the rest may carry a password.
                return Err(OpenError::InvalidLocation {
                    input: format!("{scheme}://…"),
                    reason: "unsupported URL scheme",
                });
            }
            input
        } else {
            input
        };
        if path.is_empty() {
            return Err(invalid("no file path"));
        }
        if path == ":memory:" {
            return Ok(Location::Memory);
        }
        if path.contains('?') {
            return Err(invalid("URL query parameters are not supported"));
        }
        if path.ends_with('/') || path.ends_with(std::path::MAIN_SEPARATOR) {
            return Err(invalid("names a directory, not a file"));
        }
        Ok(Location::File(PathBuf::from(path)))
    }
}

impl SqliteOptions {
    /// Checks every option against its range.
    pub fn validate(&self) -> Result<(), OpenError> {
        if self.busy_timeout.is_zero() || self.busy_timeout > MAX_BUSY_TIMEOUT {
            return Err(OpenError::InvalidOption {
                option: "busy_timeout",
                value: format!("{:?}", self.busy_timeout),
                expected: format!("more than 0 and at most {MAX_BUSY_TIMEOUT:?}"),
            });
        }
        if self.readers == 0 || self.readers > MAX_READERS {
            return Err(OpenError::InvalidOption {
                option: "readers",
                value: self.readers.to_string(),
                expected: format!("1 to {MAX_READERS}"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_paths() {
        let file = |p: &str| Ok(Location::File(PathBuf::from(p)));
        assert_eq!(
            Location::parse("sqlite:///var/lib/h.db"),
            file("/var/lib/h.db")
        );
        assert_eq!(Location::parse("sqlite://data/h.db"), file("data/h.db"));
        assert_eq!(Location::parse("sqlite:h.db"), file("h.db"));
        assert_eq!(Location::parse("/tmp/h.db"), file("/tmp/h.db"));
        assert_eq!(Location::parse("h.db"), file("h.db"));
        assert_eq!(Location::parse(":memory:"), Ok(Location::Memory));
        assert_eq!(Location::parse("sqlite::memory:"), Ok(Location::Memory));
        assert_eq!(Location::parse("sqlite://:memory:"), Ok(Location::Memory));
    }

    #[test]
    fn rejects_bad_locations_naming_them() {
        for (input, reason) in [
            ("", "no file path"),
            ("sqlite://", "no file path"),
            ("sqlite:", "no file path"),
            ("sqlite://h.db?mode=ro", "query parameters"),
            ("data/", "directory"),
            ("a\0b", "NUL"),
        ] {
            let err = Location::parse(input).expect_err(input).to_string();
            assert!(err.contains(reason), "{input:?}: {err}");
            assert!(err.contains(&format!("{input:?}")), "{input:?}: {err}");
        }
    }

    #[test]
    fn foreign_urls_are_refused_without_echoing_secrets() {
        let err = Location::parse("postgres://user:hunter2@db/h").expect_err("postgres");
        let text = err.to_string();
        assert!(text.contains("unsupported URL scheme"), "{text}");
        assert!(text.contains("postgres://"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn validates_options() {
        assert_eq!(SqliteOptions::default().validate(), Ok(()));
        let zero = SqliteOptions {
            readers: 0,
            ..SqliteOptions::default()
        };
        assert!(
            zero.validate()
                .expect_err("0 readers")
                .to_string()
                .contains("1 to 64")
        );
        let long = SqliteOptions {
            busy_timeout: Duration::from_secs(7200),
            ..SqliteOptions::default()
        };
        assert!(matches!(
            long.validate(),
            Err(OpenError::InvalidOption {
                option: "busy_timeout",
                ..
            })
        ));
    }
}
