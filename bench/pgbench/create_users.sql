-- CreateUsers on PostgreSQL, as a relay draining a backlog sends it: 16 users and their
-- inbox rows in one statement, its own transaction (users-svc/src/create_user.rs:
-- insert_users_with_inbox; 16 is relay --rows-per-call's default, and loadgen's
-- USERS_PER_CALL). The service binds the rows as a VALUES list; here they come from
-- generate_series, the same rows and columns. Rows per second are 16 x the tps.
\set n random(1, 9000000000000000000)
WITH first AS (
  INSERT INTO users (id, email, first_name, last_name, document_number, student_id, enabled, created_at, source_version)
    SELECT md5(:client_id::text || '-' || :n::text || '-' || g::text)::uuid, 'load@example.edu', 'Load', 'User', 'U' || :client_id::text || '-' || :n::text || '-' || g::text, gen_random_uuid(), true, now(), 1
      FROM generate_series(1, 16) AS g
)
INSERT INTO inbox (idempotency_key, request_hash, result, created_at)
  SELECT 'k-' || :client_id::text || '-' || :n::text || '-' || g::text, 'hash', json_build_object('outcome', 'created', 'user_id', md5(:client_id::text || '-' || :n::text || '-' || g::text)::uuid::text), now()
    FROM generate_series(1, 16) AS g;
