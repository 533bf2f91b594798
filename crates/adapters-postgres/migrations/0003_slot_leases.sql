-- holdfast schema v3: slot leases, limits in the database, fail reasons, retention.
-- Every owner carries when it claimed its slot and its last heartbeat (milliseconds
-- since the epoch), in arrays parallel to `owners`; owners of a migrated database
-- start their lease now, so an upgrade expires no running build.
ALTER TABLE queues
    ADD COLUMN owner_claimed_ms   BIGINT[] NOT NULL DEFAULT '{}',
    ADD COLUMN owner_heartbeat_ms BIGINT[] NOT NULL DEFAULT '{}',
    -- One truth for every replica (0 pauses the queue); NULL until the next head is
    -- stamped with the configured default, or a limit is set.
    ADD COLUMN max_concurrent     INTEGER CHECK (max_concurrent >= 0);
UPDATE queues
SET owner_claimed_ms = array_fill((extract(epoch FROM now()) * 1000)::BIGINT,
                                  ARRAY[cardinality(owners)]),
    owner_heartbeat_ms = array_fill((extract(epoch FROM now()) * 1000)::BIGINT,
                                    ARRAY[cardinality(owners)]);
ALTER TABLE queues
    ADD CONSTRAINT queues_owner_times CHECK (
        cardinality(owner_claimed_ms) = cardinality(owners)
        AND cardinality(owner_heartbeat_ms) = cardinality(owners));

-- Why admission failed a request, when it was ingested (admission's wait runs from
-- there; unknown before the upgrade, so the upgrade's time) and when it was last
-- written (retention removes terminal requests by that age).
ALTER TABLE requests
    ADD COLUMN reason      TEXT CHECK (reason IN ('slot_lease_expired', 'dead_lettered')),
    ADD COLUMN ingested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ADD COLUMN updated_at  TIMESTAMPTZ NOT NULL DEFAULT now();

-- Periodic reconcile: one leader per tick. The replica whose update moves `tick`
-- forward leads that tick; the others skip it.
CREATE TABLE reconcile_ticks (
    name TEXT COLLATE "C" PRIMARY KEY,
    tick BIGINT NOT NULL
);
INSERT INTO reconcile_ticks (name, tick) VALUES ('reconcile', 0);
