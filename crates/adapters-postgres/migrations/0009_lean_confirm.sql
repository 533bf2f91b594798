-- holdfast schema, version 9: the confirm in fewer statements, each planned once.
--
-- Measured on the simulator's many-wallets preset (pg_stat_statements with
-- track = all and track_planning, perf over the server's processes):
-- holdfast_confirm took half of the server's CPU. Its time went less to reading
-- and writing rows than to what every statement of a PL/pgSQL function costs
-- before it runs: a plan, and an executor started and torn down. Three of its
-- statements (those that join the input arrays) were planned again at every
-- call, since a plan for the arrays at hand looks cheaper than the generic one;
-- planning alone was a fifth of the server's CPU. Version 9 keeps every step,
-- lock and order of versions 7 and 8, and their answers but where a call of the
-- same consumer commits while the confirm runs (below), and:
--   - sets plan_cache_mode = force_generic_plan for the confirm's statements
--     (and the balance locks it calls): each is planned once per session. A
--     generic plan counts ten elements in an array and knows nothing of the
--     table's size when it is planned, so on a small tokens table (a few
--     thousand rows: auto_explain on the hot-wallets preset) it joined the
--     inputs by a hash over a scan of the whole table, at every call. The
--     function therefore also turns sequential scans, hash and merge joins off
--     for its statements (each touches a few rows, by key: the inputs and
--     outputs, the consumer's lock and selection rows) and JIT with them (the
--     cost of a path turned off would otherwise make PostgreSQL compile the
--     plan: 0.9 s); the plans are index probes on any table size;
--   - checks amounts with plain expressions (holdfast_bad_amounts: no query
--     unless an amount is bad), where version 7 ran a query, twice a confirm;
--   - reads "confirmed" and "outputs stored" in one statement; locks the
--     selected token rows and reads which it locked in one; refuses a double
--     spend or outputs that do not add up in one (a double spend first, as
--     before); and records the status, releases, forgets and spends in one.
--     The outputs are still inserted by a statement of their own, before any
--     of those writes (0007's header says why).
--
-- The inputs are the selected tokens whose rows it locked (FOR UPDATE) and
-- whose selection is still there once the consumer's lock rows are locked too:
-- a give-back or a Deleted of the same consumer committing while the confirm
-- waited for a lock takes its tokens out, and outputs counted with them are
-- refused as not conserved (as in version 8). The spend then marks exactly
-- those inputs, the rows it holds, spent. Version 8 marked spent the inputs
-- whose selection its last statement still found: once the sweep had taken a
-- consumer's lock rows, a give-back committing between the read of the inputs
-- and the spend (nothing the confirm held made it wait) left an input counted
-- by the conservation check unspent, and so value was created. Two answers
-- move with this: a claim of the consumer (a select still running) committing
-- between the two lock statements is no longer counted and spent with the
-- rest (its lock and selection stay for its own give-back or the lease), and
-- an input given back after the inputs are read is spent all the same.

-- What is wrong with outputs or adds given as three arrays, or NULL if nothing
-- is: they must be of one length, without NULLs, and the amounts integers of 1
-- to 39 digits. Plain expressions: the amounts, joined with commas (a NULL as
-- 'x'), must read as comma-separated integers of 1 to 39 digits, and hold
-- exactly one comma fewer than there are amounts (an amount "1,2" adds one).
CREATE FUNCTION holdfast_bad_amounts(p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[])
RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    n BIGINT := COALESCE(cardinality(p_amounts), 0);
    joined TEXT := array_to_string(p_amounts, ',', 'x');
BEGIN
    IF COALESCE(cardinality(p_wallets), 0) <> COALESCE(cardinality(p_types), 0)
       OR COALESCE(cardinality(p_wallets), 0) <> n THEN
        RETURN format('holdfast: %s wallet(s), %s type(s) and %s amount(s) given: one of each per token',
                      COALESCE(cardinality(p_wallets), 0), COALESCE(cardinality(p_types), 0), n);
    END IF;
    IF array_position(p_wallets, NULL) IS NOT NULL
       OR array_position(p_types, NULL) IS NOT NULL THEN
        RETURN 'holdfast: a wallet or type is NULL';
    END IF;
    IF n = 0 OR (joined ~ '^[0-9]{1,39}(,[0-9]{1,39})*$'
                 AND length(joined) - length(replace(joined, ',', '')) = n - 1) THEN
        RETURN NULL;
    END IF;
    RETURN format('holdfast: amount %s is not an integer of 1 to 39 digits',
                  (SELECT quote_nullable(a.a) FROM unnest(p_amounts) AS a(a)
                   WHERE a.a IS NULL OR a.a !~ '^[0-9]{1,39}$' LIMIT 1));
END;
$$;

-- Version 8's holdfast_lock_balances, its arguments checked by
-- holdfast_bad_amounts.
CREATE OR REPLACE FUNCTION holdfast_lock_balances(p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[])
RETURNS BOOLEAN
VOLATILE
LANGUAGE plpgsql AS $$
DECLARE
    bad TEXT;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'holdfast_lock_balances needs READ COMMITTED, this transaction is %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = '25000',
                  HINT = 'set default_transaction_isolation to ''read committed'' for holdfast''s sessions';
    END IF;
    bad := holdfast_bad_amounts(p_wallets, p_types, p_amounts);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%', bad USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM unnest(p_amounts) AS a(a)
                   WHERE a.a::NUMERIC >= 9223372036854775808) THEN
        BEGIN
            PERFORM pg_advisory_xact_lock_shared(2002936172, p.k)
                FROM (SELECT DISTINCT hashtext(w || E'\t' || t) AS k
                      FROM unnest(p_wallets, p_types) AS i(w, t)) AS p
                ORDER BY p.k;
            -- A statement of its own, after the locks: its snapshot shows every
            -- token added under an exclusive lock of these pairs.
            -- Per pair, one probe of each index (LATERAL: never a hashed
            -- subplan over every wallet's tokens).
            IF NOT EXISTS (
                SELECT 1
                FROM (SELECT DISTINCT w, t FROM unnest(p_wallets, p_types) AS i(w, t)) AS p
                CROSS JOIN LATERAL (
                    (SELECT 1 FROM tokens k
                     WHERE k.wallet = p.w AND k.token_type = p.t
                       AND k.spendable AND k.spent_by IS NULL
                       AND k.amount >= 9223372036854775808
                     LIMIT 1)
                    UNION ALL
                    (SELECT 1 FROM tokens k
                     WHERE k.wallet = p.w AND k.token_type = p.t
                       AND NOT k.spendable AND k.spent_by IS NULL
                       AND k.amount >= 9223372036854775808
                     LIMIT 1)
                ) AS big
            ) THEN
                RETURN FALSE;
            END IF;
            -- A big token: undo the shared locks before asking for exclusive ones.
            RAISE SQLSTATE 'HFBIG';
        EXCEPTION WHEN SQLSTATE 'HFBIG' THEN
            NULL;
        END;
    END IF;
    PERFORM pg_advisory_xact_lock(2002936172, p.k)
        FROM (SELECT DISTINCT hashtext(w || E'\t' || t) AS k
              FROM unnest(p_wallets, p_types) AS i(w, t)) AS p
        ORDER BY p.k;
    RETURN TRUE;
END;
$$;

-- Version 7's holdfast_confirm (version 4's header describes its steps), in
-- fewer statements (the header above).
CREATE OR REPLACE FUNCTION holdfast_confirm(
    p_consumer TEXT, p_at_ms BIGINT, p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[]
)
RETURNS TABLE (kind TEXT, tx TEXT, idx BIGINT, detail TEXT)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    bad TEXT := holdfast_bad_amounts(p_wallets, p_types, p_amounts);
    at_ts TIMESTAMPTZ := TIMESTAMPTZ 'epoch' + p_at_ms * INTERVAL '1 millisecond';
    n_given BIGINT := COALESCE(cardinality(p_wallets), 0);
    n_stored BIGINT;
    n_same BIGINT;
    confirmed BOOLEAN;
    in_tx TEXT[];
    in_idx BIGINT[];
