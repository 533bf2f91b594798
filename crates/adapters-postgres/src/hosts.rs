//! Multi-host URLs in libpq's syntax, and `target_session_attrs`.
//!
//! `postgres://app@h1:5432,h2:5433/holdfast?target_session_attrs=read-write`
//! names the servers of one cluster, in the order a new connection tries them,
//! and the kind of session it must get; `?host=h1,h2&port=5432,5433` says the
//! same in the query (one port for all hosts, or one per host). The driver knows
//! one host per URL (launchbadge/sqlx#2290), so [`Hosts::parse`] cuts the URL
//! into one set of connect options per host, each parsed by the driver from the
//! URL with that host alone: every other part (user, password, database,
//! `sslmode`, ...) means what it means for one host. `crate::route` walks them.
//!
//! A URL with one host and no `target_session_attrs` goes to the driver as it
//! is and connects exactly as before (no check of the server's role), except
//! that an IPv6 address loses its brackets, which the driver would otherwise
//! look up as a host name (and fail). With more
//! than one host the default is `read-write`, not libpq's `any`: holdfast writes
//! on almost every call, and a standby cannot take them.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use crate::route::ServerRole;
use crate::url::{host_start, param_name, percent_decode};

/// The kind of session a connection must get (libpq's `target_session_attrs`).
/// holdfast takes the values that can serve its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    /// Whatever server takes the connection; its role is not checked (`any`).
    Any,
    /// A server whose sessions may write: `SHOW transaction_read_only` is `off`,
    /// so neither a standby nor a primary with `default_transaction_read_only`
    /// on (`read-write`).
    ReadWrite,
    /// A server not in recovery: `pg_is_in_recovery()` is false, whatever its
    /// `default_transaction_read_only` (`primary`).
    Primary,
}

impl TargetSessionAttrs {
    /// The value as the URL spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::Primary => "primary",
        }
    }

    /// Whether a server in `role` gives this kind of session.
    pub fn accepts(self, role: ServerRole) -> bool {
        match self {
            TargetSessionAttrs::Any => true,
            TargetSessionAttrs::ReadWrite => !role.in_recovery && !role.read_only,
            TargetSessionAttrs::Primary => !role.in_recovery,
        }
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TargetSessionAttrs {
    type Err = HostsError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "any" => Ok(TargetSessionAttrs::Any),
            "read-write" => Ok(TargetSessionAttrs::ReadWrite),
            "primary" => Ok(TargetSessionAttrs::Primary),
            "read-only" | "standby" | "prefer-standby" => Err(HostsError::ReadOnlyTarget {
                value: value.to_owned(),
            }),
            _ => Err(HostsError::UnknownTarget {
                value: value.to_owned(),
            }),
        }
    }
}

/// Why the hosts of a URL cannot be used. Messages quote host names, ports and
/// the `target_session_attrs` value, never a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostsError {
    /// `target_session_attrs` has a value libpq does not define.
    #[error(
        "target_session_attrs={value:?} is not a session kind; expected read-write, primary or any"
    )]
    UnknownTarget {
        /// The value given.
        value: String,
    },
    /// `target_session_attrs` asks for a read-only session (`read-only`,
    /// `standby`, `prefer-standby`), which cannot take holdfast's writes.
    #[error(
        "target_session_attrs={value:?} asks for a read-only session, but holdfast writes; \
         expected read-write, primary or any"
    )]
    ReadOnlyTarget {
        /// The value given.
        value: String,
    },
    /// A host of a list is empty (`h1,,h2`, a trailing comma).
    #[error(
        "host {position} of the list is empty; expected a host name, an IPv4 address, \
         an [IPv6] address or a socket directory"
    )]
    EmptyHost {
        /// Its place in the list, from 1.
        position: usize,
    },
    /// An IPv6 address with a port but without brackets (`::1:5432`).
    #[error(
        "host {host:?} holds more than one ':'; expected an IPv6 address in brackets, [::1]:5432"
    )]
    UnbracketedIpv6 {
        /// The host as written.
        host: String,
    },
    /// A `[` without its `]`.
    #[error("host {host:?} opens '[' without closing it; expected [address] or [address]:port")]
    UnclosedBracket {
        /// The host as written.
        host: String,
    },
    /// A port that is not a number from 1 to 65535.
    #[error("port {port:?} of host {host:?} is not a port; expected a number from 1 to 65535")]
    BadPort {
        /// The host it belongs to.
        host: String,
        /// The port as written.
        port: String,
    },
    /// `port=` lists neither one port nor one per host.
    #[error(
        "the URL names {hosts} host(s) and {ports} ports; expected one port for all hosts, or one per host"
    )]
    PortCount {
        /// Hosts named.
        hosts: usize,
        /// Ports listed.
        ports: usize,
    },
    /// Hosts or ports listed both before the path and in the query.
    #[error(
        "the URL lists hosts before the path and also sets host= or port= in the query; \
         expected the hosts (with their ports) in one place"
    )]
    HostsTwice,
}

