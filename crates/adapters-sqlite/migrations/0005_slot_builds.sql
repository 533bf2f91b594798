-- holdfast schema v5: the build publications of slot owners (admission across
-- replicas). Every owner row carries the generation of its build's last
-- publication (0: none recorded), when that generation was published (stored time
-- text; NULL before the first publication and after a failed one was withdrawn)
-- and whether a reconcile marked the slot expiring (its lease ran out; 0 or 1).
--
-- `published_at` defaults to '', which this code never writes: "not recorded by
-- this schema". Owners of a migrated database are set to generation 0, published
-- at the time of this migration, not expiring: a build an older holdfast started
-- may still run, so it stays live while its heartbeats keep coming and is
-- published again only when they stop for `resume_after`.
--
-- An older holdfast still running during a rolling upgrade rewrites a queue's
-- owner rows without these columns: its rows take the defaults (generation 0, ''
-- and not expiring), and '' reads as the time of the newest migration
-- (`holdfast_schema.applied_at`), with a warning, so they read like the owners
-- migrated here. Owner times it leaves empty (a schema v2 writer) or unreadable
-- read as that time too, with a warning; the next write of the queue stores them.
ALTER TABLE queue_owners ADD COLUMN generation   INTEGER NOT NULL DEFAULT 0 CHECK (typeof(generation) = 'integer' AND generation BETWEEN 0 AND 4294967295);
ALTER TABLE queue_owners ADD COLUMN published_at TEXT DEFAULT '';
ALTER TABLE queue_owners ADD COLUMN expiring     INTEGER NOT NULL DEFAULT 0 CHECK (expiring IN (0, 1));
UPDATE queue_owners SET published_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now');
