-- The relay's Student side of a batch, as it runs it (student-store/src/outbox.rs and
-- finish_many.rs): the claim of 32 due rows in one statement (CLAIM_POSTGRES, committed
-- without waiting for the disk), then the group commit: the held rows `done` and their
-- students linked, in one statement that is its own transaction. The relay sends Users'
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
WITH answered (row_id, attempt, key, student_id, version, user_id, created) AS (
       SELECT id, attempts, idempotency_key, aggregate_id, aggregate_version, gen_random_uuid(), true
         FROM outbox WHERE id = ANY (:ids::bigint[])),
     held AS MATERIALIZED (
       SELECT answered.* FROM answered JOIN outbox ON outbox.id = answered.row_id
        WHERE outbox.status = 'processing'
          AND outbox.locked_by = 'bench'
          AND outbox.attempts = answered.attempt
          AND outbox.idempotency_key = answered.key
        ORDER BY answered.row_id
          FOR UPDATE OF outbox),
     accepted AS MATERIALIZED (
       SELECT held.* FROM held JOIN students ON students.id = held.student_id
        WHERE (students.user_id = held.user_id
               OR (held.created AND students.user_id IS NULL))
          FOR UPDATE OF students),
     done AS (
       UPDATE outbox
          SET status = 'done', result = accepted.user_id::text, processed_at = now(),
              last_error = NULL, error_code = NULL, locked_by = NULL, locked_until = NULL
         FROM accepted
        WHERE outbox.id = accepted.row_id
       RETURNING outbox.id),
     linked AS (
       UPDATE students
          SET synced_version = CASE WHEN students.synced_version < accepted.version
                                    THEN accepted.version
                                    ELSE students.synced_version END,
              user_id = CASE WHEN accepted.created THEN accepted.user_id
                             ELSE students.user_id END,
              updated_at = CASE WHEN accepted.created THEN now()
                                ELSE students.updated_at END
         FROM accepted
        WHERE students.id = accepted.student_id
       RETURNING students.id)
SELECT held.row_id AS id, held.row_id IN (SELECT id FROM done) AS done FROM held;
