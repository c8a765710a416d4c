//! Everything a Users use case can fail with, and the one mapping to gRPC statuses.

use platform::{status, validate::FieldViolation};
use sea_orm::DbErr;
use tonic::{Code, Status};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("user {0} not found")]
    NotFound(Uuid),
    #[error(
        "idempotency_key is not in the inbox (never executed, or purged); replay-only requests never create"
    )]
    NotInInbox,
    #[error("idempotency_key was already used with a different request")]
    KeyReused,
    #[error(
        "idempotency_key was issued at {}, longer ago than this service keeps its inbox ({}): it cannot tell whether the key was executed, so it executed nothing",
        .0.issued_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        humantime::format_duration(.0.retention)
    )]
    DeliveryExpired(crate::inbox::KeyAge),
    #[error("no user exists for student {0}")]
    NoUserForStudent(Uuid),
    #[error("user {user_id} is not a user of student {student_id}")]
    UserOfAnotherStudent { user_id: Uuid, student_id: Uuid },
    #[error("database error")]
    Db(#[from] DbErr),
}

/// The `ErrorInfo` domain of this service's reasons (part of the contract).
pub const DOMAIN: &str = proto::users::v1::ERROR_DOMAIN;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        match err {
            Error::InvalidArgument(violation) => status::invalid_argument(&violation),
            Error::NotFound(_) => {
                status::with_reason(Code::NotFound, message, "USER_NOT_FOUND", DOMAIN)
            }
            Error::NoUserForStudent(_) => {
                status::with_reason(Code::NotFound, message, "USER_NOT_FOUND", DOMAIN)
            }
            Error::UserOfAnotherStudent { .. } => status::with_reason(
                Code::FailedPrecondition,
                message,
                "USER_OF_ANOTHER_STUDENT",
                DOMAIN,
            ),
            Error::NotInInbox => {
                status::with_reason(Code::NotFound, message, "NOT_IN_INBOX", DOMAIN)
            }
            Error::DeliveryExpired(_) => status::with_reason(
                Code::FailedPrecondition,
                message,
                "DELIVERY_EXPIRED",
                DOMAIN,
            ),
            Error::KeyReused => status::with_reason(
                Code::FailedPrecondition,
                message,
                "IDEMPOTENCY_KEY_REUSED",
                DOMAIN,
            ),
            // Retryable ones (a PostgreSQL conflict, SQLite busy) say so; the cause of any
            // other goes to the log, never to the caller: it may hold SQL or data.
            Error::Db(cause) => status::database_error(&cause, DOMAIN),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_the_code_a_client_acts_on() {
        let cases = [
            (
                Error::InvalidArgument(FieldViolation::new(
                    "student_id",
                    "must be a hyphenated UUID",
                )),
                Code::InvalidArgument,
            ),
            (Error::NotFound(Uuid::nil()), Code::NotFound),
            (Error::NotInInbox, Code::NotFound),
            (
                Error::UserOfAnotherStudent {
                    user_id: Uuid::nil(),
                    student_id: Uuid::max(),
                },
                Code::FailedPrecondition,
            ),
            (Error::KeyReused, Code::FailedPrecondition),
            (
                Error::Db(DbErr::Custom("relation \"users\" does not exist".into())),
                Code::Internal,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(Status::from(err).code(), code);
        }
    }

    #[test]
    fn messages_name_the_field_and_never_leak_internals() {
        let status = Status::from(Error::InvalidArgument(FieldViolation::new(
            "email",
            "must not be empty",
        )));
        assert_eq!(status.message(), "invalid email: must not be empty");
        let status = Status::from(Error::Db(DbErr::Custom(
            "duplicate key value violates unique constraint".into(),
        )));
        assert_eq!(status.message(), "internal error");
    }
}
