//! CreateUsers: CreateUser for many keys in one call.
//!
//! Each item gets the answer CreateUser would give it alone; what changes is the cost. The
//! items no process has seen yet, the usual case, are executed together: every user and
//! every inbox row in ONE transaction, so a batch costs one commit instead of one per item.
//! If that transaction hits a unique violation (a key that ran before, or a document
//! number already taken), it wrote nothing, and each of those items is executed again on
//! its own, through CreateUser's own path, which tells the two apart.

use platform::{db::now, redact, trace::TraceContext};
use sea_orm::DatabaseConnection;
use tracing::Instrument as _;

use crate::{
    answer_cache::AnswerCache,
    create_user::{self, first_execution_rows, insert_users_with_inbox},
    entity::inbox::SavedOutcome,
    error::Error,
    inbox::{self, Answer, Mode},
    new_user::NewUser,
};

/// Most items one call may hold.
pub const MAX_ITEMS: usize = 100;

/// One item of a CreateUsers call, as the API decoded it.
#[derive(Debug)]
pub struct Item {
    /// The item's request, or why it is not valid.
    pub new: Result<NewUser, Error>,
    /// How the item may be answered (its key's age, the call's replay-only marker).
    pub mode: Mode,
    /// The item's own trace: its log lines carry this trace id.
    pub trace: TraceContext,
}

/// Answers every item, in order. Fails as a whole only when the database fails the
/// items' shared transaction; then nothing of it was written.
pub async fn create_users(
    db: &DatabaseConnection,
    answers: &AnswerCache,
    items: Vec<Item>,
) -> Result<Vec<Result<Answer, Error>>, Error> {
    let mut results: Vec<Option<Result<Answer, Error>>> = Vec::with_capacity(items.len());
    // Items to execute together: their index in `results`, their request and trace.
    let mut fresh = Vec::new();
    for item in items {
        let index = results.len();
        let Item { new, mode, trace } = item;
        let new = match new {
            Ok(new) => new,
            Err(err) => {
                results.push(Some(Err(err)));
                continue;
            }
        };
        let span = item_span(&trace);
        let request_hash = new.request_hash();
        let known = match mode {
            // A key this process remembers is answered from memory, as CreateUser does.
            Mode::Execute => {
                let request = inbox::Request {
                    key: &new.idempotency_key,
                    request_hash: &request_hash,
                };
                inbox::recall(answers, request).transpose()
            }
            // A key that must not execute takes CreateUser's own path: it reads the inbox.
            Mode::Expired(_) | Mode::ReplayOnly => Some(
                create_user::create_user(db, answers, new.clone(), mode)
                    .instrument(span.clone())
                    .await,
            ),
        };
        match known {
            Some(answer) => {
                if matches!(mode, Mode::Execute) && answer.is_ok() {
                    span.in_scope(|| tracing::info!(idempotency_key = %new.idempotency_key, "answered from the inbox"));
                }
                results.push(Some(answer));
            }
            None => {
                results.push(None);
                fresh.push(Fresh {
                    index,
                    request_hash,
                    new,
                    span,
                });
            }
        }
    }
    for (index, answer) in execute_fresh(db, answers, fresh).await? {
        results[index] = Some(answer);
    }
    // Every index was filled above: a decided item on the spot, a fresh one just now.
    Ok(results
        .into_iter()
        .map(|answer| {
            answer.unwrap_or(Err(Error::Db(sea_orm::DbErr::Custom(
                "an item of CreateUsers was left unanswered".into(),
            ))))
        })
        .collect())
}

/// An item nobody has answered yet: where its answer goes, its request and fingerprint,
/// and the span of its log lines.
struct Fresh {
    index: usize,
    new: NewUser,
    request_hash: String,
    span: tracing::Span,
}

impl Fresh {
    fn request(&self) -> inbox::Request<'_> {
        inbox::Request {
            key: &self.new.idempotency_key,
            request_hash: &self.request_hash,
        }
    }
}

/// Executes the items nobody has answered yet: together in one transaction, or, when it
/// meets a unique violation, each on its own (see the module's comment).
async fn execute_fresh(
    db: &DatabaseConnection,
    answers: &AnswerCache,
    fresh: Vec<Fresh>,
) -> Result<Vec<(usize, Result<Answer, Error>)>, Error> {
    if fresh.len() > 1 {
        let saved_at = now();
        let (created, rows) = first_execution_rows(
            fresh.iter().map(|item| (&item.new, item.request())),
            saved_at,
        )?;
        match insert_users_with_inbox(db, rows).await {
            Ok(()) => {
                let mut results = Vec::with_capacity(fresh.len());
                for (item, user_id) in fresh.iter().zip(created) {
                    let outcome = SavedOutcome::Created { user_id };
                    answers.remember(item.request(), &outcome, saved_at);
                    let new = &item.new;
                    item.span.in_scope(|| {
                        tracing::info!(
                            %user_id,
                            idempotency_key = %new.idempotency_key,
                            student_id = %new.student_id,
                            email = %redact::email(&new.email),
                            document_number = %redact::document_number(&new.document_number),
                            batch = fresh.len(),
                            "user created"
                        );
                    });
                    results.push((
                        item.index,
                        Ok(Answer {
                            outcome,
                            replayed: false,
                        }),
                    ));
                }
                return Ok(results);
            }
            // Nothing was written: each item goes its own way below.
            Err(err) if platform::db::is_unique_violation(&err) => {}
            Err(err) => return Err(err.into()),
        }
    }
    let mut results = Vec::with_capacity(fresh.len());
    for Fresh {
        index, new, span, ..
    } in fresh
    {
        let answer = create_user::create_user(db, answers, new, Mode::Execute)
            .instrument(span)
            .await;
        results.push((index, answer));
    }
    Ok(results)
}

/// The span every log line about one item runs in: its own trace id, as a CreateUser
/// call's lines carry the call's.
fn item_span(trace: &TraceContext) -> tracing::Span {
    tracing::info_span!("item", trace_id = %trace.trace_id())
}
