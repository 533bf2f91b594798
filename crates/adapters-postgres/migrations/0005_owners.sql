-- holdfast schema, version 5: owned work. Every lock and selection records the
-- owner id of the backend instance that claimed it, and every selection when it
-- was made: a restarted instance finds its own unsettled transactions, and the
-- lease sweep forgets selections that outlived their lock by the retention
-- (rows of older versions: owner '' and the migration's time).

ALTER TABLE token_locks ADD COLUMN owner TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE selections ADD COLUMN owner TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE selections ADD COLUMN selected_at TIMESTAMPTZ NOT NULL DEFAULT now();
CREATE INDEX selections_owner ON selections (owner);
CREATE INDEX selections_selected_at ON selections (selected_at);

-- The unspent tokens that are not spendable, by wallet and type: what the
-- balance-overflow check of an add or a confirm sums beside the candidates.
CREATE INDEX tokens_unspendable ON tokens (wallet, token_type, amount)
    WHERE NOT spendable AND spent_by IS NULL;
