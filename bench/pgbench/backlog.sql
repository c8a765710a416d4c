-- :rows students with their create-user rows, due: the backlog link.sql drains. (Written
-- once, before the measured run, then vacuumed and analyzed, as a running outbox is.)
INSERT INTO students (id, first_name, last_name, email, document_number, request_hash, created_at, updated_at, version, synced_version, active)
  SELECT gen_random_uuid(), 'Load', 'Student', 'load@example.edu', 'B' || n, 'hash', now(), now(), 1, 0, true
    FROM generate_series(1, :rows) AS n;
INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, idempotency_key, status, attempts, available_at, created_at)
  SELECT id, 1, 'create-user', '{"version":1}'::json, gen_random_uuid()::text, 'pending', 0, now(), now()
    FROM students WHERE document_number LIKE 'B%';
