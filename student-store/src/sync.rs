//! The state of a student's login user as clients see it, computed here and only here,
//! from the structured fields of its outbox row (status, failure kind, error code and
//! message), never by parsing a string.

use crate::entity::{
    outbox::{self, FailureKind, OutboxStatus},
    students,
};

/// Where the login user of a student is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// No create-user row and no user (a student from before the outbox existed).
    Unknown,
    /// Being created.
    Pending,
    /// Created and linked.
    Linked,
    /// Not created, for the reason given; an operator can act on it.
    Failed(LinkError),
}

/// Why a student has no login user: a stable reason and a readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkError {
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for LinkError {
    /// `REASON: message`, the form of the API's `link_error`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// The link state of a student, given its `create-user` row.
pub fn link_state(student: &students::Model, create_user: Option<&outbox::Model>) -> LinkState {
    let Some(row) = create_user else {
        // Linked without a row: created by `--link-mode direct`.
        return match student.user_id {
            Some(_) => LinkState::Linked,
            None => LinkState::Unknown,
        };
    };
    match row.status {
        OutboxStatus::Done => LinkState::Linked,
        OutboxStatus::Pending | OutboxStatus::Processing => LinkState::Pending,
        OutboxStatus::Failed => LinkState::Failed(failure(row)),
    }
}

/// Why a failed row failed. Running out of attempts shows a fixed sentence, never the
/// transport error the relay recorded for operators; a rejection shows its reason and
/// message.
fn failure(row: &outbox::Model) -> LinkError {
    if row.failure_kind == Some(FailureKind::Exhausted) {
        return LinkError {
            reason: "USERS_UNREACHABLE".to_owned(),
            message: "the login user could not be created; an operator can redrive it".to_owned(),
        };
    }
    LinkError {
        reason: row
            .error_code
            .clone()
            .unwrap_or_else(|| "REJECTED".to_owned()),
        message: row.last_error.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use sea_orm::prelude::Uuid;

    use super::*;

    fn student(user_id: Option<Uuid>) -> students::Model {
        students::Model {
            id: Uuid::nil(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            email: "ana@example.edu".into(),
            document_number: "DOC-1".into(),
            user_id,
            client_key: None,
            request_hash: "hash".into(),
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
            version: 1,
            synced_version: 0,
            active: true,
        }
    }

    fn failed_row(
        failure_kind: FailureKind,
        error_code: Option<&str>,
        last_error: Option<&str>,
    ) -> outbox::Model {
        outbox::Model {
            id: 1,
            aggregate_id: Uuid::nil(),
            aggregate_version: 1,
            effect_type: crate::effect::CREATE_USER.into(),
            payload: serde_json::json!({ "version": 1 }),
            idempotency_key: "key".into(),
            status: OutboxStatus::Failed,
            attempts: 3,
            last_error: last_error.map(str::to_owned),
            available_at: DateTime::UNIX_EPOCH,
            locked_until: None,
            locked_by: None,
            created_at: DateTime::UNIX_EPOCH,
            processed_at: Some(DateTime::UNIX_EPOCH),
            result: None,
            failure_kind: Some(failure_kind),
            error_code: error_code.map(str::to_owned),
            client_key: None,
            request_hash: None,
            key_created_at: None,
            traceparent: None,
        }
    }

    fn link_error(row: &outbox::Model) -> String {
        match link_state(&student(None), Some(row)) {
            LinkState::Failed(error) => error.to_string(),
            other => panic!("a failed row is a failed link, not {other:?}"),
        }
    }

    /// A student without a create-user row is linked exactly when it has a user.
    #[test]
    fn a_student_without_a_row_is_linked_only_if_it_has_a_user() {
        assert_eq!(
            link_state(&student(Some(Uuid::from_u128(7))), None),
            LinkState::Linked
        );
        assert_eq!(link_state(&student(None), None), LinkState::Unknown);
    }

    /// A row not yet ended is pending, whether it waits or is being delivered; a done row
    /// is linked, whatever the student read says.
    #[test]
    fn a_row_being_delivered_is_pending_and_a_done_row_linked() {
        let row = |status| outbox::Model {
            status,
            attempts: 1,
            processed_at: None,
            failure_kind: None,
            error_code: None,
            ..failed_row(FailureKind::Rejected, None, None)
        };
        for status in [OutboxStatus::Pending, OutboxStatus::Processing] {
            assert_eq!(
                link_state(&student(None), Some(&row(status))),
                LinkState::Pending,
                "{status:?}"
            );
        }
        assert_eq!(
            link_state(
                &student(Some(Uuid::from_u128(7))),
                Some(&row(OutboxStatus::Done))
            ),
            LinkState::Linked
        );
    }

    /// Only running out of attempts hides the recorded error behind the fixed sentence; an
    /// expired or rejected row shows its own reason and message.
    #[test]
    fn each_failure_kind_shows_its_own_link_error() {
        assert_eq!(
            link_error(&failed_row(
                FailureKind::Expired,
                Some("DELIVERY_EXPIRED"),
                Some("older than the inbox retention")
            )),
            "DELIVERY_EXPIRED: older than the inbox retention"
        );
        assert_eq!(
            link_error(&failed_row(
                FailureKind::Exhausted,
                Some("UNAVAILABLE"),
                Some("transport error: connection refused")
            )),
            "USERS_UNREACHABLE: the login user could not be created; an operator can redrive it"
        );
        assert_eq!(
            link_error(&failed_row(
                FailureKind::Rejected,
                Some("DOCUMENT_NUMBER_TAKEN"),
                Some("document_number is already used")
            )),
            "DOCUMENT_NUMBER_TAKEN: document_number is already used"
        );
        assert_eq!(
            link_error(&failed_row(FailureKind::Rejected, None, None)),
            "REJECTED: "
        );
    }
}