/// Why [`Hosts::parse`] failed: the hosts, or the driver refusing the URL of one
/// host (its message may hold the password: the caller scrubs it).
#[derive(Debug)]
pub(crate) enum ParseError {
    Hosts(HostsError),
    Driver(sqlx::Error),
}

impl From<HostsError> for ParseError {
    fn from(e: HostsError) -> Self {
        ParseError::Hosts(e)
    }
}

/// One server of the URL.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// `name:port`, `[address]:port` or `socket-directory:port`, as messages show it.
    pub(crate) shown: String,
    /// The driver's options for this host alone, before holdfast's session settings.
    pub(crate) options: PgConnectOptions,
}

/// The servers of a URL, in order, and the kind of session wanted.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    pub(crate) hosts: Vec<Host>,
    pub(crate) target: TargetSessionAttrs,
}

impl Hosts {
    /// Cuts `url` into its hosts (see the module docs). A URL that is not a
    /// PostgreSQL URL is handed to the driver, which says why.
    pub(crate) fn parse(url: &str) -> Result<Hosts, ParseError> {
        let Some(start) = host_start(url) else {
            return single(url, TargetSessionAttrs::Any);
        };
        let rest = &url[start..];
        let authority_end = start + rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &url[start..authority_end];
        let query = Query::of(url, authority_end);
        let target = query.value("target_session_attrs");
        let host_param = query.value("host");
        let port_param = query.value("port");
        let listed_hosts = host_param.as_ref().filter(|v| v.contains(','));
        let listed_ports = port_param.as_ref().filter(|v| v.contains(','));

        let entries = if authority.contains(',') {
            if host_param.is_some() || port_param.is_some() {
                return Err(HostsError::HostsTwice.into());
            }
            authority
                .split(',')
                .enumerate()
                .map(|(i, text)| Entry::written(text, i + 1))
                .collect::<Result<Vec<_>, _>>()?
        } else if let Some(list) = listed_hosts {
            if !authority.is_empty() {
                return Err(HostsError::HostsTwice.into());
            }
            let names: Vec<&str> = list.split(',').collect();
            let ports: Vec<&str> = port_param
                .as_deref()
                .map_or(Vec::new(), |p| p.split(',').collect());
            if ports.len() > 1 && ports.len() != names.len() {
                return Err(HostsError::PortCount {
                    hosts: names.len(),
                    ports: ports.len(),
                }
                .into());
            }
            names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let port = match ports.len() {
                        0 => "",
                        1 => ports[0],
                        _ => ports[i],
                    };
                    Entry::listed(name, port, i + 1)
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            if let Some(ports) = listed_ports {
                return Err(HostsError::PortCount {
                    hosts: 1,
                    ports: ports.split(',').count(),
                }
                .into());
            }
            // One host: as before, unless a session kind is asked for.
            return match target {
                None => single(url, TargetSessionAttrs::Any),
                Some(value) => {
                    let target = value.parse()?;
                    single(&query.without(url, &["target_session_attrs"]), target)
                }
            };
        };
        let target = target
            .map(|value| value.parse())
            .transpose()?
            .unwrap_or(TargetSessionAttrs::ReadWrite);
        let dropped: &[&str] = if listed_hosts.is_some() {
            &["target_session_attrs", "host", "port"]
        } else {
            &["target_session_attrs"]
        };
        let tail_url = query.without(url, dropped);
        let tail = &tail_url[authority_end..];
        let hosts = entries
            .iter()
            .map(|entry| {
                let one = format!("{}{}{tail}", &url[..start], entry.authority());
                let mut options = PgConnectOptions::from_str(&one).map_err(ParseError::Driver)?;
                if entry.ipv6 {
                    options = options.host(&entry.name);
                }
                Ok(Host {
                    shown: shown(&options, entry.ipv6),
                    options,
                })
            })
            .collect::<Result<Vec<_>, ParseError>>()?;
        Ok(Hosts { hosts, target })
    }

