//! Users' own metrics (served by `platform::metrics` when `--metrics-addr` is given): what
//! the inbox did with each keyed request, and why requests were refused.

use crate::{
    entity::inbox::SavedOutcome,
    error::Error,
    inbox::{Answer, KeyAge},
};

pub const INBOX_REQUESTS: &str = "inbox_requests_total";
pub const REJECTED: &str = "users_rejected_total";
pub const ANSWERED_FROM_MEMORY: &str = "inbox_answers_from_memory_total";

/// Gives each metric its help text; call once after the recorder is installed.
pub fn describe() {
    metrics::describe_counter!(
        INBOX_REQUESTS,
        "Keyed requests by RPC and what the inbox did: executed, replayed (saved answer \
         returned), key_reused, not_in_inbox (replay-only, a key unknown or too old to judge), \
         expired (a delivery older than the inbox retention and unknown)"
    );
    metrics::describe_counter!(
        REJECTED,
        "Requests refused, by reason: INVALID_ARGUMENT, UNAUTHENTICATED, IDEMPOTENCY_KEY_REUSED, \
         DELIVERY_EXPIRED (deliveries, not replay-only questions), or the reason of a \
         rejection saved in the inbox (counted when executed)"
    );
    metrics::describe_counter!(
        ANSWERED_FROM_MEMORY,
        "Repeated keys answered from the server's memory of recent inbox answers, without \
         reading the inbox table (--inbox-cache-entries)"
    );
}

/// Counts one keyed request by what the inbox did with it, and a fresh rejection by reason.
pub fn inbox_request(rpc: &'static str, answer: &Result<Answer, Error>) {
    let result = match answer {
        Ok(Answer { replayed: true, .. }) => "replayed",
        Ok(Answer { outcome, .. }) => {
            if let SavedOutcome::Rejected { reason, .. } = outcome {
                rejected(reason.clone());
            }
            "executed"
        }
        Err(Error::KeyReused) => {
            rejected("IDEMPOTENCY_KEY_REUSED");
            "key_reused"
        }
        // A question, not a delivery: nothing was refused that was meant to run.
        Err(
            Error::NotInInbox
            | Error::DeliveryExpired(KeyAge {
                asked_only: true, ..
            }),
        ) => "not_in_inbox",
        Err(Error::DeliveryExpired(_)) => {
            rejected("DELIVERY_EXPIRED");
            "expired"
        }
        // The inbox decided nothing: the database failed, or the change has no user to go
        // to (gRPC metrics count the status).
        Err(_) => return,
    };
    metrics::counter!(INBOX_REQUESTS, "rpc" => rpc, "result" => result).increment(1);
}

/// Counts a repeated key answered from memory (`answer_cache.rs`).
pub fn answered_from_memory() {
    metrics::counter!(ANSWERED_FROM_MEMORY).increment(1);
}

/// Counts a refused request.
pub fn rejected(reason: impl Into<metrics::SharedString>) {
    metrics::counter!(REJECTED, "reason" => reason).increment(1);
}

/// Counts a request refused for an invalid field, passing the error on.
pub fn invalid<E>(err: E) -> E {
    rejected("INVALID_ARGUMENT");
    err
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metrics_exporter_prometheus::PrometheusBuilder;
    use uuid::Uuid;

    use super::*;
    use crate::inbox::KeyAge;

    /// Each thing the inbox can do with a keyed request lands under the `result` the
    /// README's metrics table and the alert rules name, and each refusal under its reason.
    #[test]
    fn each_inbox_answer_is_counted_under_its_documented_result() {
        let created = SavedOutcome::Created {
            user_id: Uuid::nil(),
        };
        let taken = SavedOutcome::Rejected {
            code: 6,
            reason: "DOCUMENT_NUMBER_TAKEN".into(),
            message: "document_number is already used".into(),
        };
        let answers = [
            Ok(Answer {
                outcome: created.clone(),
                replayed: false,
            }),
            Ok(Answer {
                outcome: taken.clone(),
                replayed: false,
            }),
            Ok(Answer {
                outcome: created,
                replayed: true,
            }),
            // A saved rejection replayed is not refused again.
            Ok(Answer {
                outcome: taken,
                replayed: true,
            }),
            Err(Error::KeyReused),
            Err(Error::NotInInbox),
            Err(Error::DeliveryExpired(KeyAge {
                issued_at: platform::db::now(),
                retention: Duration::from_secs(60),
                asked_only: false,
            })),
            // A replay-only question about such a key: unknown, not a refused delivery.
            Err(Error::DeliveryExpired(KeyAge {
                issued_at: platform::db::now(),
                retention: Duration::from_secs(60),
                asked_only: true,
            })),
        ];
        let recorder = PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            for answer in &answers {
                inbox_request("CreateUser", answer);
            }
        });
        let text = recorder.handle().render();
        for (result, count) in [
            ("executed", 2),
            ("replayed", 2),
            ("key_reused", 1),
            ("not_in_inbox", 2),
            ("expired", 1),
        ] {
            let line =
                format!("inbox_requests_total{{rpc=\"CreateUser\",result=\"{result}\"}} {count}\n");
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
        for reason in [
            "DOCUMENT_NUMBER_TAKEN",
            "IDEMPOTENCY_KEY_REUSED",
            "DELIVERY_EXPIRED",
        ] {
            let line = format!("users_rejected_total{{reason=\"{reason}\"}} 1\n");
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
    }

    /// A request the database failed is counted under no result: the inbox decided nothing.
    #[test]
    fn a_database_failure_is_not_counted_as_an_inbox_result() {
        let recorder = PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            inbox_request(
                "CreateUser",
                &Err(Error::Db(sea_orm::DbErr::Custom("connection lost".into()))),
            );
        });
        let text = recorder.handle().render();
        assert!(
            !text.contains(INBOX_REQUESTS),
            "nothing counted in:\n{text}"
        );

        let recorder = PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            inbox_request(
                "CreateUser",
                &Err(Error::Db(sea_orm::DbErr::Custom("connection lost".into()))),
            );
            inbox_request(
                "CreateUser",
                &Ok(Answer {
                    outcome: SavedOutcome::Created {
                        user_id: Uuid::nil(),
                    },
                    replayed: false,
                }),
            );
        });
        let text = recorder.handle().render();
        let samples: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with(INBOX_REQUESTS))
            .collect();
        assert_eq!(
            samples,
            ["inbox_requests_total{rpc=\"CreateUser\",result=\"executed\"} 1"],
            "in:\n{text}"
        );
    }
}
