-- holdfast schema, version 10: the change worked out inside the confirm.
--
-- A confirm with change used to be two round trips: a read of what the
-- consumer selected (its change is what those inputs hold beyond the given
-- outputs, per token type), then holdfast_confirm of the outputs with that
-- change. Measured on the simulator's presets, the read was a tenth of the
-- client's CPU and one statement of every four a settled select sends.
--
-- holdfast_confirm_with_change(consumer, at, change_wallet, wallets, types,
-- amounts) is version 9's holdfast_confirm, every step, lock and order kept,
-- but that once it holds the inputs (the selected token rows it locked whose
-- selection is still there) it appends the change to the given outputs: per
-- token type, in byte order, what the unspent inputs hold beyond the given
-- outputs of that type, to change_wallet. The steps after it (the double
-- spend and conservation refusals, the balance locks, the overflow check, the
-- inserts) see the outputs with their change, as they saw the outputs a caller
-- had added the change to. So the change is the change of exactly the inputs
-- the call spends: a claim or give-back of the same consumer committing between
-- a read and the confirm can no longer make it refuse as not conserved. The
-- inputs kept, the outputs with their change and the first refusal are one
-- statement (version 9 filtered the inputs and found the refusal in two).
--
-- It answers what version 9 answers, and a row 'change' per change output:
-- idx its output index, detail its type TAB amount. More outputs with the
-- change than 1024 (the ports' MAX_OUTPUTS) is 'bad_outputs'; a change above
-- 2^128 - 1 is 'overflow' (change_wallet TAB type). Once the consumer is
-- confirmed (or an output id is taken), it compares the stored outputs with
-- the given ones alone, as version 9 does: 'replayed' for a confirm that had
-- no change, else 'differ' (the caller then reads the stored outputs).
CREATE FUNCTION holdfast_confirm_with_change(
    p_consumer TEXT, p_at_ms BIGINT, p_change TEXT,
    p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[]
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
    all_wallets TEXT[];
    all_types TEXT[];
    all_amounts TEXT[];
    refused_kind TEXT;
    refused_tx TEXT;
    refused_idx BIGINT;
    refused_detail TEXT;
BEGIN
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%', bad USING ERRCODE = '22023';
    END IF;
    IF p_change IS NULL THEN
        RAISE EXCEPTION 'holdfast: no change wallet given' USING ERRCODE = '22023';
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
    -- The inputs, as version 9 takes them (its comments say why).
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
    -- In one statement: the inputs whose selection is still there; the
    -- outputs with their change (per type, in byte order, what the unspent
    -- inputs hold beyond the given outputs of that type); and the first
    -- refusal of version 9's steps 3 and 4 over those outputs, a change above
    -- 2^128 - 1 between them: an input another transaction spent, else a
    -- change too big, else the first type whose outputs exceed its unspent
    -- inputs (with the change, every other type adds up).
    WITH kept AS (
        SELECT s.tx_id, s.idx
        FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
        WHERE EXISTS (SELECT 1 FROM selections x
                      WHERE x.consumer = p_consumer AND x.tx_id = s.tx_id AND x.idx = s.idx)
    ),
    inputs AS (
        SELECT t.tx_id, t.idx, t.token_type, t.amount, t.spent_by
        FROM kept s JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
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
    change AS (
        SELECT i.token_type, i.total - COALESCE(o.total, 0) AS amount
        FROM ins i LEFT JOIN outs o ON o.token_type = i.token_type
        WHERE i.total > COALESCE(o.total, 0)
    ),
    refusals AS (
        (SELECT 0 AS rank, 'double_spend'::TEXT AS kind, i.tx_id::TEXT AS tx, i.idx,
                i.spent_by::TEXT AS detail
         FROM inputs i
         WHERE i.spent_by IS NOT NULL AND i.spent_by <> p_consumer
         ORDER BY i.tx_id, i.idx
         LIMIT 1)
        UNION ALL
        (SELECT 1, 'overflow'::TEXT, NULL::TEXT, NULL::BIGINT, p_change || E'\t' || c.token_type
         FROM change c
         WHERE c.amount > 340282366920938463463374607431768211455
         ORDER BY c.token_type COLLATE "C"
         LIMIT 1)
        UNION ALL
        (SELECT 2, 'not_conserved'::TEXT, NULL::TEXT, NULL::BIGINT,
                o.token_type || E'\t' || COALESCE(i.total, 0)::TEXT || E'\t' || o.total::TEXT
         FROM outs o LEFT JOIN ins i ON i.token_type = o.token_type
         WHERE o.total > COALESCE(i.total, 0)
         ORDER BY o.token_type COLLATE "C"
         LIMIT 1)
    )
    SELECT (SELECT COALESCE(array_agg(k.tx_id ORDER BY k.tx_id, k.idx), '{}') FROM kept k),
           (SELECT COALESCE(array_agg(k.idx ORDER BY k.tx_id, k.idx), '{}') FROM kept k),
           COALESCE(p_wallets, '{}')
               || (SELECT COALESCE(array_agg(p_change ORDER BY c.token_type COLLATE "C"), '{}') FROM change c),
           COALESCE(p_types, '{}')
               || (SELECT COALESCE(array_agg(c.token_type ORDER BY c.token_type COLLATE "C"), '{}') FROM change c),
           COALESCE(p_amounts, '{}')
               || (SELECT COALESCE(array_agg(c.amount::TEXT ORDER BY c.token_type COLLATE "C"), '{}') FROM change c),
           r.kind, r.tx, r.idx, r.detail
        FROM (SELECT 1) AS one
        LEFT JOIN (SELECT * FROM refusals ORDER BY rank LIMIT 1) AS r ON TRUE
        INTO in_tx, in_idx, all_wallets, all_types, all_amounts,
             refused_kind, refused_tx, refused_idx, refused_detail;
    IF cardinality(all_wallets) > 1024 THEN
        RETURN QUERY SELECT 'bad_outputs'::TEXT, NULL::TEXT, NULL::BIGINT,
            cardinality(all_wallets) || ' outputs with the change; expected at most 1024';
        RETURN;
    END IF;
    IF refused_kind IS NOT NULL THEN
        RETURN QUERY SELECT refused_kind, refused_tx, refused_idx, refused_detail;
        RETURN;
    END IF;
    -- Step 5 of version 9 over the outputs with their change.
    IF holdfast_lock_balances(all_wallets, all_types, all_amounts) THEN
        RETURN QUERY
            WITH outs AS (
                SELECT o.w, o.t, SUM(o.a::NUMERIC) AS total
                FROM unnest(all_wallets, all_types, all_amounts) AS o(w, t, a)
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
    -- Step 6 of version 9: the outputs with their change first, by a statement
    -- of their own, answering the change outputs beside the keys to wake.
    RETURN QUERY
        WITH added AS (
            INSERT INTO tokens (tx_id, idx, wallet, token_type, amount, spendable)
            SELECT p_consumer, o.n - 1, o.w, o.t, o.a::NUMERIC, TRUE
            FROM unnest(all_wallets, all_types, all_amounts) WITH ORDINALITY AS o(w, t, a, n)
            ORDER BY o.n
            RETURNING tokens.idx, wallet, token_type, amount
        )
        (SELECT DISTINCT 'key'::TEXT, NULL::TEXT, NULL::BIGINT, a.wallet || E'\t' || a.token_type
         FROM added a)
        UNION ALL
        (SELECT 'change'::TEXT, NULL::TEXT, a.idx, a.token_type || E'\t' || a.amount::TEXT
         FROM added a WHERE a.idx >= n_given);
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
