-- holdfast schema v1: tokens, locks, transaction statuses, build queues and requests.
-- Timestamps are text in one form: RFC 3339 UTC with milliseconds (2026-11-30T08:00:00.000Z).

-- Tokens (unspent outputs). Spending is a soft delete: spent_by and spent_at are set.
-- amount is Quantity::to_storage(): 32 lowercase hex digits, so text order is numeric
-- order and equal amounts are byte-equal.
CREATE TABLE tokens (
    tx         TEXT    NOT NULL,
    output     INTEGER NOT NULL CHECK (output >= 0),
    wallet     TEXT    NOT NULL,
    token_type TEXT    NOT NULL,
    amount     TEXT    NOT NULL,
    spendable  INTEGER NOT NULL CHECK (spendable IN (0, 1)),
    spent_by   TEXT,
    spent_at   TEXT,
    PRIMARY KEY (tx, output)
);

-- Candidates: the ascending scan of one wallet and type reads this index in order
-- (no sort), and it holds only rows selection may take.
CREATE INDEX tokens_candidates ON tokens (wallet, token_type, amount, tx, output)
    WHERE spendable = 1 AND spent_by IS NULL;

-- Locks: the primary key is the mutual exclusion; one row per locked token.
CREATE TABLE locks (
    tx         TEXT    NOT NULL,
    output     INTEGER NOT NULL,
    consumer   TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    PRIMARY KEY (tx, output)
);

CREATE INDEX locks_consumer ON locks (consumer);

-- The last recorded status of each transaction (the consumers of locks).
CREATE TABLE tx_statuses (
    tx          TEXT NOT NULL PRIMARY KEY,
    status      TEXT NOT NULL,
    recorded_at TEXT NOT NULL
);

-- Build queues; every write is a compare-and-set on version.
CREATE TABLE queues (
    name               TEXT    NOT NULL PRIMARY KEY,
    latest_request     TEXT,
    last_green_uri     TEXT,
    last_green_request TEXT,
    version            INTEGER NOT NULL
);

-- The set of request ids owning a slot of a queue (rewritten with the queue row).
CREATE TABLE queue_owners (
    queue   TEXT NOT NULL,
    request TEXT NOT NULL,
    PRIMARY KEY (queue, request)
);

-- Build requests, request/<queue>/<seq>; the uri is unique within its queue.
CREATE TABLE requests (
    queue    TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    uri      TEXT    NOT NULL,
    state    TEXT    NOT NULL,
    strategy TEXT,
    base     TEXT,
    version  INTEGER NOT NULL,
    PRIMARY KEY (queue, seq),
    UNIQUE (queue, uri)
);
