//! The payment service as its users meet it: the built binary on a real database,
//! driven over HTTP. Mints deposits, pays under concurrent load, receives SIGTERM
//! mid-load, and must exit 0 after a drained shutdown with every request answered
//! (or refused once the listener is gone); restarted on the same database, the
//! balances must account for every unit minted and every payment answered 200.
//! On SQLite and on PostgreSQL.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::watch;
use tokio::time::timeout;

#[path = "../../../crates/adapters-postgres/tests/support/mod.rs"]
mod pg_support;

const BIN: &str = env!("CARGO_BIN_EXE_holdfast-example-payment-service");
const DEPOSITS: u32 = 50;
const DEPOSIT: u128 = 100;
const CLIENTS: u64 = 16;
/// SIGTERM goes out once this many payments were answered 200.
const PAID_BEFORE_SIGTERM: u64 = 30;
/// The longest a start, an answer or an exit may take before the test fails.
const BOUND: Duration = Duration::from_secs(60);

/// The service running as a child process.
struct Service {
    child: Child,
    addr: SocketAddr,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Service {
    /// Starts the binary on `db_url` and a free port; returns once it listens.
    async fn start(db_url: &str) -> Service {
        let mut child = Command::new(BIN)
            .env("HOLDFAST_DB", db_url)
            .env("PAYMENT_SERVICE_ADDR", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the service");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let line = timeout(BOUND, stdout.next_line())
            .await
            .expect("the service listens in time")
            .expect("read its stdout")
            .expect("a `listening on` line before exit");
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("expected `listening on ADDR`, got {line:?}"))
            .parse()
            .expect("an address");
        Service {
            child,
            addr,
            stdout,
        }
    }

    /// Sends SIGTERM, checks the process exits 0 in time, and returns the lines
    /// it printed after `listening on`.
    async fn terminate(mut self) -> Vec<String> {
        let pid = self.child.id().expect("still running").to_string();
        let kill = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(kill.success(), "kill -TERM {pid}: {kill}");
        let exit = timeout(BOUND, self.child.wait())
            .await
            .expect("the service exits in time after SIGTERM")
            .expect("wait for the service");
        assert!(exit.success(), "the service exits 0 after SIGTERM: {exit}");
        let mut lines = Vec::new();
        while let Some(line) = self.stdout.next_line().await.expect("read stdout") {
            lines.push(line);
        }
        lines
    }
}

/// One HTTP answer, checked to be well-formed on the way in.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("a JSON body ({e}): {self:?}"))
    }

    /// An error answer carries `{"error": kind, "message": text}`, and a 503 says
    /// when to retry.
    fn check_error(&self) -> String {
        let body = self.json();
        let kind = body["error"].as_str().unwrap_or_else(|| panic!("{self:?}"));
        assert!(body["message"].is_string(), "{self:?}");
        if self.status == 503 {
            assert!(self.headers.contains_key("retry-after"), "{self:?}");
        }
        kind.to_owned()
    }
}

