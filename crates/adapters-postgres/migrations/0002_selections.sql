-- holdfast schema, version 2: selections, what each transaction selected, kept
-- apart from its locks. The lease sweep deletes lock rows only; settling a
-- transaction as confirmed spends what it selected even when its locks were
-- swept meanwhile. A row is written by the statement that wins the lock it
-- records, and removed when the transaction settles or its select gives the
-- token back. Every lock row has its selection row (backfilled here).

CREATE TABLE selections (
    consumer    TEXT COLLATE "C" NOT NULL,
    tx_id       TEXT COLLATE "C" NOT NULL,
    idx         BIGINT NOT NULL,
    PRIMARY KEY (consumer, tx_id, idx)
);

INSERT INTO selections (consumer, tx_id, idx)
SELECT consumer, tx_id, idx FROM token_locks;

-- Settles consumer p_consumer as confirmed, in the one transaction of the call
-- (one round trip). In order: lock the selected token rows, then the consumer's
-- lock rows, FOR UPDATE in key order; if another transaction has spent a
-- selected token, return that one token with its spender and change nothing;
-- else record the status (when p_record), delete the consumer's lock and
-- selection rows and mark the selected, unspent tokens spent by it at p_at_ms,
-- returning them with the consumer as spender. Each statement of a function
-- reads a fresh snapshot, so the check sees what the row locks waited for.
CREATE FUNCTION holdfast_spend(p_consumer TEXT, p_at_ms BIGINT, p_record BOOLEAN)
RETURNS TABLE (spent_tx TEXT, spent_idx BIGINT, spender TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    at_ts TIMESTAMPTZ := TIMESTAMPTZ 'epoch' + p_at_ms * INTERVAL '1 millisecond';
BEGIN
    PERFORM 1 FROM selections s
        JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
        WHERE s.consumer = p_consumer
        ORDER BY t.tx_id, t.idx
        FOR UPDATE OF t;
    PERFORM 1 FROM token_locks l
        WHERE l.consumer = p_consumer
        ORDER BY l.tx_id, l.idx
        FOR UPDATE OF l;
    RETURN QUERY
        SELECT t.tx_id::TEXT, t.idx, t.spent_by::TEXT FROM selections s
        JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
        WHERE s.consumer = p_consumer AND t.spent_by IS NOT NULL AND t.spent_by <> p_consumer
        ORDER BY t.tx_id, t.idx
        LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    IF p_record THEN
        INSERT INTO tx_statuses (tx_id, status, recorded_at)
        VALUES (p_consumer, 'confirmed', at_ts)
        ON CONFLICT (tx_id) DO UPDATE
        SET status = EXCLUDED.status, recorded_at = EXCLUDED.recorded_at;
    END IF;
    DELETE FROM token_locks l WHERE l.consumer = p_consumer;
    RETURN QUERY
        WITH forgotten AS (
            DELETE FROM selections s WHERE s.consumer = p_consumer
            RETURNING s.tx_id, s.idx
        )
        UPDATE tokens t
        SET spent_by = p_consumer, spent_at = at_ts
        FROM forgotten f
        WHERE t.tx_id = f.tx_id AND t.idx = f.idx AND t.spent_by IS NULL
        RETURNING t.tx_id::TEXT, t.idx, p_consumer;
END;
$$;