    /// The hosts as messages show them: `h1:5432,h2:5433`.
    #[cfg(test)]
    fn shown(&self) -> String {
        self.hosts
            .iter()
            .map(|h| h.shown.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The one host of `url`, parsed by the driver as before; an IPv6 address loses
/// its brackets, which the driver would otherwise look up as a host name.
fn single(url: &str, target: TargetSessionAttrs) -> Result<Hosts, ParseError> {
    let mut options = PgConnectOptions::from_str(url).map_err(ParseError::Driver)?;
    let bracketed = options
        .get_host()
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .map(str::to_owned);
    let ipv6 = bracketed.is_some();
    if let Some(address) = bracketed {
        options = options.host(&address);
    }
    Ok(Hosts {
        hosts: vec![Host {
            shown: shown(&options, ipv6),
            options,
        }],
        target,
    })
}

fn shown(options: &PgConnectOptions, ipv6: bool) -> String {
    let port = options.get_port();
    match options.get_socket() {
        Some(socket) => format!("{}:{port}", socket.display()),
        None if ipv6 => format!("[{}]:{port}", options.get_host()),
        None => format!("{}:{port}", options.get_host()),
    }
}

/// One host of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The host name, address (without brackets) or socket directory.
    name: String,
    ipv6: bool,
    port: Option<u16>,
}

impl Entry {
    /// A host as written before the path: `h`, `h:5432`, `[::1]`, `[::1]:5432`.
    fn written(text: &str, position: usize) -> Result<Entry, HostsError> {
        if let Some(inner) = text.strip_prefix('[') {
            let Some(close) = inner.find(']') else {
                return Err(HostsError::UnclosedBracket {
                    host: text.to_owned(),
                });
            };
            let (name, after) = (&inner[..close], &inner[close + 1..]);
            if name.is_empty() {
                return Err(HostsError::EmptyHost { position });
            }
            let port = match after.strip_prefix(':') {
                Some(port) => port_of(text, port)?,
                None if after.is_empty() => None,
                None => {
                    return Err(HostsError::BadPort {
                        host: text.to_owned(),
                        port: after.to_owned(),
                    });
                }
            };
            return Ok(Entry {
                name: name.to_owned(),
                ipv6: true,
                port,
            });
        }
        let (name, port) = match text.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err(HostsError::UnbracketedIpv6 {
                    host: text.to_owned(),
                });
            }
            Some((name, port)) => (name, port_of(name, port)?),
            None => (text, None),
        };
        if name.is_empty() {
            return Err(HostsError::EmptyHost { position });
        }
        Ok(Entry {
            name: name.to_owned(),
            ipv6: false,
            port,
        })
    }

