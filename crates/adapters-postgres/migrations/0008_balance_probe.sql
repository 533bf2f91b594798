-- holdfast schema, version 8: the big-token read of holdfast_lock_balances
-- probes each pair's indexes.
--
-- Version 7 read "does a pair hold a token of 2^63 or more" as two EXISTS
-- subqueries correlated with the pair. PostgreSQL may plan such an EXISTS as a
-- hashed subplan, which reads every token of 2^63 or more of every wallet: on
-- tokens_candidates (wallet, token_type, amount, ...) that is a scan of the
-- whole index, since amount is its third column. auto_explain caught it on the
-- simulator's many-wallets preset: 252 buffers and 20-63 ms a call, so 31 ms of
-- CPU per confirm (pg_stat_statements with track = all), most of the
-- settlement's time. The same read, written as a LATERAL subquery per pair with
-- LIMIT 1, can only run per pair, as two index probes. Nothing else changes:
-- the same locks, in the same order, and the same answer.

CREATE OR REPLACE FUNCTION holdfast_lock_balances(p_wallets TEXT[], p_types TEXT[], p_amounts TEXT[])
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
