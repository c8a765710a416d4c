-- :rows students with their create-user rows, claimed by relay 'bench': what link.sql
-- finalizes. (Written once, before the measured run.)
INSERT INTO students (id, first_name, last_name, email, document_number, request_hash, created_at, updated_at, version, synced_version, active)
  SELECT gen_random_uuid(), 'Load', 'Student', 'load@example.edu', 'B' || n, 'hash', now(), now(), 1, 0, true
    FROM generate_series(1, :rows) AS n;
INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, idempotency_key, status, attempts, available_at, locked_until, locked_by, created_at)
  SELECT id, 1, 'create-user', '{"version":1}'::json, gen_random_uuid()::text, 'processing', 1, now(), now() + interval '1 hour', 'bench', now()
    FROM students WHERE document_number LIKE 'B%';