    /// A host of a `host=` list (decoded) and its port (`""`: the default).
    fn listed(name: &str, port: &str, position: usize) -> Result<Entry, HostsError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(HostsError::EmptyHost { position });
        }
        let bare = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        Ok(Entry {
            name: bare.to_owned(),
            ipv6: bare.contains(':') && !bare.starts_with('/'),
            port: port_of(name, port.trim())?,
        })
    }

    /// The host as the authority of a one-host URL: brackets around an IPv6
    /// address, a socket directory percent-encoded (the driver decodes it).
    fn authority(&self) -> String {
        let host = if self.ipv6 {
            format!("[{}]", self.name)
        } else if self.name.starts_with('/') {
            self.name
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                        char::from(b).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect()
        } else {
            self.name.clone()
        };
        match self.port {
            Some(port) => format!("{host}:{port}"),
            None => host,
        }
    }
}

/// `port` of `host` (`""`: none given).
fn port_of(host: &str, port: &str) -> Result<Option<u16>, HostsError> {
    if port.is_empty() {
        return Ok(None);
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(p)),
        _ => Err(HostsError::BadPort {
            host: host.to_owned(),
            port: port.to_owned(),
        }),
    }
}

/// The query of a URL as parameters: each a `name=value` segment with the
/// segments after it that are not `name=...` (a raw `&` in a value, as in a
/// password; see `url.rs`).
#[derive(Debug)]
struct Query {
    /// Where the query starts (after its `?`); `None` without one.
    start: Option<usize>,
    params: Vec<Param>,
}

#[derive(Debug)]
struct Param {
    name: String,
    value: String,
    /// The segment and its continuations, as bytes of the URL.
    range: Range<usize>,
}

impl Query {
    /// The query of `url`: everything after the first `?` from `from` on.
    fn of(url: &str, from: usize) -> Query {
        let Some(q) = url[from..].find('?').map(|q| from + q + 1) else {
            return Query {
                start: None,
                params: Vec::new(),
            };
        };
        let mut params: Vec<Param> = Vec::new();
        let mut pos = q;
        for segment in url[q..].split('&') {
            let end = pos + segment.len();
            match param_name(segment) {
                Some(name) => params.push(Param {
                    name: percent_decode(&name.replace('+', " ")),
                    value: percent_decode(&segment[name.len() + 1..].replace('+', " ")),
                    range: pos..end,
                }),
                None => match params.last_mut() {
                    Some(last) => last.range.end = end,
                    // Text before the first parameter: kept as it is.
                    None => params.push(Param {
                        name: String::new(),
                        value: String::new(),
                        range: pos..end,
                    }),
                },
            }
            pos = end + 1;
        }
        Query {
            start: Some(q),
            params,
        }
    }

    /// The decoded value of the last parameter `name` (a later one overrides,
    /// as for the driver).
    fn value(&self, name: &str) -> Option<String> {
        self.params
            .iter()
            .rev()
            .find(|p| p.name == name)
            .map(|p| p.value.clone())
    }

