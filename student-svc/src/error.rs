//! Everything a Student use case can fail with, and the one mapping to gRPC statuses.

use platform::{status, validate::FieldViolation};
use sea_orm::DbErr;
use tonic::{Code, Status};
#[cfg(test)]
use tonic_types::StatusExt as _;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("student {0} not found")]
    NotFound(Uuid),
    #[error("idempotency_key was already used with a different request")]
    KeyReused,
    #[error("a student with this document_number already exists")]
    DocumentNumberTaken,
    #[error("the student is at version {current}, not the expected {expected}")]
    VersionMismatch { expected: i64, current: i64 },
    #[error("the student is inactive and accepts no change")]
    Inactive,
    /// Users refused or failed the call of `--link-mode direct`.
    #[error("users-svc: {}", .0.message())]
    Users(Status),
    #[error("database error")]
    Db(#[from] DbErr),
}

/// The `ErrorInfo` domain of this service's reasons (part of the contract).
pub const DOMAIN: &str = proto::student::v1::ERROR_DOMAIN;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        match err {
            Error::InvalidArgument(violation) => status::invalid_argument(&violation),
            Error::NotFound(_) => {
                status::with_reason(Code::NotFound, message, "STUDENT_NOT_FOUND", DOMAIN)
            }
            Error::KeyReused => status::with_reason(
                Code::FailedPrecondition,
                message,
                "IDEMPOTENCY_KEY_REUSED",
                DOMAIN,
            ),
            Error::DocumentNumberTaken => status::with_reason(
                Code::AlreadyExists,
                message,
                "DOCUMENT_NUMBER_TAKEN",
                DOMAIN,
            ),
            // AIP-154: a stale `expected_version` is ABORTED, to be retried after a re-read.
            Error::VersionMismatch { .. } => {
                status::with_reason(Code::Aborted, message, "VERSION_MISMATCH", DOMAIN)
            }
            Error::Inactive => status::with_reason(
                Code::FailedPrecondition,
                message,
                "STUDENT_INACTIVE",
                DOMAIN,
            ),
            // Users' own answer, passed on: its code is what the client acts on.
            Error::Users(users) => Status::new(users.code(), message),
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
                Error::InvalidArgument(FieldViolation::new("email", "must not be empty")),
                Code::InvalidArgument,
                "invalid email: must not be empty",
            ),
            (
                Error::NotFound(Uuid::nil()),
                Code::NotFound,
                "student 00000000-0000-0000-0000-000000000000 not found",
            ),
            (
                Error::KeyReused,
                Code::FailedPrecondition,
                "idempotency_key was already used with a different request",
            ),
            (
                Error::DocumentNumberTaken,
                Code::AlreadyExists,
                "a student with this document_number already exists",
            ),
            (
                Error::VersionMismatch {
                    expected: 2,
                    current: 3,
                },
                Code::Aborted,
                "the student is at version 3, not the expected 2",
            ),
            (
                Error::Inactive,
                Code::FailedPrecondition,
                "the student is inactive and accepts no change",
            ),
        ];
        let reasons = [
            None,
            Some("STUDENT_NOT_FOUND"),
            Some("IDEMPOTENCY_KEY_REUSED"),
            Some("DOCUMENT_NUMBER_TAKEN"),
            Some("VERSION_MISMATCH"),
            Some("STUDENT_INACTIVE"),
        ];
        for ((err, code, message), reason) in cases.into_iter().zip(reasons) {
            let status = Status::from(err);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), message);
            let info = status.get_details_error_info();
            assert_eq!(info.as_ref().map(|i| i.reason.as_str()), reason);
            if let Some(info) = info {
                assert_eq!(info.domain, "students.v1");
            }
        }
    }

    #[test]
    fn database_errors_never_reach_the_caller() {
        let status = Status::from(Error::Db(DbErr::Custom(
            "UNIQUE constraint failed: students.email = 'ana@example.edu'".into(),
        )));
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "internal error");
    }
}
