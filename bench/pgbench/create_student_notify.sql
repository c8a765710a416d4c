-- CreateStudent's transaction with the NOTIFY inside it (--wake-relays in-transaction):
-- the student and its create-user outbox row, then the NOTIFY, then the commit
-- (student-store/src/students.rs: create). By default student-svc writes both rows in one
-- statement instead (create_student.sql) and NOTIFYs after the commit. As there, both rows
-- carry the client key, and `available_at` is left to its default.
\set n random(1, 9000000000000000000)
BEGIN;
INSERT INTO students (id, first_name, last_name, email, document_number, user_id, client_key, request_hash, created_at, updated_at, version, synced_version, active)
  VALUES (gen_random_uuid(), 'Load', 'Student', 'load@example.edu', 'P' || :client_id::text || '-' || :n::text, NULL, 'bench-' || :client_id::text || '-' || :n::text, 'hash', now(), now(), 1, 0, true)
  RETURNING id \gset
INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, idempotency_key, status, attempts, last_error, error_code, locked_until, locked_by, created_at, processed_at, result, failure_kind, client_key, request_hash, traceparent)
  VALUES (:id::uuid, 1, 'create-user', '{"version":1,"email":"load@example.edu","first_name":"Load","last_name":"Student","document_number":"P","student_id":"00000000-0000-0000-0000-000000000000"}'::json, gen_random_uuid()::text, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL, NULL, NULL, 'bench-' || :client_id::text || '-' || :n::text, 'hash', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
NOTIFY outbox_created;
COMMIT;
