-- CreateStudent on PostgreSQL: the student and its create-user outbox row in one
-- statement, its own transaction (student-store/src/students.rs: insert_together). The
-- service binds the student's id; here it is derived from the client and a random number
-- so that both rows carry the same one. student-svc sends the NOTIFY that wakes the relays
-- after the commit (student-store/src/wake.rs), outside this statement. Both rows carry the
-- client key, as the service's do for a keyed call (loadgen keys every call), so the
-- outbox's unique index on client keys is checked here too.
\set n random(1, 9000000000000000000)
WITH first AS (
  INSERT INTO students (id, first_name, last_name, email, document_number, user_id, client_key, request_hash, created_at, updated_at, version, synced_version, active)
    VALUES (md5(:client_id::text || '-' || :n::text)::uuid, 'Load', 'Student', 'load@example.edu', 'P' || :client_id::text || '-' || :n::text, NULL, 'bench-' || :client_id::text || '-' || :n::text, 'hash', now(), now(), 1, 0, true)
)
INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, idempotency_key, status, attempts, last_error, error_code, locked_until, locked_by, created_at, processed_at, result, failure_kind, client_key, request_hash, traceparent)
  VALUES (md5(:client_id::text || '-' || :n::text)::uuid, 1, 'create-user', '{"version":1,"email":"load@example.edu","first_name":"Load","last_name":"Student","document_number":"P","student_id":"00000000-0000-0000-0000-000000000000"}'::json, gen_random_uuid()::text, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL, NULL, NULL, 'bench-' || :client_id::text || '-' || :n::text, 'hash', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')
  RETURNING *;
