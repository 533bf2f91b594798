//! PostgreSQL connection URLs as holdfast shows them. The password sits in the
//! user info (`postgres://user:PASSWORD@host/db`) or in a `password=` query
//! parameter; [`redact_url`] replaces it by `***`, [`secrets`] lists every form in
//! which it may appear in a message, and [`scrub`] removes those forms from one.
//!
//! Passwords are often pasted unescaped, so the user info does not end at the
//! first `/`, `?` or `#` as RFC 3986 (and the driver's URL parser) would have it:
//! it ends at the last `@` that can end a user info (see [`Parts::parse`]). This
//! relies on holdfast URLs never holding a raw `@` in a host, port or path, nor in
//! a query value other than a password's.

use std::ops::Range;

/// The schemes of PostgreSQL URLs (ASCII case-insensitive, as the driver reads them).
const SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

/// What a password is replaced by.
const MASK: &str = "***";

/// Where the passwords of a PostgreSQL URL sit, as byte ranges of the URL.
#[derive(Debug)]
struct Parts {
    /// Where the host part starts: after the user info's `@`, else after `://`.
    host: usize,
    /// The user info's password (after its first `:`), if it has one.
    password: Option<Range<usize>>,
    /// The values of the `password=` query parameters.
    query_passwords: Vec<Range<usize>>,
}

