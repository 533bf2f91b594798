-- holdfast schema, version 7: small adds share the balance lock.
--
-- Adding to a wallet and type's unspent total (add_tokens, the outputs of
-- holdfast_confirm) takes the pair's balance lock (first key: the bytes of
-- "wbal", second hashtext(wallet TAB type), in key order), so that two adds
-- cannot each see the other's tokens missing and together lift the total past
-- 2^128 - 1. Version 4 took it exclusive for every add: the confirms paying into
-- one wallet ran one at a time. Now holdfast_lock_balances(wallets, types,
-- amounts) takes it, for both callers:
--   - an add is small when every amount it adds is below 2^63 and no pair it
--     adds to holds an unspent token (spendable or not) of 2^63 or more. A small
--     add takes the locks shared and checks no total;
--   - any other add takes them exclusive and checks the totals as version 4 did.
-- Why a small add cannot overflow: a token of 2^63 or more is only ever added
-- under the exclusive lock, which no small add holds at the same time. So when a
-- small add commits, the tokens of its pair are the ones its read saw (all below
-- 2^63; the read is a statement of its own after the locks, so its snapshot
-- shows every add committed under an exclusive lock before them), plus those of
-- small adds (all below 2^63). A table holds fewer than 2^64 rows: below 2^63
-- each, they sum below 2^127 < 2^128. An exclusive add excludes every other add
-- of its pairs, so its check is exact, as before; spends only lower a total.
--
-- How: if an amount is 2^63 or more, exclusive at once. Else the shared locks
-- and the read run in a block with an exception handler (a subtransaction); a
-- pair holding a big token raises the private SQLSTATE 'HFBIG' inside it, which
-- rolls the subtransaction back and with it releases the shared locks taken in
-- it, and the exclusive locks are taken after, in key order. No call waits for a
-- lock while it holds a balance lock out of key order, and none asks for the
-- exclusive lock while it holds the shared one: two transactions upgrading a
-- shared lock in place would each wait for the other's shared lock, and one
-- would fail with a deadlock (40P01) after deadlock_timeout. The read costs two
-- index probes per pair (tokens_candidates for the spendable tokens,
-- tokens_unspendable for the others), less than the check it replaces (a sum of
-- the unspendable tokens and a probe).
--
-- What the argument needs of a caller, and what the functions enforce:
--   - READ COMMITTED. The read "after the locks" sees their writers' commits only
--     if the statement takes a new snapshot; under REPEATABLE READ or
--     SERIALIZABLE it reads the transaction's snapshot, possibly taken before the
--     lock wait. holdfast_lock_balances raises SQLSTATE 25000 at any other level
--     (holdfast's sessions set default_transaction_isolation to read committed,
--     whatever the database or role defaults to).
--   - VOLATILE (declared; also CREATE FUNCTION's default): each statement of a
--     volatile function takes a new snapshot; a STABLE or IMMUTABLE one reads
--     with its caller's snapshot, from before the locks.
--   - One call per transaction. A second call into a pair the first locked
--     shared could ask for it exclusive while holding it shared: an upgrade in
--     place, which the paragraph above rules out. add_tokens and holdfast_confirm
--     call it once.
--   - Amounts are integers of 1 to 39 digits and the three arrays are of one
--     length without NULLs; anything else raises SQLSTATE 22023 (in
--     holdfast_confirm too, on entry). Else '9223372036854775807.5' would count
--     as small and be stored rounded to 2^63, and a NULL wallet or type (an array
--     shorter than the others reads as NULLs) would give a NULL key, which takes
--     no lock.
--
-- holdfast_confirm is replaced with the same signature and results. Step 5: the
-- locks through holdfast_lock_balances, the check only when it answers
-- exclusive. Step 6 inserts the outputs (in index order) before it releases,
-- forgets and spends the inputs. An insert, and add_tokens' ON CONFLICT DO
-- NOTHING on an existing id, waits for a transaction that inserted, updated or
-- deleted that row and has not committed (not for a mere row lock such as FOR
-- UPDATE). With the spend first, a confirm that has spent an input x and waits
-- to insert its output (c, 0) behind an add that holds (c, 0) uncommitted and
-- whose batch also names x closed a cycle: the add reaches x after (c, 0) in key
-- order and waits for the confirm's update of x (40P01). Inserting first, a
-- confirm waiting for an add holds only its confirm lock, lock-only row locks,
-- balance locks and its own lower-numbered outputs, which the add meets first in
-- key order (locks.rs states the whole argument).

-- Refuses (SQLSTATE 22023) outputs or adds that are not three arrays of one
-- length, without NULLs, whose amounts are integers of 1 to 39 digits.
CREATE FUNCTION holdfast_check_amounts(p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[])
RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    IF COALESCE(cardinality(p_wallets), 0) <> COALESCE(cardinality(p_types), 0)
       OR COALESCE(cardinality(p_wallets), 0) <> COALESCE(cardinality(p_amounts), 0) THEN
        RAISE EXCEPTION 'holdfast: % wallet(s), % type(s) and % amount(s) given: one of each per token',
            COALESCE(cardinality(p_wallets), 0), COALESCE(cardinality(p_types), 0),
            COALESCE(cardinality(p_amounts), 0)
            USING ERRCODE = '22023';
    END IF;
    IF array_position(p_wallets, NULL) IS NOT NULL
       OR array_position(p_types, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'holdfast: a wallet or type is NULL' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_amounts) AS a(a)
               WHERE a.a IS NULL OR a.a !~ '^[0-9]{1,39}$') THEN
        RAISE EXCEPTION 'holdfast: amount % is not an integer of 1 to 39 digits',
            (SELECT quote_nullable(a.a) FROM unnest(p_amounts) AS a(a)
             WHERE a.a IS NULL OR a.a !~ '^[0-9]{1,39}$' LIMIT 1)
            USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Takes the balance locks of the pairs (p_wallets[i], p_types[i]) that
