-- holdfast schema, version 1: tokens and their locks, transaction statuses,
-- build queues and requests.
--
-- Ids compare as bytes (COLLATE "C") so the database orders them exactly as
-- the Rust types do. Amounts are NUMERIC(39,0): every u128 fits, equality is
-- exact and the order numeric. Times are TIMESTAMPTZ written from the
-- caller's millisecond timestamps, never from the server clock.

CREATE TABLE tokens (
    tx_id       TEXT COLLATE "C" NOT NULL,
    idx         BIGINT NOT NULL CHECK (idx BETWEEN 0 AND 4294967295),
    wallet      TEXT COLLATE "C" NOT NULL,
    token_type  TEXT COLLATE "C" NOT NULL,
    amount      NUMERIC(39, 0) NOT NULL CHECK (amount >= 0),
    spendable   BOOLEAN NOT NULL,
    spent_by    TEXT COLLATE "C",
    spent_at    TIMESTAMPTZ,
    PRIMARY KEY (tx_id, idx),
    CHECK ((spent_by IS NULL) = (spent_at IS NULL))
);

-- The candidate index: spendable, unspent tokens of a wallet and type in
-- ascending (amount, tx_id, idx) order, so the candidate scan needs no sort
-- and pages by keyset.
CREATE INDEX tokens_candidates
    ON tokens (wallet, token_type, amount, tx_id, idx)
    WHERE spendable AND spent_by IS NULL;

-- One row per locked token: the primary key is the mutual exclusion. There is
-- deliberately no foreign key to tokens: its check would take row locks on
-- tokens at the end of a claim and could deadlock with SKIP LOCKED claimers.
CREATE TABLE token_locks (
    tx_id       TEXT COLLATE "C" NOT NULL,
    idx         BIGINT NOT NULL,
    consumer    TEXT COLLATE "C" NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tx_id, idx)
);
CREATE INDEX token_locks_consumer ON token_locks (consumer);
CREATE INDEX token_locks_created_at ON token_locks (created_at);

CREATE TABLE tx_statuses (
    tx_id       TEXT COLLATE "C" PRIMARY KEY,
    status      TEXT NOT NULL CHECK (status IN
                    ('pending', 'confirmed', 'deleted', 'orphan', 'busy', 'unknown')),
    recorded_at TIMESTAMPTZ NOT NULL
);

-- A queue record is written only by whole-row compare-and-set on version; the
-- slot owners are part of the row (a text array of request ids), so claiming
-- or releasing a slot is one CAS.
CREATE TABLE queues (
    name                   TEXT COLLATE "C" PRIMARY KEY,
    latest_request_id      TEXT COLLATE "C",
    last_green_uri         TEXT COLLATE "C",
    last_green_request_id  TEXT COLLATE "C",
    owners                 TEXT[] COLLATE "C" NOT NULL DEFAULT '{}',
    version                BIGINT NOT NULL CHECK (version >= 1),
    CHECK ((last_green_uri IS NULL) = (last_green_request_id IS NULL))
);

CREATE TABLE requests (
    queue      TEXT COLLATE "C" NOT NULL REFERENCES queues (name),
    seq        BIGINT NOT NULL CHECK (seq >= 1),
    uri        TEXT COLLATE "C" NOT NULL,
    state      TEXT NOT NULL CHECK (state IN
                   ('accepted', 'processing', 'superseded', 'succeeded', 'failed', 'cancelled')),
    strategy   TEXT CHECK (strategy IN ('full', 'incremental_since_green')),
    base_uri   TEXT COLLATE "C",
    version    BIGINT NOT NULL CHECK (version >= 1),
    PRIMARY KEY (queue, seq),
    UNIQUE (queue, uri),
    CHECK (strategy IS NOT NULL OR base_uri IS NULL)
);
