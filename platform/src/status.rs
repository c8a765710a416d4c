//! gRPC statuses a program can act on: the code, a readable message, and details in the
//! standard `google.rpc` shapes: `BadRequest` field violations for INVALID_ARGUMENT,
//! `ErrorInfo` with a stable reason for the rest, `RetryInfo` when retrying later helps.

use std::{collections::HashMap, time::Duration};

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::validate::FieldViolation;

/// INVALID_ARGUMENT naming the field, in the message and as a `BadRequest` violation.
pub fn invalid_argument(violation: &FieldViolation) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        violation.to_string(),
        ErrorDetails::with_bad_request_violation(violation.field, violation.reason.clone()),
    )
}

/// A status with an `ErrorInfo` whose `reason` (e.g. `DOCUMENT_NUMBER_TAKEN`) is stable
/// within `domain` (e.g. `users.v1`): what a program switches on, not the message.
pub fn with_reason(code: Code, message: impl Into<String>, reason: &str, domain: &str) -> Status {
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, domain, HashMap::new()),
    )
}

/// RESOURCE_EXHAUSTED with `RetryInfo`: the server is shedding load; try again after `delay`.
pub fn overloaded(delay: Duration) -> Status {
    let mut details = ErrorDetails::with_retry_info(Some(delay));
    details.set_error_info("OVERLOADED", "grpc.server", HashMap::new());
    Status::with_error_details(
        Code::ResourceExhausted,
        "the server is at its concurrency limit; retry later",
        details,
    )
}

/// INTERNAL with no detail: the cause is logged by the caller, never sent.
pub fn internal() -> Status {
    Status::internal("internal error")
}

/// The answer to a failed database call of a service in `domain`. Two failures leave
/// nothing written and may pass when the same request is sent again: PostgreSQL aborting
/// the transaction in a conflict with a concurrent one (ABORTED `TRANSACTION_CONFLICT`), and
/// SQLite's write lock staying taken past the busy timeout (UNAVAILABLE `DATABASE_BUSY`).
/// Anything else is a bug: INTERNAL, the cause in the log only.
pub fn database_error(cause: &sea_orm::DbErr, domain: &str) -> Status {
    let (code, message, reason) = if crate::db::is_transaction_conflict(cause) {
        (
            Code::Aborted,
            "the database aborted this request in a conflict with a concurrent one; send it again",
            "TRANSACTION_CONFLICT",
        )
    } else if crate::db::is_sqlite_busy(cause) {
        (
            Code::Unavailable,
            "the database was locked by other writers for longer than its busy timeout; send \
             the request again later",
            "DATABASE_BUSY",
        )
    } else {
        return internal_error(cause);
    };
    tracing::warn!(error = %cause, reason, "database error a retry may pass");
    with_reason(code, message, reason, domain)
}

/// Logs `cause` with its whole chain of sources, then returns a bare INTERNAL: the caller
/// learns that it is a bug, never the SQL or data the cause may quote.
pub fn internal_error(cause: &(dyn std::error::Error + 'static)) -> Status {
    tracing::error!(error = %chain(cause), "internal error");
    internal()
}

/// `cause: its source: its source's source …`.
fn chain(cause: &(dyn std::error::Error + 'static)) -> String {
    let mut text = cause.to_string();
    let mut source = cause.source();
    while let Some(next) = source {
        text.push_str(": ");
        text.push_str(&next.to_string());
        source = next.source();
    }
    text
}

/// The `ErrorInfo` reason of `status`, if it carries one.
pub fn reason(status: &Status) -> Option<String> {
    status.get_details_error_info().map(|info| info.reason)
}

/// The field an INVALID_ARGUMENT `status` names (its `BadRequest`'s first violation), if any.
pub fn invalid_field(status: &Status) -> Option<String> {
    let bad_request = status.get_details_bad_request()?;
    bad_request
        .field_violations
        .into_iter()
        .next()
        .map(|violation| violation.field)
}

/// How long a status's `RetryInfo` asks the caller to wait, if it has one.
pub fn retry_after(status: &Status) -> Option<Duration> {
    status.get_details_retry_info()?.retry_delay
}

/// The canonical upper-case name of a gRPC code, as in `ALREADY_EXISTS`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    /// Every code by its number, as gRPC's status-codes document names it (the alerts
    /// match these names, so a misspelt one would go unseen by `ServiceErrors`).
    fn code_names_are_the_canonical_ones() {
        let canonical = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        for (number, name) in canonical.into_iter().enumerate() {
            assert_eq!(
                code_name(Code::from_i32(number as i32)),
                name,
                "code {number}"
            );
        }
    }

    #[test]
    fn invalid_argument_carries_the_field_violation() {
        let status = invalid_argument(&FieldViolation::new("email", "must not be empty"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "invalid email: must not be empty");
        assert_eq!(invalid_field(&status).as_deref(), Some("email"));
        let bad_request = status.get_details_bad_request().expect("BadRequest");
        assert_eq!(bad_request.field_violations.len(), 1);
        assert_eq!(bad_request.field_violations[0].field, "email");
        assert_eq!(
            bad_request.field_violations[0].description,
            "must not be empty"
        );
    }

    #[test]
    fn reasons_round_trip() {
        let status = with_reason(
            Code::AlreadyExists,
            "taken",
            "DOCUMENT_NUMBER_TAKEN",
            "users.v1",
        );
        assert_eq!(reason(&status).as_deref(), Some("DOCUMENT_NUMBER_TAKEN"));
        let info = status.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.domain, "users.v1");
        assert_eq!(reason(&Status::internal("x")), None);
    }

    #[test]
    fn the_logged_chain_holds_every_source() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot save the user")]
        struct Outer(#[source] std::io::Error);
        let cause = Outer(std::io::Error::other("disk full"));
        assert_eq!(chain(&cause), "cannot save the user: disk full");
        let status = internal_error(&cause);
        assert_eq!(
            (status.code(), status.message()),
            (Code::Internal, "internal error")
        );
    }

    /// The chain goes down to the root cause, however many sources lie between.
    #[test]
    fn the_logged_chain_reaches_the_root_of_a_three_level_cause() {
        let err = anyhow::Error::new(std::io::Error::other("disk full"))
            .context("cannot write the row")
            .context("cannot save the user");
        let cause: &(dyn std::error::Error + 'static) = err.as_ref();
        assert_eq!(
            chain(cause),
            "cannot save the user: cannot write the row: disk full"
        );
    }

    #[test]
    fn overload_says_when_to_retry() {
        let status = overloaded(Duration::from_millis(250));
        assert_eq!(status.code(), Code::ResourceExhausted);
        let retry = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(retry.retry_delay, Some(Duration::from_millis(250)));
    }
}