-- p_amounts[i] are added to, in key order: shared, answering FALSE, when the add
-- is small (the caller checks no total); exclusive, answering TRUE, otherwise
-- (the caller checks the totals in a statement after this call). Once per
-- transaction, at READ COMMITTED (see the header).
CREATE FUNCTION holdfast_lock_balances(p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[])
RETURNS BOOLEAN
VOLATILE
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'holdfast_lock_balances needs READ COMMITTED, this transaction is %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = '25000',
                  HINT = 'set default_transaction_isolation to ''read committed'' for holdfast''s sessions';
    END IF;
    PERFORM holdfast_check_amounts(p_wallets, p_types, p_amounts);
    IF NOT EXISTS (SELECT 1 FROM unnest(p_amounts) AS a(a)
                   WHERE a.a::NUMERIC >= 9223372036854775808) THEN
        BEGIN
            PERFORM pg_advisory_xact_lock_shared(2002936172, p.k)
                FROM (SELECT DISTINCT hashtext(w || E'\t' || t) AS k
                      FROM unnest(p_wallets, p_types) AS i(w, t)) AS p
                ORDER BY p.k;
            -- A statement of its own, after the locks: its snapshot shows every
            -- token added under an exclusive lock of these pairs.
            IF NOT EXISTS (
                SELECT 1
                FROM (SELECT DISTINCT w, t FROM unnest(p_wallets, p_types) AS i(w, t)) AS p
                WHERE EXISTS (SELECT 1 FROM tokens k
                              WHERE k.wallet = p.w AND k.token_type = p.t
                                AND k.spendable AND k.spent_by IS NULL
                                AND k.amount >= 9223372036854775808)
                   OR EXISTS (SELECT 1 FROM tokens k
                              WHERE k.wallet = p.w AND k.token_type = p.t
                                AND NOT k.spendable AND k.spent_by IS NULL
                                AND k.amount >= 9223372036854775808)
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

-- Version 4's holdfast_confirm (its header describes steps 1 to 6): the
-- outputs checked on entry (holdfast_check_amounts), step 5 taking the balance
-- locks through holdfast_lock_balances and checking the totals only when they
-- are exclusive, step 6 inserting the outputs before spending the inputs.
CREATE OR REPLACE FUNCTION holdfast_confirm(
    p_consumer TEXT, p_at_ms BIGINT, p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[]
)
RETURNS TABLE (kind TEXT, tx TEXT, idx BIGINT, detail TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    at_ts TIMESTAMPTZ := TIMESTAMPTZ 'epoch' + p_at_ms * INTERVAL '1 millisecond';
    n_given BIGINT := COALESCE(cardinality(p_wallets), 0);
    n_stored BIGINT;
    n_same BIGINT;
    confirmed BOOLEAN;
    in_tx TEXT[];
    in_idx BIGINT[];
BEGIN
    PERFORM holdfast_check_amounts(p_wallets, p_types, p_amounts);
    PERFORM pg_advisory_xact_lock(1668247142, hashtext(p_consumer));
    SELECT EXISTS (SELECT 1 FROM tx_statuses s
                   WHERE s.tx_id = p_consumer AND s.status = 'confirmed')
        INTO confirmed;
    SELECT count(*) FROM tokens k WHERE k.tx_id = p_consumer INTO n_stored;
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
    PERFORM 1 FROM selections s
        JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
        WHERE s.consumer = p_consumer
        ORDER BY t.tx_id, t.idx
        FOR UPDATE OF t;
    PERFORM 1 FROM token_locks l
        WHERE l.consumer = p_consumer
        ORDER BY l.tx_id, l.idx
        FOR UPDATE OF l;
    -- The inputs, once: every step below uses this set, so a claim of the same
    -- transaction committing meanwhile (a select still running) is neither
    -- counted nor spent; its lock and selection stay for its own give-back.
    SELECT COALESCE(array_agg(s.tx_id::TEXT ORDER BY s.tx_id, s.idx), '{}'),
           COALESCE(array_agg(s.idx ORDER BY s.tx_id, s.idx), '{}')
        FROM selections s WHERE s.consumer = p_consumer
        INTO in_tx, in_idx;
    RETURN QUERY
        SELECT 'double_spend'::TEXT, t.tx_id::TEXT, t.idx, t.spent_by::TEXT
        FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
        JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
        WHERE t.spent_by IS NOT NULL AND t.spent_by <> p_consumer
        ORDER BY t.tx_id, t.idx
        LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
        WITH ins AS (
            SELECT t.token_type::TEXT AS token_type, SUM(t.amount) AS total
            FROM unnest(in_tx, in_idx) AS s(tx_id, idx)
            JOIN tokens t ON t.tx_id = s.tx_id AND t.idx = s.idx
            WHERE t.spent_by IS NULL
            GROUP BY t.token_type
        ),
        outs AS (
            SELECT o.t AS token_type, SUM(o.a::NUMERIC) AS total
            FROM unnest(p_types, p_amounts) AS o(t, a)
            GROUP BY o.t
        )
        SELECT 'not_conserved'::TEXT, NULL::TEXT, NULL::BIGINT,
               COALESCE(i.token_type, o.token_type) || E'\t' || COALESCE(i.total, 0)::TEXT
                   || E'\t' || COALESCE(o.total, 0)::TEXT
        FROM ins i FULL JOIN outs o ON o.token_type = i.token_type
        WHERE COALESCE(i.total, 0) <> COALESCE(o.total, 0)
        ORDER BY COALESCE(i.token_type, o.token_type) COLLATE "C"
        LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Step 5: the outputs' balance locks, shared for a small add, else
    -- exclusive (holdfast_lock_balances). Only under exclusive locks can a total
    -- come near 2^128 - 1, so only then is it checked; the check is a statement
    -- of its own, after the locks, and sees every write committed under them.
    IF holdfast_lock_balances(p_wallets, p_types, p_amounts) THEN
        -- base: the outputs plus the unspendable tokens left (through
        -- tokens_unspendable). The spendable ones left are summed only if their
        -- largest is 2^63 or more or base exceeds 2^127: fewer than 2^64 rows of
        -- amounts below 2^63 sum below 2^127, and adding at most 2^127 to that
        -- cannot pass 2^128 - 1 (add_tokens argues the same).
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
    -- Step 6. The outputs first, in index order: waiting here for an add that
    -- holds an output id uncommitted, this call has written no row an add
    -- could wait for (see the header).
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
    INSERT INTO tx_statuses (tx_id, status, recorded_at)
    VALUES (p_consumer, 'confirmed', at_ts)
    ON CONFLICT (tx_id) DO UPDATE
    SET status = EXCLUDED.status, recorded_at = EXCLUDED.recorded_at;
    RETURN QUERY
        WITH released AS (
            DELETE FROM token_locks l
            USING unnest(in_tx, in_idx) AS s(tx_id, idx)
            WHERE l.consumer = p_consumer AND l.tx_id = s.tx_id AND l.idx = s.idx
            RETURNING l.tx_id, l.idx
        )
        SELECT DISTINCT 'key'::TEXT, NULL::TEXT, NULL::BIGINT, t.wallet || E'\t' || t.token_type
        FROM released r JOIN tokens t ON t.tx_id = r.tx_id AND t.idx = r.idx;
    RETURN QUERY
        WITH forgotten AS (
            DELETE FROM selections x
            USING unnest(in_tx, in_idx) AS s(tx_id, idx)
            WHERE x.consumer = p_consumer AND x.tx_id = s.tx_id AND x.idx = s.idx
            RETURNING x.tx_id, x.idx
        )
        UPDATE tokens t
        SET spent_by = p_consumer, spent_at = at_ts
        FROM forgotten f
        WHERE t.tx_id = f.tx_id AND t.idx = f.idx AND t.spent_by IS NULL
        RETURNING 'spent'::TEXT, t.tx_id::TEXT, t.idx, NULL::TEXT;
END;
$$;
