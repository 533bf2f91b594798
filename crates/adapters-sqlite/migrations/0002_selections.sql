-- holdfast schema v2: selections, what each transaction selected, kept apart from
-- the locks. The lease sweep deletes lock rows only; settling a transaction as
-- confirmed spends what it selected even when its locks were swept meanwhile.
-- A row is written with the lock it records (same transaction) and removed when
-- the transaction settles or its select gives the token back.
CREATE TABLE selections (
    consumer TEXT    NOT NULL,
    tx       TEXT    NOT NULL,
    output   INTEGER NOT NULL,
    PRIMARY KEY (consumer, tx, output)
);

-- Every lock of a database migrated from version 1 was won by its consumer's select.
INSERT INTO selections (consumer, tx, output) SELECT consumer, tx, output FROM locks;
