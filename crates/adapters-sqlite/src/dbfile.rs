//! The database file an instance opened, and the check that its path still
//! names that file.
//!
//! A connection keeps its file descriptors: a database file deleted or
//! replaced (another file renamed over it) while processes run is read and
//! written on through them, and every later commit, a confirmed spend too,
//! lands in a file that nobody opens again. A deleted `-wal` loses commits the
//! same way. SQLite checks this only for rollback journals
//! (`SQLITE_READONLY_DBMOVED`), not in WAL mode, and rusqlite exposes no
//! `SQLITE_FCNTL_HAS_MOVED` (which compares the inode of the main file only).
//! So an instance records the device and inode of the database file and of its
//! `-wal` when it opens, and compares them with what the paths name now:
//!
//! - in every write transaction, once it holds the write lock and before it
//!   writes: on a mismatch nothing is written (the transaction rolls back);
//! - after every commit: a commit that went into a file the path no longer
//!   names answers the error too, never success;
//! - before every read.
//!
//! Once found, the fault stays: every later call answers
//! [`StoreFault::Unavailable`] naming the path, and the process must open the
//! database again. A check is two `stat` calls of about a microsecond each;
//! a commit's fsync takes a millisecond. In-memory databases have no file and
//! no check, nor has a platform other than Unix (no inode numbers in `std`).
//!
//! What the check cannot see: a file overwritten in place (`cp` onto it keeps
//! the inode), and a `-wal` left beside a database replaced by renaming, which
//! SQLite applies to the new file when it next recovers it (move or remove the
//! `-wal` and `-shm` together with the database, as SQLite's "How To Corrupt"
//! page says).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use holdfast_ports::StoreFault;

use crate::error::OpenError;

/// What identifies a file while it exists: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {} inode {}", self.dev, self.ino)
    }
}

/// What a path names now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    File(FileId),
    Nothing,
}

#[cfg(unix)]
fn named(path: &Path) -> std::io::Result<Named> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Named::File(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Named::Nothing),
        Err(e) => Err(e),
    }
}

#[cfg(not(unix))]
fn named(_: &Path) -> std::io::Result<Named> {
    Err(std::io::Error::other("no inode numbers on this platform"))
}

/// One file the instance opened: its path, and what the path named then.
#[derive(Debug)]
struct Opened {
    path: PathBuf,
    id: FileId,
}

/// The database file of a file-backed instance, and its `-wal`.
#[derive(Debug)]
pub(crate) struct DbFile {
    db: Opened,
    /// `None` when there was no `-wal` at open (SQLite creates it on the first
    /// read in WAL mode, so only a file opened by some other means lacks it).
    wal: Option<Opened>,
    /// The fault once found; answered from then on.
    lost: OnceLock<StoreFault>,
}

impl DbFile {
    /// What `path` and its `-wal` name now, recorded once the instance's
    /// connections are open; `None` where there is nothing to compare (not Unix).
    pub(crate) fn record(path: &Path) -> Result<Option<DbFile>, OpenError> {
        #[cfg(unix)]
        {
            let unusable = |reason: String| OpenError::Unavailable {
                path: path.display().to_string(),
                reason,
            };
            let id = match named(path) {
                Ok(Named::File(id)) => id,
                Ok(Named::Nothing) => {
                    return Err(unusable("the file vanished while opening".into()));
                }
                Err(e) => return Err(unusable(e.to_string())),
            };
            // SQLite puts the -wal beside the file a symbolic link points to.
            let mut wal = std::fs::canonicalize(path)
                .map_err(|e| unusable(e.to_string()))?
                .into_os_string();
            wal.push("-wal");
            let wal = PathBuf::from(wal);
            let wal = match named(&wal) {
                Ok(Named::File(id)) => Some(Opened { path: wal, id }),
                Ok(Named::Nothing) => None,
                Err(e) => return Err(unusable(e.to_string())),
            };
            Ok(Some(DbFile {
                db: Opened {
                    path: path.to_owned(),
                    id,
                },
                wal,
                lost: OnceLock::new(),
            }))
        }
        #[cfg(not(unix))]
        {
            let _ = path;
            Ok(None)
        }
    }

    /// Whether the paths still name the files opened; the fault (kept from then
    /// on) when not.
    pub(crate) fn check(&self) -> Result<(), StoreFault> {
        if let Some(lost) = self.lost.get() {
            return Err(lost.clone());
        }
        let db = &self.db.path;
        let found = [Some(&self.db), self.wal.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|opened| match named(&opened.path) {
                Ok(Named::File(id)) if id == opened.id => None,
                Ok(now) => Some((opened, now)),
                // A path that cannot be looked at says nothing of the file.
                Err(_) => None,
            });
        let Some((opened, now)) = found else {
            return Ok(());
        };
        let what = if opened.path == *db {
            format!("database file {}", db.display())
        } else {
            format!(
                "write-ahead log {} of database {}",
                opened.path.display(),
                db.display()
            )
        };
        let now = match now {
            Named::File(id) => format!("names another file ({id})"),
            Named::Nothing => "names no file".to_owned(),
        };
        let fault = StoreFault::Unavailable(format!(
            "{what} was deleted or replaced under this process (opened as {}; the path now \
             {now}); nothing more is read from or written to it, and a write that answers \
             this error is not in the file at that path: open the database again",
            opened.id
        ));
        let fault = self.lost.get_or_init(|| {
            tracing::error!(%fault, "SQLite database file moved");
            fault
        });
        Err(fault.clone())
    }
}