impl Parts {
    /// Cuts `url`; `None` when it is not a `postgres://` or `postgresql://` URL.
    ///
    /// The user info ends at the last `@` after `://` whose text before it can be
    /// a user info: a user name (before the first `:`) without a raw `@`, `/`, `?`
    /// or `#`, and a password that does not contain `?password=` or `&password=`.
    /// The second condition skips an `@` inside a `password=` query value when a
    /// port or path lies before it (`postgres://h:5432/db?password=a@b`), the first
    /// one when only a host does (`postgres://u@h/db?password=a@b`). The query is
    /// everything after the first `?` of the host part.
    fn parse(url: &str) -> Option<Parts> {
        let start = SCHEMES
            .iter()
            .find(|scheme| {
                url.get(..scheme.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
            })?
            .len();
        let rest = &url[start..];
        let at = rest
            .match_indices('@')
            .map(|(i, _)| i)
            .rev()
            .find(|&i| can_be_user_info(&rest[..i]));
        let (host, password) = match at {
            Some(at) => (
                start + at + 1,
                rest[..at]
                    .find(':')
                    .map(|colon| start + colon + 1..start + at),
            ),
            None => (start, None),
        };
        let query_passwords = url[host..]
            .find('?')
            .map_or_else(Vec::new, |q| query_passwords(url, host + q + 1));
        Some(Parts {
            host,
            password,
            query_passwords,
        })
    }
}

/// Whether `info`, the text between `://` and an `@`, can be a user info (see
/// [`Parts::parse`]).
fn can_be_user_info(info: &str) -> bool {
    let (user, password) = info.split_once(':').unwrap_or((info, ""));
    let password = password.to_ascii_lowercase();
    !user.contains(['@', '/', '?', '#'])
        && !password.contains("?password=")
        && !password.contains("&password=")
}

/// The value ranges of the `password=` parameters of the query that starts at
/// byte `start` of `url` (just after its `?`). A segment between two `&` that is
/// not `name=…` continues the value before it: it is a raw `&` in a password.
fn query_passwords(url: &str, start: usize) -> Vec<Range<usize>> {
    let mut values: Vec<Range<usize>> = Vec::new();
    let mut in_password = false;
    let mut pos = start;
    for segment in url[start..].split('&') {
        let end = pos + segment.len();
        match param_name(segment) {
            Some(name) => {
                in_password =
                    percent_decode(&name.replace('+', " ")).eq_ignore_ascii_case("password");
                if in_password {
                    values.push(pos + name.len() + 1..end);
                }
            }
            None => {
                if let Some(value) = values.last_mut().filter(|_| in_password) {
                    value.end = end;
                }
            }
        }
        pos = end + 1;
    }
    values
}

/// The name of a `name=value` query segment; `None` when the segment has no `=`
/// or what precedes it is not a parameter name (ASCII letters, digits and
/// `_ - . [ ] % +`).
pub(crate) fn param_name(segment: &str) -> Option<&str> {
    let (name, _) = segment.split_once('=')?;
    let is_name = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.[]%+".contains(&b));
    is_name.then_some(name)
}

/// `text` with its `%XX` sequences decoded. An invalid sequence stays as written;
/// bytes that are not UTF-8 become U+FFFD.
pub(crate) fn percent_decode(text: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', high, low]) => hex(*high).zip(hex(*low)),
            _ => None,
        };
        match escaped {
            Some((high, low)) => {
                out.push(high * 16 + low);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the host part of `url` starts (after the user info's `@`, else after
/// `://`), the user info ending where [`redact_url`] ends it; `None` when `url`
/// is not a `postgres://` or `postgresql://` URL.
pub(crate) fn host_start(url: &str) -> Option<usize> {
    Parts::parse(url).map(|parts| parts.host)
}

/// `url` with the password of its user info and every `password=` query value
/// replaced by `***`; user, host, port, path and the other parameters are kept.
/// A URL that is not `postgres://` or `postgresql://` is returned as it is.
///
/// The result depends only on the URL's other parts, never on the password's
/// characters, so it contains the password only where those parts spell it.
/// This holds for any password of printable ASCII in the user info, raw or
/// percent-encoded, that does not contain `?password=` or `&password=`; and for
/// any `password=` value in which every raw `&` is followed by something other
/// than `name=` — provided the host, port, path and other parameters hold no raw
/// `@`.
pub fn redact_url(url: &str) -> String {
    let Some(parts) = Parts::parse(url) else {
        return url.to_owned();
    };
    let mut shown = String::with_capacity(url.len());
    let mut pos = 0;
    for range in parts.password.into_iter().chain(parts.query_passwords) {
        shown.push_str(&url[pos..range.start]);
        shown.push_str(MASK);
        pos = range.end;
    }
    shown.push_str(&url[pos..]);
    shown
}

/// `url` with its database (the path) replaced by `name`, user info and query
/// kept. The user info ends where [`redact_url`] ends it, so a password holding
/// `/` or `?` stays whole.
pub fn with_database(url: &str, name: &str) -> String {
    let host = Parts::parse(url).map_or_else(|| url.find("://").map_or(0, |i| i + 3), |p| p.host);
    let rest = &url[host..];
    let path = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let query = rest.find('?').map_or("", |q| &rest[q..]);
    format!("{}/{name}{query}", &url[..host + path])
}

/// Every form in which the password of `url` (user info and `password=` values)
/// may appear in a message: as written, percent-decoded, decoded as a query value
/// (`+` is a space), and each of those as `{:?}` shows it. Longest first, without
/// duplicates or empty strings; empty when `url` has no password or is not a
/// PostgreSQL URL.
pub(crate) fn secrets(url: &str) -> Vec<String> {
    let Some(parts) = Parts::parse(url) else {
        return Vec::new();
    };
    let mut forms = Vec::new();
    if let Some(range) = parts.password {
        let raw = &url[range];
        forms.push(raw.to_owned());
        forms.push(percent_decode(raw));
    }
    for range in parts.query_passwords {
        let raw = &url[range];
        forms.push(raw.to_owned());
        forms.push(percent_decode(raw));
        forms.push(percent_decode(&raw.replace('+', " ")));
    }
    let debugged: Vec<String> = forms
        .iter()
        .filter_map(|form| {
            let quoted = format!("{form:?}");
            Some(quoted.strip_prefix('"')?.strip_suffix('"')?.to_owned())
        })
        .collect();
    forms.extend(debugged);
    forms.retain(|form| !form.is_empty());
    forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    forms.dedup();
    forms
}

/// `text` with every non-empty form in `secrets` replaced by `***`, longest first,
/// so a short form inside a longer one leaves no tail. Where a mask and its
/// neighbours spell a form again (the password `**x` before an `x`), that form is
/// then removed outright until none is left: each such pass shortens the text,
/// so it ends, and the result never contains a form. Without secrets the text is
/// returned unchanged.
///
/// Every occurrence goes, however short the password: with the one-character
/// password `a`, every `a` of the message becomes `***`. A mangled message is the
/// lesser harm; a leaked password is the greater.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut forms: Vec<&str> = secrets
        .iter()
        .map(String::as_str)
        .filter(|form| !form.is_empty())
        .collect();
    forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    let mut clean = text.to_owned();
    for form in &forms {
        if clean.contains(form) {
            clean = clean.replace(form, MASK);
        }
    }
    while let Some(form) = forms.iter().find(|form| clean.contains(**form)) {
        clean = clean.replace(form, "");
    }
    clean
}

/// Whether the user-info password of `url` holds a character that must be
/// percent-encoded for the URL to mean what it seems to (`/`, `?`, `#` or `@`):
/// a URL parser ends the user info at the first of `/ ? #`, so an unescaped one
/// would turn the rest of the password into a host name or a query parameter.
pub(crate) fn unescaped_in_password(url: &str) -> bool {
    Parts::parse(url)
        .and_then(|parts| parts.password)
        .is_some_and(|password| url[password].contains(['/', '?', '#', '@']))
}

/// `text` with every form of `url`'s password removed (see [`redact_url`] for
/// where a password is found): for the messages of a PostgreSQL client other than
/// [`crate::PgBackend`] given the same URL.
pub fn scrub_password(text: &str, url: &str) -> String {
    scrub(text, &secrets(url))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::{ConnectError, HostOutcome, HostTried, PgBackend, PgOptions};

    fn strings(forms: &[&str]) -> Vec<String> {
        forms.iter().map(|f| (*f).to_owned()).collect()
    }

    #[test]
    fn reserved_characters_in_a_password_are_found() {
        assert!(unescaped_in_password("postgres://u:p@ss#w/rd?x@h:5432/db"));
        assert!(unescaped_in_password("postgres://u:12?x=s@h/db"));
        assert!(!unescaped_in_password("postgres://u:%40%23@h/db"));
        assert!(!unescaped_in_password("postgres://u@h/db?password=a@b"));
        assert!(!unescaped_in_password("postgres://h/db"));
    }

    #[test]
    fn nasty_passwords_are_redacted_whole() {
        let url = "postgres://u:p@ss#w/rd?x@h:5432/db";
        assert_eq!(redact_url(url), "postgres://u:***@h:5432/db");
        assert_eq!(secrets(url), strings(&["p@ss#w/rd?x"]));

        let url = "postgres://u:%40%23@h/db";
        assert_eq!(redact_url(url), "postgres://u:***@h/db");
        assert_eq!(secrets(url), strings(&["%40%23", "@#"]));

        let url = "postgres://u@h/db?password=a%26b&sslmode=disable";
        assert_eq!(
            redact_url(url),
            "postgres://u@h/db?password=***&sslmode=disable"
        );
        assert_eq!(secrets(url), strings(&["a%26b", "a&b"]));
    }

    #[test]
    fn passwords_are_found_in_user_info_and_query() {
        let cases = [
            (
                "postgres://app:hunter2@db.example:5432/holdfast",
                "postgres://app:***@db.example:5432/holdfast",
            ),
            (
                "postgres://app@db/holdfast?password=hunter2&sslmode=require",
                "postgres://app@db/holdfast?password=***&sslmode=require",
            ),
            (
                "postgres://app:p%40ss@h/db?application_name=x",
                "postgres://app:***@h/db?application_name=x",
            ),
            // An `@` in a query password, behind a host, a port or a path.
            (
                "postgres://u@h/db?password=a@b",
                "postgres://u@h/db?password=***",
            ),
            (
                "postgres://h:5432?password=a@b",
                "postgres://h:5432?password=***",
            ),
            (
                "postgres://h/db?password=x:a@b",
                "postgres://h/db?password=***",
            ),
            (
                "postgres://u:p@h/db?sslmode=disable&password=a@b",
                "postgres://u:***@h/db?sslmode=disable&password=***",
            ),
            // A raw `&` in a query password: what follows is no parameter.
            (
                "postgres://h/db?password=a&b&&c&sslmode=disable",
                "postgres://h/db?password=***&sslmode=disable",
            ),
            // Case and encoding as the driver reads them.
            (
                "POSTGRESQL://u:p@h/db?PassWord=x&pass%77ord=y",
                "POSTGRESQL://u:***@h/db?PassWord=***&pass%77ord=***",
            ),
            ("postgres://u:@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgres://h/db", "postgres://h/db"),
            ("postgres://[::1]:5432/db", "postgres://[::1]:5432/db"),
            // Not PostgreSQL URLs: left alone.
            ("garbage", "garbage"),
            ("sqlite:///tmp/a:b@c.db", "sqlite:///tmp/a:b@c.db"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        assert_eq!(secrets("postgres://u:pw@h/db"), strings(&["pw"]));
        assert_eq!(
            secrets("postgres://u@h/db?sslmode=disable&password=pw2"),
            strings(&["pw2"])
        );
        assert_eq!(secrets("postgres://u@h/db"), Vec::<String>::new());
        assert_eq!(secrets("postgres://u:@h/db"), Vec::<String>::new());
    }

    #[test]
    fn secrets_cover_every_decoding() {
        // An invalid escape stays literal; bytes that are not UTF-8 are replaced.
        assert_eq!(secrets("postgres://u:%zz%4@h/db"), strings(&["%zz%4"]));
        assert_eq!(
            secrets("postgres://u:a%FF@h/db"),
            strings(&["a%FF", "a\u{fffd}"])
        );
        // A query value: `+` is a space to the driver.
        assert_eq!(
            secrets("postgres://h/db?password=a+b%21"),
            strings(&["a+b%21", "a b!", "a+b!"])
        );
        // As `{:?}` shows it.
        assert_eq!(
            secrets(r#"postgres://u:a"b\c@h/db"#),
            strings(&[r#"a\"b\\c"#, r#"a"b\c"#])
        );
    }

    #[test]
    fn scrub_removes_every_form_longest_first() {
        assert_eq!(
            scrub("a hunter2 b hunter2", &strings(&["hunter2"])),
            "a *** b ***"
        );
        // Shortest first would leave the `2` of `pw2`.
        assert_eq!(scrub("pw2 and pw", &strings(&["pw", "pw2"])), "*** and ***");
        assert_eq!(
            scrub("x p%40ss p@ss", &secrets("postgres://u:p%40ss@h/db")),
            "x *** ***"
        );
        assert_eq!(scrub("unchanged", &[]), "unchanged");
        assert_eq!(scrub("unchanged", &strings(&[""])), "unchanged");
        // Masks that spell the secret again are removed.
        assert_eq!(scrub("***xx", &strings(&["***x"])), "");
        assert_eq!(scrub("a*b", &strings(&["*"])), "ab");
        // A one-character password mangles the message rather than leak.
        assert_eq!(
            scrub("cannot connect", &strings(&["a"])),
            "c***nnot connect"
        );
    }

    #[test]
    fn databases_are_replaced_keeping_user_info_and_query() {
        assert_eq!(
            with_database("postgres://u:p/s?s#x@h:5432/app?sslmode=disable", "x"),
            "postgres://u:p/s?s#x@h:5432/x?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
        assert_eq!(with_database("postgresql://h/db", "x"), "postgresql://h/x");
        assert_eq!(
            with_database("postgres://h?password=a@b", "x"),
            "postgres://h/x?password=a@b"
        );
    }

    /// Printable ASCII, with the characters that end URL parts drawn more often.
    fn password() -> impl Strategy<Value = String> {
        let char = prop_oneof![
            3 => (0x20u8..=0x7e).prop_map(char::from),
            2 => proptest::sample::select(b"@#/?%:&=+".to_vec()).prop_map(char::from),
        ];
        proptest::collection::vec(char, 1..=24)
            .prop_map(|chars| chars.into_iter().collect::<String>())
            .prop_filter("contains ?password= or &password=", |p| {
                let p = p.to_ascii_lowercase();
                !p.contains("?password=") && !p.contains("&password=")
            })
    }

    /// Every byte but ASCII letters and digits as `%XX`.
    fn encoded(text: &str) -> String {
        text.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    /// Whether a raw `&` in `value` is followed by `name=`, which makes it end the
    /// value (the one case a raw query value cannot say).
    fn starts_a_parameter(value: &str) -> bool {
        value.split('&').skip(1).any(|segment| {
            segment.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-.[]%+".contains(&b))
            })
        })
    }

    /// Where a password goes.
    #[derive(Debug, Clone, Copy)]
    enum Place {
        UserInfo,
        UserInfoEncoded,
        Query,
        QueryEncoded,
    }

    fn place() -> impl Strategy<Value = Place> {
        prop_oneof![
            Just(Place::UserInfo),
            Just(Place::UserInfoEncoded),
            Just(Place::Query),
            Just(Place::QueryEncoded),
        ]
    }

    /// The URL with `password` at `place`, and the same URL redacted.
    fn url_with(
        place: Place,
        user: &str,
        host: &str,
        tail: &str,
        password: &str,
    ) -> (String, String) {
        let (user_info, value) = match place {
            Place::UserInfo => (format!("{user}:{password}@"), None),
            Place::UserInfoEncoded => (format!("{user}:{}@", encoded(password)), None),
            Place::Query => (format!("{user}@"), Some(password.to_owned())),
            Place::QueryEncoded => (format!("{user}@"), Some(encoded(password))),
        };
        let Some(value) = value else {
            let shown_info = format!("{user}:***@");
            return (
                format!("postgres://{user_info}{host}{tail}"),
                format!("postgres://{shown_info}{host}{tail}"),
            );
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let (before, after) = match query {
            "" => (String::new(), String::new()),
            q => (format!("{q}&"), format!("&{q}")),
        };
        (
            format!("postgres://{user_info}{host}{path}?{before}password={value}{after}"),
            format!("postgres://{user_info}{host}{path}?{before}password=***{after}"),
        )
    }

    proptest! {
        #[test]
        fn redaction_never_depends_on_the_password(
            place in place(),
            password in password(),
            user in "[a-z][a-z0-9_]{0,7}",
            host in prop_oneof![
                Just("127.0.0.1"), Just("db.example"), Just("[::1]"), Just("h"),
                Just("h1:5432,[::1]"), Just("db1,db2"),
            ],
            tail in prop_oneof![
                Just(""), Just(":5432"), Just("/holdfast"), Just(":5432/holdfast"),
                Just("/holdfast?sslmode=disable"), Just(":1?application_name=a%40b"),
            ],
        ) {
            prop_assume!(!matches!(place, Place::Query) || !starts_a_parameter(&password));
            let (url, shown) = url_with(place, &user, host, tail, &password);
            let redacted = redact_url(&url);
            // The password's characters, and only they, became `***`: the result is
            // the same whatever the password, so it shows none of it.
            prop_assert_eq!(&redacted, &shown);
            prop_assert!(redacted.contains(host));
            let forms = secrets(&url);
            prop_assert!(forms.contains(&password), "{forms:?}");
            for form in &forms {
                let scrubbed = scrub(&format!("<{form}>{url}"), &forms);
                prop_assert!(!scrubbed.contains(form.as_str()), "{form:?} in {scrubbed:?}");
            }
        }
    }

    /// The public text of `err`: its message with the driver's detail left out,
    /// and that detail (one per host tried: each is scrubbed on its own).
    fn public_text(err: &ConnectError) -> Option<(String, Vec<String>)> {
        let (public, detail) = match err {
            ConnectError::InvalidUrl { url, reason } => (
                ConnectError::InvalidUrl {
                    url: url.clone(),
                    reason: String::new(),
                },
                reason,
            ),
            ConnectError::Unavailable { url, detail } => (
                ConnectError::Unavailable {
                    url: url.clone(),
                    detail: String::new(),
                },
                detail,
            ),
            ConnectError::Timeout {
                url,
                timeout_ms,
                detail,
            } => (
                ConnectError::Timeout {
                    url: url.clone(),
                    timeout_ms: *timeout_ms,
                    detail: String::new(),
                },
                detail,
            ),
            ConnectError::NoHost { url, target, tried } => {
                // The drivers' scrubbed messages only: holdfast's own wording
                // around them ("failed: ") is checked with the whole text below.
                let details = tried
                    .iter()
                    .map(|t| match &t.outcome {
                        HostOutcome::Failed(d) | HostOutcome::Busy(d) => d.clone(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>();
                let blank = tried
                    .iter()
                    .map(|t| HostTried {
                        host: t.host.clone(),
                        outcome: HostOutcome::Failed(String::new()),
                    })
                    .collect();
                let public = ConnectError::NoHost {
                    url: url.clone(),
                    target: *target,
                    tried: blank,
                };
                return Some((public.to_string(), details));
            }
            _ => return None,
        };
        Some((public.to_string(), vec![detail.clone()]))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Nothing listens on port 1 (nor 2): every URL fails fast, as an invalid
        /// URL, a refused connection, no host that takes it (two hosts) or (when
        /// the driver reads a host out of an unescaped password) a timeout, and no
        /// message shows the password.
        #[test]
        fn connect_errors_never_show_the_password(
            place in place(),
            password in password(),
            host in prop_oneof![Just("127.0.0.1"), Just("127.0.0.1:2,127.0.0.1")],
        ) {
            prop_assume!(!matches!(place, Place::Query) || !starts_a_parameter(&password));
            let (url, shown) = url_with(place, "app", host, ":1/holdfast", &password);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let options = PgOptions {
                connect_timeout: Duration::from_millis(200),
                ..PgOptions::default()
            };
            let err = runtime
                .block_on(PgBackend::connect(&url, options))
                .err();
            // A host lookup the driver started may still run: do not wait for it.
            runtime.shutdown_background();
            let err = err.expect("nothing listens on port 1");
            let Some((public, details)) = public_text(&err) else {
                return Err(TestCaseError::fail(format!("unexpected error {err:?}")));
            };
            let url_field = match &err {
                ConnectError::InvalidUrl { url, .. }
                | ConnectError::Unavailable { url, .. }
                | ConnectError::NoHost { url, .. }
                | ConnectError::Timeout { url, .. } => url.as_str(),
                _ => "",
            };
            prop_assert_eq!(url_field, shown.as_str());
            let forms = secrets(&url);
            for (form, detail) in forms.iter().flat_map(|f| details.iter().map(move |d| (f, d))) {
                prop_assert!(!detail.contains(form.as_str()), "{form:?} in {detail:?}");
            }
            // The whole message: unless holdfast's wording and the public parts of
            // the URL spell the password (alone, or running into the driver's
            // scrubbed detail), it is not there.
            let text = err.to_string();
            let spelled = public.contains(&password)
                || (1..password.len()).any(|k| {
                    public.ends_with(&password[..k])
                        && details.iter().any(|d| d.starts_with(&password[k..]))
                });
            if password.len() >= 4 && !spelled {
                prop_assert!(!text.contains(&password), "password {password:?} in {text}");
            }
        }
    }
}
