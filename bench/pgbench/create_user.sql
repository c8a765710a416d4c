-- CreateUser: the inbox lookup by key, then the user and its inbox row in one
-- transaction. (users-svc/src/create_user.rs)
\set n random(1, 9000000000000000000)
SELECT idempotency_key, request_hash, result, created_at FROM inbox WHERE idempotency_key = 'k-' || :client_id::text || '-' || :n::text;
BEGIN;
INSERT INTO users (id, email, first_name, last_name, document_number, student_id, enabled, created_at, source_version)
  VALUES (gen_random_uuid(), 'load@example.edu', 'Load', 'User', 'U' || :client_id::text || '-' || :n::text, gen_random_uuid(), true, now(), 1)
  RETURNING id \gset
INSERT INTO inbox (idempotency_key, request_hash, result, created_at)
  VALUES ('k-' || :client_id::text || '-' || :n::text, 'hash', json_build_object('outcome', 'created', 'user_id', :id::text), now());
COMMIT;
