-- holdfast schema v3: slot leases, limits in the database, fail reasons, retention.
-- Every owner carries when it claimed its slot and its last heartbeat; owners of a
-- migrated database start their lease now, so an upgrade expires no running build.
ALTER TABLE queue_owners ADD COLUMN claimed_at   TEXT NOT NULL DEFAULT '';
ALTER TABLE queue_owners ADD COLUMN heartbeat_at TEXT NOT NULL DEFAULT '';
UPDATE queue_owners
SET claimed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
    heartbeat_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now');

-- The queue's slot limit, one truth for every replica (0 pauses the queue); NULL
-- until the next head is stamped with the configured default, or a limit is set.
ALTER TABLE queues ADD COLUMN max_concurrent INTEGER CHECK (max_concurrent >= 0);

-- Why admission failed a request (slot_lease_expired, dead_lettered), when it was
-- ingested (admission's wait runs from there; unknown before the upgrade, so the
-- upgrade's time) and when it was last written (retention removes terminal
-- requests by that age).
ALTER TABLE requests ADD COLUMN reason TEXT;
ALTER TABLE requests ADD COLUMN ingested_at TEXT NOT NULL DEFAULT '';
ALTER TABLE requests ADD COLUMN updated_at TEXT NOT NULL DEFAULT '';
UPDATE requests
SET ingested_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now');

-- Periodic reconcile: one leader per tick. The replica whose update moves `tick`
-- forward leads that tick; the others skip it.
CREATE TABLE reconcile_ticks (
    name TEXT    NOT NULL PRIMARY KEY,
    tick INTEGER NOT NULL
);
INSERT INTO reconcile_ticks (name, tick) VALUES ('reconcile', 0);
