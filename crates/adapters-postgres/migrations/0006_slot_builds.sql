-- holdfast schema, version 6: the build publications of slot owners (admission
-- across replicas).
--
-- Every owner's build data lives in one JSONB map keyed by the owner's request
-- id, not in more arrays parallel to `owners`: an older holdfast still running
-- during a rolling upgrade rewrites `owners` and the two time arrays but not this
-- column, and parallel arrays it does not know would fall out of step. An entry:
--
--   "request/q/7": {"claimed_ms": 1700000000000, "generation": 2,
--                   "published_ms": 1700000000500, "expiring": false}
--
-- `generation` is the generation of the build's last publication (0: none
-- recorded), `published_ms` when it was published (null before the first and
-- after a failed one was withdrawn; only this code writes null), `expiring`
-- whether a reconcile marked the slot (its lease ran out). `claimed_ms` binds the
-- entry to one claim: it counts only while it equals the owner's
-- `owner_claimed_ms`, so an entry an older writer left behind never lends its
-- generation to a later claim of the same id.
--
-- Reading: entries of ids that are not owners are ignored. An owner whose
-- publication this code never recorded (no entry, an entry of an earlier claim,
-- an entry that is not an object) reads as generation 0, published at the time
-- of the newest migration (`_sqlx_migrations.installed_on`), not expiring, with a
-- warning: a build an older holdfast started may still run, so it stays live
-- while its heartbeats keep coming and is published again only when they stop
-- for `resume_after`. A `published_ms` that is missing or not a time reads as
-- that time too. Owner times that are NULL, missing (an array shorter than
-- `owners`) or out of range read as that time, with a warning. The next write of
-- the queue stores the whole row as read.
--
-- Owners of a migrated database get an entry of their current claim, generation
-- 0, published now (this migration's transaction, the `installed_on` sqlx
-- records for it), not expiring: they read the same way, without a warning.
ALTER TABLE queues
    ADD COLUMN owner_builds JSONB NOT NULL DEFAULT '{}'
        CONSTRAINT queues_owner_builds_object CHECK (jsonb_typeof(owner_builds) = 'object');
UPDATE queues AS q
SET owner_builds = COALESCE(
    (SELECT jsonb_object_agg(o.id, jsonb_build_object(
                'claimed_ms', o.claimed_ms, 'generation', 0,
                'published_ms', (extract(epoch FROM now()) * 1000)::BIGINT,
                'expiring', false))
     FROM unnest(q.owners, q.owner_claimed_ms) AS o(id, claimed_ms)
     WHERE o.id IS NOT NULL),
    '{}');
