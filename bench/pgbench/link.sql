-- The relay's Student side of a batch, as it runs it (student-store/src/outbox.rs and
-- finish_many.rs): the claim of 32 due rows in one statement (CLAIM_POSTGRES, committed
-- without waiting for the disk), then the group commit: the held rows `done` and their
-- students linked, two set-based statements in one transaction. The relay sends Users'
-- answers as a VALUES list; here they are read back from the claimed rows, with a new
-- user id each. Rows per second are counted from the `done` rows afterwards (a claim may
-- find fewer than 32).
WITH no_flush AS MATERIALIZED (
       SELECT set_config('synchronous_commit', 'off', true) AS setting),
     claimed AS MATERIALIZED (
       SELECT candidate.id FROM outbox AS candidate CROSS JOIN no_flush
        WHERE candidate.status IN ('pending', 'processing')
          AND ((candidate.status = 'pending' AND candidate.available_at <= now())
            OR (candidate.status = 'processing' AND candidate.locked_until < now()))
          AND candidate.aggregate_version =
                (SELECT MIN(earlier.aggregate_version) FROM outbox AS earlier
                  WHERE earlier.aggregate_id = candidate.aggregate_id AND earlier.status <> 'done')
        ORDER BY candidate.id
        LIMIT 32
          FOR UPDATE OF candidate SKIP LOCKED),
     taken AS (
       UPDATE outbox SET status = 'processing', locked_by = 'bench',
              locked_until = now() + 60000 * interval '1 millisecond', attempts = attempts + 1
         FROM claimed WHERE outbox.id = claimed.id
       RETURNING outbox.id)
SELECT coalesce(array_agg(id), '{}') AS ids FROM taken
\gset
BEGIN;
WITH answered (row_id, attempt, key, user_id) AS (
       SELECT id, attempts, idempotency_key, gen_random_uuid()::text FROM outbox WHERE id = ANY (:ids::bigint[]))
UPDATE outbox
   SET status = 'done', result = answered.user_id, processed_at = now(),
       last_error = NULL, error_code = NULL, locked_by = NULL, locked_until = NULL
  FROM answered
 WHERE outbox.id = answered.row_id AND outbox.status = 'processing' AND outbox.locked_by = 'bench'
   AND outbox.attempts = answered.attempt AND outbox.idempotency_key = answered.key
RETURNING id;
WITH answered (student_id, version, user_id, created) AS (
       SELECT aggregate_id, aggregate_version, gen_random_uuid(), true FROM outbox WHERE id = ANY (:ids::bigint[]))
UPDATE students
   SET synced_version = CASE WHEN students.synced_version < answered.version THEN answered.version ELSE students.synced_version END,
       user_id = CASE WHEN answered.created THEN answered.user_id ELSE students.user_id END,
       updated_at = CASE WHEN answered.created THEN now() ELSE students.updated_at END
  FROM answered
 WHERE students.id = answered.student_id
   AND (students.user_id = answered.user_id OR (answered.created AND students.user_id IS NULL))
RETURNING id;
COMMIT;
