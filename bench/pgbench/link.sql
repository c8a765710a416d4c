-- The relay's finalize: the row done (fenced by its claim), the student linked and its
-- synced_version raised, in one transaction. (student-store/src/outbox.rs:
-- record_delivery.) Rows are picked at random among :rows claimed ones; a row picked
-- twice finds its fence gone and changes nothing, as a late finalize would.
\set id random(1, :rows)
BEGIN;
UPDATE outbox SET status = 'done', result = 'u', processed_at = now(), last_error = NULL, error_code = NULL, locked_by = NULL, locked_until = NULL
  WHERE id = :id AND status = 'processing' AND locked_by = 'bench' AND attempts = 1;
UPDATE students SET user_id = gen_random_uuid(), updated_at = now()
  WHERE id = (SELECT aggregate_id FROM outbox WHERE id = :id) AND user_id IS NULL;
UPDATE students SET synced_version = 1
  WHERE id = (SELECT aggregate_id FROM outbox WHERE id = :id) AND synced_version < 1;
COMMIT;
