//! Outbox rows for the relay's unit tests.

use chrono::{DateTime, Utc};
use student_store::entity::{
    outbox as outbox_row,
    outbox::{FailureKind, OutboxStatus},
};
use uuid::Uuid;

/// A `failed` row of student nil at `version`, its key `key-ID`, every time
/// 2026-12-01T10:00:00.123456Z, its payload an e-mail that must never be printed.
pub(crate) fn row(id: i64, version: i64) -> outbox_row::Model {
    let at = DateTime::parse_from_rfc3339("2026-12-01T10:00:00.123456Z")
        .expect("time")
        .with_timezone(&Utc);
    outbox_row::Model {
        id,
        aggregate_id: Uuid::nil(),
        aggregate_version: version,
        effect_type: "create-user".into(),
        payload: serde_json::json!({ "email": "never@printed.example" }),
        idempotency_key: format!("key-{id}"),
        status: OutboxStatus::Failed,
        attempts: 3,
        last_error: Some("document_number is already used".into()),
        available_at: at,
        locked_until: None,
        locked_by: None,
        created_at: at,
        processed_at: None,
        result: None,
        failure_kind: Some(FailureKind::Rejected),
        error_code: Some("DOCUMENT_NUMBER_TAKEN".into()),
        client_key: None,
        request_hash: None,
        key_created_at: None,
        traceparent: None,
    }
}