BEGIN
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%', bad USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(1668247142, hashtext(p_consumer));
    SELECT EXISTS (SELECT 1 FROM tx_statuses s
                   WHERE s.tx_id = p_consumer AND s.status = 'confirmed'),
           (SELECT count(*) FROM tokens k WHERE k.tx_id = p_consumer)
        INTO confirmed, n_stored;
    IF confirmed OR n_stored > 0 THEN
        SELECT count(*)
            FROM unnest(p_wallets, p_types, p_amounts) WITH ORDINALITY AS o(w, t, a, n)
            JOIN tokens k ON k.tx_id = p_consumer AND k.idx = o.n - 1
                AND k.wallet = o.w AND k.token_type = o.t AND k.amount = o.a::NUMERIC
            INTO n_same;
        IF confirmed AND n_stored = n_given AND n_same = n_given THEN
            RETURN QUERY SELECT 'replayed'::TEXT, NULL::TEXT, NULL::BIGINT, NULL::TEXT;
        ELSIF confirmed THEN
            RETURN QUERY SELECT 'differ'::TEXT, NULL::TEXT, NULL::BIGINT,
                n_stored || ' output(s) stored, ' || n_given || ' given, or not the same ones';
        ELSE
            RETURN QUERY SELECT 'differ'::TEXT, NULL::TEXT, NULL::BIGINT,
                n_stored || ' token(s) already have its output ids (' || p_consumer || ':N)';
        END IF;
        RETURN;
    END IF;
    -- The selected token rows, then the consumer's lock rows, FOR UPDATE in
    -- key order; the inputs are the tokens it locked whose selection is still
    -- there after both (a give-back or Deleted of this consumer committing
    -- while it waited takes its tokens out; see the header). Every step below
    -- uses this set, so a claim of the same transaction committing meanwhile
    -- (a select still running) is neither counted nor spent; its lock and
    -- selection stay for its own give-back.
    SELECT COALESCE(array_agg(i.tx_id::TEXT ORDER BY i.tx_id, i.idx), '{}'),
           COALESCE(array_agg(i.idx ORDER BY i.tx_id, i.idx), '{}')
        FROM (SELECT t.tx_id, t.idx FROM selections s
              JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
              WHERE s.consumer = p_consumer
              ORDER BY t.tx_id, t.idx
              FOR UPDATE OF t) AS i
        INTO in_tx, in_idx;
    PERFORM 1 FROM token_locks l
        WHERE l.consumer = p_consumer
        ORDER BY l.tx_id, l.idx
        FOR UPDATE OF l;
    SELECT COALESCE(array_agg(s.tx_id ORDER BY s.tx_id, s.idx), '{}'),
           COALESCE(array_agg(s.idx ORDER BY s.tx_id, s.idx), '{}')
        FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
        WHERE EXISTS (SELECT 1 FROM selections x
                      WHERE x.consumer = p_consumer AND x.tx_id = s.tx_id AND x.idx = s.idx)
        INTO in_tx, in_idx;
    -- Steps 3 and 4: an input another transaction spent, else the first token
    -- type whose outputs do not add up to its unspent inputs.
    RETURN QUERY
        WITH inputs AS (
            SELECT t.tx_id, t.idx, t.token_type, t.amount, t.spent_by
            FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
            JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
        ),
        ins AS (
            SELECT i.token_type::TEXT AS token_type, SUM(i.amount) AS total
            FROM inputs i
            WHERE i.spent_by IS NULL
            GROUP BY i.token_type
        ),
        outs AS (
            SELECT o.t AS token_type, SUM(o.a::NUMERIC) AS total
            FROM unnest(p_types, p_amounts) AS o(t, a)
            GROUP BY o.t
        ),
        refusals AS (
            (SELECT 0 AS rank, 'double_spend'::TEXT AS kind, i.tx_id::TEXT AS tx, i.idx,
                    i.spent_by::TEXT AS detail
             FROM inputs i
             WHERE i.spent_by IS NOT NULL AND i.spent_by <> p_consumer
             ORDER BY i.tx_id, i.idx
             LIMIT 1)
            UNION ALL
            (SELECT 1, 'not_conserved'::TEXT, NULL::TEXT, NULL::BIGINT,
                    COALESCE(i.token_type, o.token_type) || E'\t' || COALESCE(i.total, 0)::TEXT
                        || E'\t' || COALESCE(o.total, 0)::TEXT
             FROM ins i FULL JOIN outs o ON o.token_type = i.token_type
             WHERE COALESCE(i.total, 0) <> COALESCE(o.total, 0)
             ORDER BY COALESCE(i.token_type, o.token_type) COLLATE "C"
             LIMIT 1)
        )
        SELECT r.kind, r.tx, r.idx, r.detail FROM refusals r ORDER BY r.rank LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Step 5 (0007's holdfast_confirm): the outputs' balance locks, the totals
    -- checked only under exclusive ones.
    IF holdfast_lock_balances(p_wallets, p_types, p_amounts) THEN
        RETURN QUERY
            WITH outs AS (
                SELECT o.w, o.t, SUM(o.a::NUMERIC) AS total
                FROM unnest(p_wallets, p_types, p_amounts) AS o(w, t, a)
                GROUP BY o.w, o.t
            ),
            bounds AS MATERIALIZED (
                SELECT o.w, o.t,
                       o.total + COALESCE((SELECT SUM(t.amount) FROM tokens t
                                           WHERE t.wallet = o.w AND t.token_type = o.t
                                             AND NOT t.spendable AND t.spent_by IS NULL
                                             AND NOT EXISTS (
                                                 SELECT 1 FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
                                                 WHERE s.tx_id = t.tx_id AND s.idx = t.idx)), 0)
                           AS base,
                       (SELECT MAX(t.amount) FROM tokens t
                        WHERE t.wallet = o.w AND t.token_type = o.t
                          AND t.spendable AND t.spent_by IS NULL) AS top
                FROM outs o
            )
            SELECT 'overflow'::TEXT, NULL::TEXT, NULL::BIGINT, b.w || E'\t' || b.t
            FROM bounds b
            WHERE CASE
                WHEN COALESCE(b.top, 0) < 9223372036854775808
                     AND b.base <= 170141183460469231731687303715884105728 THEN FALSE
                ELSE b.base
                     + COALESCE((SELECT SUM(t.amount) FROM tokens t
                                 WHERE t.wallet = b.w AND t.token_type = b.t
                                   AND t.spendable AND t.spent_by IS NULL
                                   AND NOT EXISTS (
                                       SELECT 1 FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
                                       WHERE s.tx_id = t.tx_id AND s.idx = t.idx)), 0)
                     > 340282366920938463463374607431768211455
            END
            ORDER BY b.w COLLATE "C", b.t COLLATE "C"
            LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- Step 6. The outputs first, in index order, by a statement of their own:
    -- waiting here for an add that holds an output id uncommitted, this call
    -- has written no row an add could wait for (0007's header).
    RETURN QUERY
        WITH added AS (
            INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
            SELECT p_consumer, o.n - 1, o.w, o.t, o.a::NUMERIC, TRUE
            FROM unnest(p_wallets, p_types, p_amounts) WITH ORDINALITY AS o(w, t, a, n)
            ORDER BY o.n
            RETURNING wallet, token_type
        )
        SELECT DISTINCT 'key'::TEXT, NULL::TEXT, NULL::BIGINT, a.wallet || E'\t' || a.token_type
        FROM added a;
    -- Then, in one statement, the status, the release, the forgetting and the
    -- spend of exactly the inputs (rows it holds), whatever selection or lock
    -- row of theirs is still there. Its token and lock rows are the ones
    -- locked above, so it waits at most for another writer of the status row
    -- or of a selection row of this consumer, none of which waits for a lock
    -- this call holds (locks.rs states the whole argument). The keys read the
    -- released tokens' wallet and type from the statement's snapshot: the spend
    -- changes neither.
    RETURN QUERY
        WITH recorded AS (
            INSERT INTO tx_statuses (tx_id, status, recorded_at)
            VALUES (p_consumer, 'confirmed', at_ts)
            ON CONFLICT (tx_id) DO UPDATE
            SET status = EXCLUDED.status, recorded_at = EXCLUDED.recorded_at
        ),
        released AS (
            DELETE FROM token_locks l
            USING unnest(in_tx, in_idx) AS s(tx_id, idx)
            WHERE l.consumer = p_consumer AND l.tx_id = s.tx_id AND l.idx = s.idx
            RETURNING l.tx_id, l.idx
        ),
        forgotten AS (
            DELETE FROM selections x
            USING unnest(in_tx, in_idx) AS s(tx_id, idx)
            WHERE x.consumer = p_consumer AND x.tx_id = s.tx_id AND x.idx = s.idx
        ),
        spent AS (
            UPDATE tokens t
            SET spent_by = p_consumer, spent_at = at_ts
            FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
            WHERE t.tx_id = s.tx_id AND t.idx = s.idx AND t.spent_by IS NULL
            RETURNING t.tx_id, t.idx
        )
        (SELECT DISTINCT 'key'::TEXT, NULL::TEXT, NULL::BIGINT, t.wallet || E'\t' || t.token_type
         FROM released r JOIN tokens t ON t.tx_id = r.tx_id AND t.idx = r.idx)
        UNION ALL
        (SELECT 'spent'::TEXT, s.tx_id::TEXT, s.idx, NULL::TEXT FROM spent s);
END;
$$;

DROP FUNCTION holdfast_check_amounts(TEXT[], TEXT[], TEXT[]);
