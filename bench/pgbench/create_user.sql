-- CreateUser on PostgreSQL: the user and its inbox row in one statement, its own
-- transaction (users-svc/src/create_user.rs: insert_together). A first delivery is not
-- looked up first: the inbox's primary key refuses a repeat, and the users-svc answers
-- repeats it remembers from memory.
\set n random(1, 9000000000000000000)
WITH first AS (
  INSERT INTO users (id, email, first_name, last_name, document_number, student_id, enabled, created_at, source_version)
    VALUES (md5(:client_id::text || '-' || :n::text)::uuid, 'load@example.edu', 'Load', 'User', 'U' || :client_id::text || '-' || :n::text, gen_random_uuid(), true, now(), 1)
)
INSERT INTO inbox (idempotency_key, request_hash, result, created_at)
  VALUES ('k-' || :client_id::text || '-' || :n::text, 'hash', json_build_object('outcome', 'created', 'user_id', md5(:client_id::text || '-' || :n::text)::uuid::text), now());
