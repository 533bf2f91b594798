-- Owned work: every lock and selection records the owner id of the backend
-- instance that claimed it, and every selection when it was made (stored time
-- text; rows of older versions: owner '' and the time of this migration).

ALTER TABLE locks ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE selections ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE selections ADD COLUMN selected_at TEXT NOT NULL DEFAULT '';
UPDATE selections SET selected_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now');
CREATE INDEX selections_owner ON selections (owner);

-- The unspent tokens that are not spendable, by wallet and type: what the
-- balance-overflow check of an add or a confirm sums beside the candidates.
CREATE INDEX tokens_unspendable ON tokens (wallet, token_type, amount)
    WHERE spendable = 0 AND spent_by IS NULL;
