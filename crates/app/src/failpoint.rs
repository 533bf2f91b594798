//! Failpoints around admission writes, for crash tests (cargo feature `failpoints`,
//! off by default: without it [`hit`] is an empty function and nothing here reads
//! the environment).
//!
//! Every compare-and-set write of [`crate::admission`] passes two points, one right
//! before and one right after the store call (whatever it answered). A point is named
//! `<step>:<write>:<before|after>:<n>`: the admission step (`ingest`, `process`,
//! `outcome`, `dead_letter`, `reconcile`), the write's metric label
//! ([`crate::admission::write_label`], e.g. `claim`, `mark_processing`), and `n`,
//! counting from 1 how often this process has reached that step, write and side.
//!
//! With the feature, a process whose `HOLDFAST_FAILPOINT` names a point aborts
//! ([`std::process::abort`]) when it reaches it, after printing
//! `holdfast failpoint <name>: aborting` on stderr. A malformed value aborts at the
//! first point reached, printing the [`FailpointError`], so a typo never runs
//! unarmed. [`passed`] lists the points this process reached, in order, which is how
//! a test enumerates the points of a scenario.

use std::fmt;

/// The environment variable naming the point to abort at.
pub const ENV: &str = "HOLDFAST_FAILPOINT";

/// Which side of the write a point is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum When {
    /// Right before the store call.
    Before,
    /// Right after the store call returned.
    After,
}

impl When {
    /// `before` or `after`.
    pub fn as_str(self) -> &'static str {
        match self {
            When::Before => "before",
            When::After => "after",
        }
    }
}

/// A parsed point name, `<step>:<write>:<before|after>:<n>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Failpoint {
    /// The admission step.
    pub step: String,
    /// The write's metric label.
    pub write: String,
    /// Before or after the store call.
    pub when: When,
    /// The occurrence, from 1.
    pub n: u32,
}

impl fmt::Display for Failpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.step,
            self.write,
            self.when.as_str(),
            self.n
        )
    }
}

/// Why a point name does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "failpoint {value:?}: {problem}; expected <step>:<write>:<before|after>:<n>, e.g. process:claim:after:1"
)]
pub struct FailpointError {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl std::str::FromStr for Failpoint {
    type Err = FailpointError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let error = |problem: String| FailpointError {
            value: value.to_owned(),
            problem,
        };
        let parts: Vec<&str> = value.split(':').collect();
        let [step, write, when, n] = parts.as_slice() else {
            return Err(error(format!("{} parts", parts.len())));
        };
        let word = |what: &str, s: &str| {
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                Ok(s.to_owned())
            } else {
                Err(error(format!(
                    "{what} {s:?} is not a lowercase word (a-z and _)"
                )))
            }
        };
        let when = match *when {
            "before" => When::Before,
            "after" => When::After,
            other => return Err(error(format!("side {other:?} is not before or after"))),
        };
        let n = match n.parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => return Err(error(format!("occurrence {n:?} is not a number from 1"))),
        };
        Ok(Failpoint {
            step: word("step", step)?,
            write: word("write", write)?,
            when,
            n,
        })
    }
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock, PoisonError};

    use super::{ENV, Failpoint, FailpointError, When};

    /// Occurrences per (step, write, side), and every point reached in order.
    struct Seen {
        counts: BTreeMap<(&'static str, &'static str, When), u32>,
        passed: Vec<String>,
    }

    static SEEN: Mutex<Seen> = Mutex::new(Seen {
        counts: BTreeMap::new(),
        passed: Vec::new(),
    });

    fn armed() -> &'static Result<Option<Failpoint>, FailpointError> {
        static ARMED: OnceLock<Result<Option<Failpoint>, FailpointError>> = OnceLock::new();
        ARMED.get_or_init(|| match std::env::var(ENV) {
            Ok(value) => value.parse().map(Some),
            Err(_) => Ok(None),
        })
    }

    pub fn hit(step: &'static str, write: &'static str, when: When) {
        let point = {
            let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
            let count = seen.counts.entry((step, write, when)).or_insert(0);
            *count = count.saturating_add(1);
            let point = Failpoint {
                step: step.to_owned(),
                write: write.to_owned(),
                when,
                n: *count,
            };
            seen.passed.push(point.to_string());
            point
        };
        match armed() {
            Ok(Some(target)) if *target == point => {
                eprintln!("holdfast failpoint {point}: aborting");
                std::process::abort();
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("holdfast: {ENV}: {e}");
                std::process::abort();
            }
        }
    }

    pub fn passed() -> Vec<String> {
        SEEN.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .passed
            .clone()
    }
}

/// Marks the point `<step>:<write>:<when>:<n>`: aborts the process if
/// `HOLDFAST_FAILPOINT` names it (feature `failpoints`; a no-op without it).
#[cfg(feature = "failpoints")]
pub fn hit(step: &'static str, write: &'static str, when: When) {
    armed::hit(step, write, when);
}

/// Marks the point `<step>:<write>:<when>:<n>`: aborts the process if
/// `HOLDFAST_FAILPOINT` names it (feature `failpoints`; a no-op without it).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_step: &'static str, _write: &'static str, _when: When) {}

/// The points this process reached so far, in order (always empty without the
/// feature `failpoints`).
pub fn passed() -> Vec<String> {
    #[cfg(feature = "failpoints")]
    {
        armed::passed()
    }
    #[cfg(not(feature = "failpoints"))]
    {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let point: Failpoint = "dead_letter:release:before:12".parse().expect("parses");
        assert_eq!(
            point,
            Failpoint {
                step: "dead_letter".into(),
                write: "release".into(),
                when: When::Before,
                n: 12,
            }
        );
        assert_eq!(point.to_string(), "dead_letter:release:before:12");
    }

    #[test]
    fn malformed_names_say_what_is_wrong() {
        for (value, problem) in [
            ("", "1 parts"),
            ("process:claim:after", "3 parts"),
            ("process:claim:after:1:2", "5 parts"),
            (
                "process:claim:during:1",
                "side \"during\" is not before or after",
            ),
            (
                "process:claim:after:0",
                "occurrence \"0\" is not a number from 1",
            ),
            (
                "process:claim:after:x",
                "occurrence \"x\" is not a number from 1",
            ),
            (
                "process:claim:after:-1",
                "occurrence \"-1\" is not a number from 1",
            ),
            (
                "Process:claim:after:1",
                "step \"Process\" is not a lowercase word",
            ),
            ("process::after:1", "write \"\" is not a lowercase word"),
        ] {
            let err = value.parse::<Failpoint>().expect_err(value);
            assert_eq!(err.value, value);
            assert!(
                err.problem.starts_with(problem),
                "{value}: {} does not start with {problem}",
                err.problem
            );
            assert!(
                err.to_string()
                    .contains("expected <step>:<write>:<before|after>:<n>")
            );
        }
    }

    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn without_the_feature_points_are_not_recorded() {
        hit("process", "claim", When::After);
        assert!(passed().is_empty());
    }
}
