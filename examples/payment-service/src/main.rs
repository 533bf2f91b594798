//! A payment service on holdfast: an HTTP API over one [`Holdfast`] handle.
//!
//! - `POST /wallets/{wallet}/mint` `{"type": "CHF", "amount": "100", "id": "dep-1"}`:
//!   a deposit (one token); idempotent by `id`.
//! - `POST /pay` `{"tx": "t1", "from": "alice", "to": "bob", "type": "CHF", "amount": "150"}`:
//!   selects `from`'s tokens, then confirms paying `to` with the change back to `from`.
//! - `GET /wallets/{wallet}/balance?type=CHF`, `GET /metrics` (Prometheus), `GET /healthz`.
//!
//! Amounts are decimal strings: a quantity can exceed what a JSON number carries.
//! The database comes from the environment (`HOLDFAST_DB`, else `DATABASE_URL`), the
//! listen address from `PAYMENT_SERVICE_ADDR` (default `127.0.0.1:8080`).

use std::error::Error;
use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use holdfast::{
    Config, ErrorKind, HasKind, Holdfast, NewToken, Output, Precision, Quantity, TokenId,
    TokenType, TxId, TxStatus, WalletId,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

/// What every handler shares.
#[derive(Clone)]
struct App {
    holdfast: Arc<Holdfast>,
    metrics: PrometheusHandle,
    /// The precision quantities are parsed with: the one the database was configured with.
    precision: Precision,
}

/// An error answer: the status and `Retry-After` come from the error's [`ErrorKind`],
/// the body is `{"error": kind, "message": text}`.
#[derive(Debug)]
struct ApiError {
    kind: ErrorKind,
    message: String,
}

impl ApiError {
    fn new(kind: ErrorKind, message: impl Display) -> Self {
        ApiError {
            kind,
            message: message.to_string(),
        }
    }

    /// Input the service refused before asking holdfast anything.
    fn invalid(message: impl Display) -> Self {
        ApiError::new(ErrorKind::InvalidInput, message)
    }
}

/// Every holdfast error says what kind of failure it is; that is all the mapping needs.
impl<E: HasKind> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError::new(e.kind(), e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.kind.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({ "error": self.kind.as_str(), "message": self.message });
        let mut response = (status, Json(body)).into_response();
        // Transient failures (locked funds, an unreachable database, shutting down)
        // say when to come back, in whole seconds rounded up.
        if let Some(after) = self.kind.retry_after() {
            let secs = (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Parses one field of a request, naming it in the error.
fn field<T, E: Display>(name: &str, parsed: Result<T, E>) -> Result<T, ApiError> {
    parsed.map_err(|e| ApiError::invalid(format_args!("{name}: {e}")))
}

#[derive(Deserialize)]
struct MintRequest {
    #[serde(rename = "type")]
    token_type: String,
    amount: String,
    /// The deposit's id; without it the service makes one (and the call is not idempotent).
    id: Option<String>,
}

async fn mint(
    State(app): State<App>,
    Path(wallet): Path<String>,
    body: Result<Json<MintRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let id = body.id.unwrap_or_else(fresh_deposit_id);
    // A deposit is output 0 of a transaction named by its id: minting the same id
    // again with the same token is a no-op, with another amount a conflict.
    let token = NewToken {
        id: TokenId::new(field("id", TxId::new(id))?, 0),
        wallet: field("wallet", WalletId::new(wallet))?,
        token_type: field("type", TokenType::new(body.token_type))?,
        quantity: field("amount", Quantity::parse(&body.amount, app.precision))?,
        spendable: true,
    };
    let created = app.holdfast.mint(std::slice::from_ref(&token)).await? == 1;
    Ok(Json(
        json!({ "token": token.id.to_string(), "created": created }),
    ))
}

/// A deposit id unique enough for a demonstration (real callers send their own).
fn fresh_deposit_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("deposit-{nanos}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[derive(Deserialize)]
struct PayRequest {
    tx: String,
    from: String,
    to: String,
    #[serde(rename = "type")]
    token_type: String,
    amount: String,
}

async fn pay(
    State(app): State<App>,
    body: Result<Json<PayRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let tx = field("tx", TxId::new(body.tx))?;
    let from = field("from", WalletId::new(body.from))?;
    let to = field("to", WalletId::new(body.to))?;
    let token_type = field("type", TokenType::new(body.token_type))?;
    let amount = field("amount", Quantity::parse(&body.amount, app.precision))?;

    let payee = Output {
        wallet: to,
        token_type,
        quantity: amount,
    };
    // The payment runs to its end on a task of its own: a client that hangs up
    // between the select and the confirm leaves nothing locked behind it.
    tokio::spawn(pay_once(app.holdfast.clone(), tx, from, payee))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Backend, e))?
        .map(Json)
}

async fn pay_once(
    holdfast: Arc<Holdfast>,
    tx: TxId,
    from: WalletId,
    payee: Output,
) -> Result<Value, ApiError> {
    // A retry of a payment that committed (its answer was lost on the way)
    // answers what was committed: confirming again with the same outputs
    // changes nothing (`replayed`). Selecting again would find nothing to win.
    if holdfast.status(&tx).await? == Some(TxStatus::Confirmed) {
        let confirmed = holdfast.confirm(&tx, &[payee], Some(&from)).await?;
        return Ok(json!({ "tx": tx.to_string(), "inputs": [], "replayed": confirmed.replayed }));
    }
    // Step 1: lock tokens of `from` covering the amount, for this transaction.
    let selected = holdfast
        .select(&from, &payee.token_type, payee.quantity, &tx)
        .await?;
    // Step 2: spend them and create the outputs in one database transaction: the
    // payee's token, and the change (selected total - amount) back to the payer.
    if let Err(e) = holdfast.confirm(&tx, &[payee], Some(&from)).await {
        // Leave nothing locked behind a failed request: releasing the transaction
        // (recorded as deleted) frees its tokens at once; should that fail too, the
        // lease sweeper frees them when the lease runs out.
        if let Err(release) = holdfast.release(&tx).await {
            eprintln!("{tx}: confirm failed ({e}) and releasing its locks failed: {release}");
        }
        return Err(e.into());
    }
    let inputs: Vec<String> = selected.tokens.iter().map(ToString::to_string).collect();
    Ok(json!({
        "tx": tx.to_string(),
        "inputs": inputs,
        "change": selected.change.to_string(),
        "replayed": false,
    }))
}

#[derive(Deserialize)]
struct BalanceQuery {
    #[serde(rename = "type")]
    token_type: String,
}

async fn balance(
    State(app): State<App>,
    Path(wallet): Path<String>,
    query: Result<Query<BalanceQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let wallet = field("wallet", WalletId::new(wallet))?;
    let token_type = field("type", TokenType::new(query.token_type))?;
    let balance = app.holdfast.balance(&wallet, &token_type).await?;
    Ok(Json(json!({
        "wallet": wallet.to_string(),
        "type": token_type.to_string(),
        "balance": balance.to_string(),
    })))
}

async fn prometheus(State(app): State<App>) -> String {
    app.metrics.render()
}

async fn healthz() -> &'static str {
    "ok"
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Logs holdfast's warnings (an unknown `HOLDFAST_*` variable, a failed sweep) to
/// stderr; `RUST_LOG=info` shows more. Without a subscriber they go nowhere.
fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    log_to_stderr();
    // The recorder goes in first: `Holdfast::open` describes holdfast's metrics
    // to whatever recorder is installed, and every later call records into it.
    let metrics = PrometheusBuilder::new().install_recorder()?;
    // Without the exporter's own HTTP listener, upkeep (draining histograms) is ours to run.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });

    let config = Config::from_env()?;
    // Opens the database (migrations included), recovers what an earlier run left
    // half-settled, and starts the lease sweeper.
    let holdfast = Arc::new(Holdfast::open(config).await?);

    let app = App {
        precision: holdfast.precision(),
        holdfast: holdfast.clone(),
        metrics,
    };
    let router = Router::new()
        .route("/wallets/{wallet}/mint", post(mint))
        .route("/wallets/{wallet}/balance", get(balance))
        .route("/pay", post(pay))
        .route("/metrics", get(prometheus))
        .route("/healthz", get(healthz))
        .with_state(app);

    let addr = std::env::var("PAYMENT_SERVICE_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);

    // Shutdown comes in two steps, in this order: the server stops accepting and
    // finishes the requests in flight (each may still select and confirm), and only
    // then does holdfast drain and close its pool.
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    let report = holdfast.shutdown().await;
    println!(
        "shutdown drained={} abandoned_calls={}",
        report.drained, report.abandoned_calls
    );
    Ok(())
}