/// One request on a fresh connection (`Connection: close`), in plain HTTP/1.1.
/// An `Err` is a connection that failed or closed without any answer.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<Answer> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    if raw.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let raw = String::from_utf8(raw).expect("a UTF-8 answer");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end: {raw:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {status_line:?}"));
    let headers: BTreeMap<String, String> = lines
        .map(|line| {
            let (name, value) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("a header: {line:?}"));
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a content-length: {headers:?}"));
    assert_eq!(length, body.len(), "the whole body arrived: {raw:?}");
    Ok(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// A request that must be answered (no load, no shutdown around it).
async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Answer {
    timeout(BOUND, http(addr, method, path, body.as_ref()))
        .await
        .unwrap_or_else(|_| panic!("{method} {path} answered in time"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

async fn balance(addr: SocketAddr, wallet: &str) -> u128 {
    let answer = call(
        addr,
        "GET",
        &format!("/wallets/{wallet}/balance?type=CHF"),
        None,
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()["balance"]
        .as_str()
        .expect("a balance")
        .parse()
        .expect("a number")
}

/// What the paying clients saw.
#[derive(Debug, Default)]
struct Tally {
    /// Payments answered 200, and their sum.
    paid: AtomicU64,
    paid_sum: AtomicU64,
    /// Error answers by status and kind.
    errors: Mutex<BTreeMap<(u16, String), u64>>,
    /// Connections refused (or closed unanswered) after SIGTERM.
    refused: AtomicU64,
}

/// One client: pays alice -> bob amounts of 1 to 150 until the service refuses
/// connections, which must only happen after SIGTERM.
async fn client(
    addr: SocketAddr,
    n: u64,
    tally: Arc<Tally>,
    paid: watch::Sender<u64>,
    terminated: Arc<AtomicBool>,
) {
    let mut seed = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in 0u64.. {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let amount = 1 + (seed >> 33) % 150;
        let body = json!({
            "tx": format!("pay-{n}-{i}"), "from": "alice", "to": "bob",
            "type": "CHF", "amount": amount.to_string(),
        });
        let answer = timeout(BOUND, http(addr, "POST", "/pay", Some(&body)))
            .await
            .expect("every payment is answered in time: none hangs");
        match answer {
            Ok(answer) if answer.status == 200 => {
                let body = answer.json();
                assert_eq!(body["tx"], format!("pay-{n}-{i}"), "{answer:?}");
                assert!(
                    body["inputs"].as_array().is_some_and(|i| !i.is_empty()),
                    "{answer:?}"
                );
                tally.paid.fetch_add(1, Ordering::SeqCst);
                tally.paid_sum.fetch_add(amount, Ordering::SeqCst);
                paid.send_modify(|n| *n += 1);
            }
            Ok(answer) => {
                let kind = answer.check_error();
                *tally
                    .errors
                    .lock()
                    .expect("lock")
                    .entry((answer.status, kind))
                    .or_default() += 1;
            }
            Err(e) => {
                assert!(
                    terminated.load(Ordering::SeqCst),
                    "a connection failed before SIGTERM: {e}"
                );
                tally.refused.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
    }
}

async fn smoke(db_url: &str) {
    let started = Instant::now();
    let service = Service::start(db_url).await;
    let addr = service.addr;
    assert_eq!(call(addr, "GET", "/healthz", None).await.status, 200);

    for i in 0..DEPOSITS {
        let deposit =
            json!({ "type": "CHF", "amount": DEPOSIT.to_string(), "id": format!("deposit-{i}") });
        let answer = call(addr, "POST", "/wallets/alice/mint", Some(deposit)).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.json()["created"], true, "{answer:?}");
    }
    // Minting is idempotent by id; the same id with another amount is refused.
    let again = json!({ "type": "CHF", "amount": "100", "id": "deposit-0" });
    let answer = call(addr, "POST", "/wallets/alice/mint", Some(again)).await;
    assert_eq!(
        (answer.status, &answer.json()["created"]),
        (200, &json!(false)),
        "{answer:?}"
    );
    let other = json!({ "type": "CHF", "amount": "99", "id": "deposit-0" });
    let answer = call(addr, "POST", "/wallets/alice/mint", Some(other)).await;
    assert_eq!(
        (answer.status, answer.check_error().as_str()),
        (409, "conflict"),
        "{answer:?}"
    );
    // Bad input is refused with a message, before holdfast is asked anything.
    let bad =
        json!({ "tx": "bad", "from": "alice", "to": "bob", "type": "CHF", "amount": "a lot" });
    let answer = call(addr, "POST", "/pay", Some(bad)).await;
    assert!(matches!(answer.status, 400 | 422), "{answer:?}");
    assert!(
        answer.json()["message"]
            .as_str()
            .is_some_and(|m| m.contains("amount")),
        "{answer:?}"
    );
    let answer = call(addr, "POST", "/pay", Some(json!({ "tx": "t" }))).await;
    assert!(matches!(answer.status, 400 | 422), "{answer:?}");
    answer.check_error();
    assert_eq!(balance(addr, "alice").await, u128::from(DEPOSITS) * DEPOSIT);

    let tally = Arc::new(Tally::default());
    let terminated = Arc::new(AtomicBool::new(false));
    let (paid, mut paid_seen) = watch::channel(0u64);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client(
                addr,
                n,
                tally.clone(),
                paid.clone(),
                terminated.clone(),
            ))
        })
        .collect();
    drop(paid);
    timeout(BOUND, paid_seen.wait_for(|n| *n >= PAID_BEFORE_SIGTERM))
        .await
        .expect("payments go through in time")
        .expect("clients running");
    let metrics = call(addr, "GET", "/metrics", None).await;
    assert_eq!(metrics.status, 200, "{metrics:?}");
    assert!(
        metrics.body.contains("holdfast_selection_outcomes_total"),
        "{}",
        metrics.body
    );

    let load_time = started.elapsed();
    terminated.store(true, Ordering::SeqCst);
    let sigterm = Instant::now();
    let printed = service.terminate().await;
    let exit_time = sigterm.elapsed();
    assert!(
        printed
            .iter()
            .any(|l| l.starts_with("shutdown drained=true abandoned_calls=0")),
        "a drained shutdown report: {printed:?}"
    );
    for client in clients {
        client.await.expect("a client");
    }

    // Restarted on the same database: every unit is where the answers said.
    let service = Service::start(db_url).await;
    let (alice, bob) = (
        balance(service.addr, "alice").await,
        balance(service.addr, "bob").await,
    );
    assert_eq!(
        alice + bob,
        u128::from(DEPOSITS) * DEPOSIT,
        "value is conserved"
    );
    assert_eq!(
        bob,
        u128::from(tally.paid_sum.load(Ordering::SeqCst)),
        "bob got exactly the payments answered 200: {tally:?}"
    );
    // A retried payment whose first answer was lost is answered again, once paid.
    let retried =
        json!({ "tx": "retried", "from": "alice", "to": "bob", "type": "CHF", "amount": "5" });
    for replayed in [false, true] {
        let answer = call(service.addr, "POST", "/pay", Some(retried.clone())).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.json()["replayed"], replayed, "{answer:?}");
    }
    assert_eq!(balance(service.addr, "bob").await, bob + 5, "paid once");
    service.terminate().await;
    println!(
        "{db}: {} payments answered 200 ({} CHF), errors {:?}, {} refused after SIGTERM; \
         load {load_time:.1?}, SIGTERM to exit 0 {exit_time:.1?}, total {:.1?}",
        tally.paid.load(Ordering::SeqCst),
        tally.paid_sum.load(Ordering::SeqCst),
        tally.errors.lock().expect("lock"),
        tally.refused.load(Ordering::SeqCst),
        started.elapsed(),
        db = db_url.split(':').next().unwrap_or_default(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pays_under_load_shuts_down_on_sigterm_and_conserves_value_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    smoke(&format!(
        "sqlite://{}",
        dir.path().join("payments.db").display()
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pays_under_load_shuts_down_on_sigterm_and_conserves_value_postgres() {
    let Some(db) = pg_support::TestDb::create("payment_service_smoke_postgres").await else {
        return;
    };
    smoke(&db.url).await;
}
