-- The relay's finalize: the row done (fenced by its claim), then the student linked with
-- its synced_version raised in one statement, in one transaction. (student-store/src/outbox.rs:
-- record_delivery.) Rows are picked at random among :rows claimed ones; a row picked
-- twice finds its fence gone and changes nothing, as a late finalize would.
\set id random(1, :rows)
BEGIN;
UPDATE outbox SET status = 'done', result = 'u', processed_at = now(), last_error = NULL, error_code = NULL, locked_by = NULL, locked_until = NULL
  WHERE id = :id AND status = 'processing' AND locked_by = 'bench' AND attempts = 1;
UPDATE students SET user_id = gen_random_uuid(), updated_at = now(),
    synced_version = CASE WHEN synced_version < 1 THEN 1 ELSE synced_version END
  WHERE id = (SELECT aggregate_id FROM outbox WHERE id = :id) AND user_id IS NULL;
COMMIT;