    /// `url` without the parameters named in `names` (and without its `?` when
    /// none is left).
    fn without(&self, url: &str, names: &[&str]) -> String {
        let Some(start) = self.start else {
            return url.to_owned();
        };
        let kept: Vec<&str> = self
            .params
            .iter()
            .filter(|p| p.name.is_empty() || !names.contains(&p.name.as_str()))
            .map(|p| &url[p.range.clone()])
            .collect();
        let head = &url[..start - 1];
        if kept.is_empty() {
            head.to_owned()
        } else {
            format!("{head}?{}", kept.join("&"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(url: &str) -> Hosts {
        match Hosts::parse(url) {
            Ok(hosts) => hosts,
            Err(ParseError::Hosts(e)) => panic!("{url}: {e}"),
            Err(ParseError::Driver(e)) => panic!("{url}: driver: {e}"),
        }
    }

    fn error(url: &str) -> HostsError {
        match Hosts::parse(url) {
            Err(ParseError::Hosts(e)) => e,
            other => panic!("{url}: expected a hosts error, got {other:?}"),
        }
    }

    /// (shown, user, database, password) of each host.
    fn summary(url: &str) -> Vec<(String, String, Option<String>, bool)> {
        hosts(url)
            .hosts
            .iter()
            .map(|h| {
                (
                    h.shown.clone(),
                    h.options.get_username().to_owned(),
                    h.options.get_database().map(str::to_owned),
                    // PgConnectOptions keeps the password private; its URL shows it.
                    format!("{:?}", h.options).contains("hunter2"),
                )
            })
            .collect()
    }

    #[test]
    fn hosts_are_listed_in_order_with_their_ports() {
        let url = "postgres://app:hunter2@h1:5432,h2:5433,[::1]:6543,[fe80::2],h3/holdfast\
                   ?target_session_attrs=primary&sslmode=disable";
        let parsed = hosts(url);
        assert_eq!(parsed.target, TargetSessionAttrs::Primary);
        assert_eq!(
            parsed.shown(),
            "h1:5432,h2:5433,[::1]:6543,[fe80::2]:5432,h3:5432"
        );
        for (_, user, database, has_password) in summary(url) {
            assert_eq!(user, "app");
            assert_eq!(database.as_deref(), Some("holdfast"));
            assert!(has_password);
        }
        // The driver connects to the address, not to "[::1]".
        assert_eq!(parsed.hosts[2].options.get_host(), "::1");
        assert_eq!(parsed.hosts[2].options.get_port(), 6543);
    }

    #[test]
    fn several_hosts_default_to_read_write_and_one_host_to_no_check() {
        assert_eq!(
            hosts("postgres://u@h1,h2/db").target,
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(hosts("postgres://u@h1/db").target, TargetSessionAttrs::Any);
        let one = hosts("postgres://u@h1:5433/db?target_session_attrs=read-write");
        assert_eq!(one.target, TargetSessionAttrs::ReadWrite);
        assert_eq!(one.shown(), "h1:5433");
        assert_eq!(
            hosts("postgres://u@h1,h2/db?target_session_attrs=any").target,
            TargetSessionAttrs::Any
        );
        // IPv6 with one host too.
        assert_eq!(
            hosts("postgres://u@[::1]:5434/db").hosts[0]
                .options
                .get_host(),
            "::1"
        );
    }

    #[test]
    fn hosts_and_ports_in_the_query() {
        let parsed =
            hosts("postgres://u@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write");
        assert_eq!(parsed.shown(), "h1:5432,h2:5433");
        let one_port = hosts("postgres:///db?host=h1,%5B::1%5D,::2&port=6000");
        assert_eq!(one_port.shown(), "h1:6000,[::1]:6000,[::2]:6000");
        assert_eq!(one_port.hosts[2].options.get_host(), "::2");
        let sockets = hosts("postgres://u@/db?host=/var/run/postgresql,h2&port=5432,5433");
        assert_eq!(
            sockets.hosts[0]
                .options
                .get_socket()
                .map(|p| p.display().to_string()),
            Some("/var/run/postgresql".to_owned())
        );
        assert_eq!(sockets.shown(), "/var/run/postgresql:5432,h2:5433");
    }

    #[test]
    fn other_parameters_reach_every_host_and_ours_none() {
        // As the driver reads them for one host (it ends a password at a raw `&`).
        let parsed = hosts(
            "postgres://u@h1,h2/db?application_name=x&target_session_attrs=primary&password=a%26b",
        );
        let alone =
            PgConnectOptions::from_str("postgres://u@h2/db?application_name=x&password=a%26b")
                .expect("driver");
        for host in &parsed.hosts {
            assert_eq!(host.options.get_application_name(), Some("x"));
            let debug = format!("{:?}", host.options);
            assert!(debug.contains("\"a&b\""), "{debug}");
        }
        assert_eq!(
            format!("{:?}", parsed.hosts[1].options),
            format!("{alone:?}")
        );
        let query = Query::of("postgres://h/db?a=1&target_session_attrs=any&b=2", 0);
        assert_eq!(
            query.without(
                "postgres://h/db?a=1&target_session_attrs=any&b=2",
                &["target_session_attrs"]
            ),
            "postgres://h/db?a=1&b=2"
        );
        let query = Query::of("postgres://h/db?target_session_attrs=any", 0);
        assert_eq!(
            query.without(
                "postgres://h/db?target_session_attrs=any",
                &["target_session_attrs"]
            ),
            "postgres://h/db"
        );
    }

    #[test]
    fn bad_lists_are_typed_errors_naming_what_was_expected() {
        let cases = [
            (
                "postgres://u@h1,h2/db?target_session_attrs=standby",
                HostsError::ReadOnlyTarget {
                    value: "standby".to_owned(),
                },
            ),
            (
                "postgres://u@h1/db?target_session_attrs=readwrite",
                HostsError::UnknownTarget {
                    value: "readwrite".to_owned(),
                },
            ),
            (
                "postgres://u@h1,,h2/db",
                HostsError::EmptyHost { position: 2 },
            ),
            ("postgres://u@h1,/db", HostsError::EmptyHost { position: 2 }),
            (
                "postgres://u@h1,[]:1/db",
                HostsError::EmptyHost { position: 2 },
            ),
            (
                "postgres://u@h1,::1:5432/db",
                HostsError::UnbracketedIpv6 {
                    host: "::1:5432".to_owned(),
                },
            ),
            (
                "postgres://u@h1,[::1:5432/db",
                HostsError::UnclosedBracket {
                    host: "[::1:5432".to_owned(),
                },
            ),
            (
                "postgres://u@h1:0,h2/db",
                HostsError::BadPort {
                    host: "h1".to_owned(),
                    port: "0".to_owned(),
                },
            ),
            (
                "postgres://u@h1:99999,h2/db",
                HostsError::BadPort {
                    host: "h1".to_owned(),
                    port: "99999".to_owned(),
                },
            ),
            (
                "postgres://u@h1,[::1]x/db",
                HostsError::BadPort {
                    host: "[::1]x".to_owned(),
                    port: "x".to_owned(),
                },
            ),
            (
                "postgres://u@/db?host=a,b,c&port=1,2",
                HostsError::PortCount { hosts: 3, ports: 2 },
            ),
            (
                "postgres://u@h/db?port=1,2",
                HostsError::PortCount { hosts: 1, ports: 2 },
            ),
            ("postgres://u@h1,h2/db?port=5432", HostsError::HostsTwice),
            ("postgres://u@h0/db?host=h1,h2", HostsError::HostsTwice),
        ];
        for (url, expected) in cases {
            let got = error(url);
            assert_eq!(got, expected, "{url}");
            let text = got.to_string();
            assert!(text.contains("expected"), "{url}: {text}");
        }
    }

    #[test]
    fn one_host_without_a_session_kind_is_the_driver_s_url() {
        let url =
            "postgres://app:p%40ss@db.example:5433/holdfast?sslmode=disable&application_name=x";
        let ours = &hosts(url).hosts[0].options;
        let theirs = PgConnectOptions::from_str(url).expect("driver");
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
    }

    #[test]
    fn target_values_round_trip() {
        for target in [
            TargetSessionAttrs::Any,
            TargetSessionAttrs::ReadWrite,
            TargetSessionAttrs::Primary,
        ] {
            assert_eq!(target.as_str().parse::<TargetSessionAttrs>(), Ok(target));
        }
        let standby = ServerRole {
            in_recovery: true,
            read_only: true,
        };
        let read_only_primary = ServerRole {
            in_recovery: false,
            read_only: true,
        };
        let primary = ServerRole {
            in_recovery: false,
            read_only: false,
        };
        assert!(TargetSessionAttrs::Any.accepts(standby));
        assert!(!TargetSessionAttrs::ReadWrite.accepts(standby));
        assert!(!TargetSessionAttrs::ReadWrite.accepts(read_only_primary));
        assert!(TargetSessionAttrs::ReadWrite.accepts(primary));
        assert!(!TargetSessionAttrs::Primary.accepts(standby));
        assert!(TargetSessionAttrs::Primary.accepts(read_only_primary));
    }
}
