-- holdfast schema, version 11: the window claim planned once per session.
--
-- Measured on the simulator's many-wallets preset (pg_stat_statements with
-- track_planning): the window claim, one statement sent by the adapter, was
-- planned again at every call, 0.5 to 0.6 ms of planning against 0.4 ms of
-- execution. PostgreSQL keeps a plan made for the arrays at hand when it looks
-- cheaper than the generic one, and a generic plan counts ten candidates where
-- a claim usually names two to four. Forcing generic plans for the whole
-- session is no cure: made before the lock and selection tables have
-- statistics, other statements' generic plans scanned those tables whole.
--
-- holdfast_claim_window(tx_ids, idxs, consumer, at_ms, owner, skip_locked)
-- runs the very statement the adapter sent before (its two forms, chosen by
-- skip_locked; the adapter's module documentation says what each locks and in
-- which order) and returns its rows: per candidate, whether it was won and
-- whether it was still spendable. As holdfast_confirm (version 9) it plans its
-- statements once per session, generic, with sequential scans, hash and merge
-- joins and JIT off, so every plan is index probes by key on any table size.
-- Nothing is locked, read or written that the statement did not: a claim sent
-- by a replica not yet upgraded and one made through this function meet as
-- two such statements always met.
CREATE FUNCTION holdfast_claim_window(
    p_tx TEXT[], p_idx BIGINT[], p_consumer TEXT, p_at_ms BIGINT, p_owner TEXT,
    p_skip_locked BOOLEAN
)
RETURNS TABLE (c_tx TEXT, c_idx BIGINT, c_won BOOLEAN, c_spendable BOOLEAN)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    at_ts TIMESTAMPTZ := TIMESTAMPTZ 'epoch' + p_at_ms * INTERVAL '1 millisecond';
BEGIN
    IF p_skip_locked THEN
        RETURN QUERY
            WITH candidates AS (
                SELECT c.tx_id, c.idx FROM unnest(p_tx, p_idx) AS c(tx_id, idx)
            ),
            spendable AS (
                SELECT t.tx_id, t.idx FROM tokens t
                JOIN candidates c ON t.tx_id = c.tx_id AND t.idx = c.idx
                WHERE t.spendable AND t.spent_by IS NULL
            ),
            eligible AS (
                SELECT t.tx_id, t.idx FROM tokens t
                JOIN candidates c ON t.tx_id = c.tx_id AND t.idx = c.idx
                WHERE t.spendable AND t.spent_by IS NULL
                ORDER BY t.tx_id, t.idx
                FOR UPDATE OF t SKIP LOCKED
            ),
            claimed AS (
                INSERT INTO token_locks (tx_id, idx, consumer, created_at, owner)
                SELECT s.tx_id, s.idx, p_consumer, at_ts, p_owner
                FROM eligible s
                WHERE NOT EXISTS (SELECT 1 FROM selections x
                                  WHERE x.consumer = p_consumer AND x.tx_id = s.tx_id AND x.idx = s.idx)
                  AND NOT EXISTS (SELECT 1 FROM tx_statuses st
                                  WHERE st.tx_id = p_consumer AND st.status = 'confirmed')
                ORDER BY s.tx_id, s.idx
                ON CONFLICT (tx_id, idx) DO NOTHING
                RETURNING token_locks.tx_id, token_locks.idx
            ),
            recorded AS (
                INSERT INTO selections (consumer, tx_id, idx, owner, selected_at)
                SELECT p_consumer, cl.tx_id, cl.idx, p_owner, at_ts
                FROM claimed cl
            )
            SELECT c.tx_id::TEXT, c.idx, cl.tx_id IS NOT NULL, s.tx_id IS NOT NULL
            FROM candidates c
            LEFT JOIN claimed cl ON cl.tx_id = c.tx_id AND cl.idx = c.idx
            LEFT JOIN spendable s ON s.tx_id = c.tx_id AND s.idx = c.idx;
    ELSE
        RETURN QUERY
            WITH candidates AS (
                SELECT c.tx_id, c.idx FROM unnest(p_tx, p_idx) AS c(tx_id, idx)
            ),
            spendable AS (
                SELECT t.tx_id, t.idx FROM tokens t
                JOIN candidates c ON t.tx_id = c.tx_id AND t.idx = c.idx
                WHERE t.spendable AND t.spent_by IS NULL
                ORDER BY t.tx_id, t.idx
                FOR SHARE OF t
            ),
            claimed AS (
                INSERT INTO token_locks (tx_id, idx, consumer, created_at, owner)
                SELECT s.tx_id, s.idx, p_consumer, at_ts, p_owner
                FROM spendable s
                WHERE NOT EXISTS (SELECT 1 FROM selections x
                                  WHERE x.consumer = p_consumer AND x.tx_id = s.tx_id AND x.idx = s.idx)
                  AND NOT EXISTS (SELECT 1 FROM tx_statuses st
                                  WHERE st.tx_id = p_consumer AND st.status = 'confirmed')
                ORDER BY s.tx_id, s.idx
                ON CONFLICT (tx_id, idx) DO NOTHING
                RETURNING token_locks.tx_id, token_locks.idx
            ),
            recorded AS (
                INSERT INTO selections (consumer, tx_id, idx, owner, selected_at)
                SELECT p_consumer, cl.tx_id, cl.idx, p_owner, at_ts
                FROM claimed cl
            )
            SELECT c.tx_id::TEXT, c.idx, cl.tx_id IS NOT NULL, s.tx_id IS NOT NULL
            FROM candidates c
            LEFT JOIN claimed cl ON cl.tx_id = c.tx_id AND cl.idx = c.idx
            LEFT JOIN spendable s ON s.tx_id = c.tx_id AND s.idx = c.idx;
    END IF;
END;
$$;
