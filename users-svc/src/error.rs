//! Everything a Users use case can fail with, and the one mapping to gRPC statuses.

use platform::{
    db::{is_sqlite_busy, is_transaction_conflict},
    status,
    validate::FieldViolation,
};
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
    #[error("database error")]
    Db(#[from] DbErr),
}

/// The `ErrorInfo` domain of this service's reasons.
pub const DOMAIN: &str = "users.v1";

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
            // PostgreSQL aborted it in a conflict with a concurrent request (a deadlock):
            // nothing of it stays, and the same request, with the same key, may pass.
            Error::Db(cause) if is_transaction_conflict(&cause) => {
                tracing::warn!(error = %cause, "transaction conflict, answered ABORTED");
                status::with_reason(
                    Code::Aborted,
                    "the database aborted this request in a conflict with a concurrent one; \
                     send it again",
                    "TRANSACTION_CONFLICT",
                    DOMAIN,
                )
            }
            // SQLite's write lock stayed taken past the busy timeout: nothing was written,
            // and the same request may pass later.
            Error::Db(cause) if is_sqlite_busy(&cause) => {
                tracing::warn!(error = %cause, "database busy, answered UNAVAILABLE");
                status::with_reason(
                    Code::Unavailable,
                    "the database was locked by other writers for longer than its busy \
                     timeout; send the request again later",
                    "DATABASE_BUSY",
                    DOMAIN,
                )
            }
            // The cause goes to the log, never to the caller: it may hold SQL or data.
            Error::Db(cause) => status::internal_error(&cause),
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
