//! The gRPC face of the Users service: decode and validate, call a use case, encode.

use std::time::Duration;

use chrono::{DateTime, Utc};
use platform::{otlp::ExportedSpan, trace::TraceContext, validate};
use proto::users::v1::{
    CreateUserRequest, CreateUserResponse, CreateUsersItem, CreateUsersRequest,
    CreateUsersResponse, CreateUsersResult, DisableUserRequest, DisableUserResponse,
    GetUserRequest, ItemError, KEY_CREATED_AT_HEADER, ListUsersRequest, ListUsersResponse,
    REPLAY_ONLY_HEADER, REPLAYED_HEADER, UpdateUserRequest, UpdateUserResponse, User,
    create_users_result::Outcome, users_service_server::UsersService,
};
use sea_orm::{DatabaseConnection, EntityTrait};
use tonic::{Code, Request, Response, Status, metadata::MetadataValue};
use uuid::Uuid;

use crate::{
    answer_cache::AnswerCache,
    change_user::{self, UserChange},
    create_user,
    create_users::{self, Item},
    entity::{inbox::SavedOutcome, users},
    error::Error,
    inbox::{Answer, KeyAge, Mode},
    listing, metrics,
    new_user::NewUser,
};

/// Implements `users.v1.UsersService` over the Users DB.
pub struct UsersApi {
    db: DatabaseConnection,
    /// How long the inbox keeps a key: older keys it does not have are refused.
    inbox_retention: Duration,
    /// Recent inbox answers, so a repeat needs no database read.
    answers: AnswerCache,
}

impl UsersApi {
    pub fn new(db: DatabaseConnection, inbox_retention: Duration, answers: AnswerCache) -> Self {
        Self {
            db,
            inbox_retention,
            answers,
        }
    }

    /// How a keyed request may be answered: [`Mode::Expired`] when its
    /// `idempotency-key-created-at` lies further back than the inbox keeps keys;
    /// [`Mode::ReplayOnly`] when it carries `idempotency-replay-only: true`; else
    /// [`Mode::Execute`]. A malformed time is refused, naming the metadata entry.
    fn mode<T>(&self, request: &Request<T>) -> Result<Mode, Status> {
        let metadata = request.metadata();
        let issued_at = match metadata.get(KEY_CREATED_AT_HEADER) {
            None => None,
            Some(issued) => Some(
                issued
                    .to_str()
                    .ok()
                    .and_then(|value| DateTime::parse_from_rfc3339(value).ok())
                    .map(|time| time.with_timezone(&Utc))
                    .ok_or_else(|| {
                        metrics::rejected("INVALID_ARGUMENT");
                        Status::from(Error::from(validate::FieldViolation::new(
                            KEY_CREATED_AT_HEADER,
                            "must be an RFC 3339 time, such as 2026-12-01T10:00:00Z",
                        )))
                    })?,
            ),
        };
        Ok(self.mode_of(replay_only(request), issued_at))
    }

    /// The [`Mode`] of a key issued at `issued_at` (unknown: `None`).
    ///
    /// The key's age is judged first, replay-only or not: a replay-only question about a
    /// key past the horizon that the inbox does not hold must not be answered `NOT_IN_INBOX`
    /// ("never executed", on which `relay retry-failed --new-key` gives the row a new key),
    /// since the entry may have been purged. [`Mode::Expired`] executes nothing either.
    fn mode_of(&self, replay_only: bool, issued_at: Option<DateTime<Utc>>) -> Mode {
        let horizon = platform::db::now() - self.inbox_retention;
        match issued_at {
            Some(issued_at) if issued_at < horizon => Mode::Expired(KeyAge {
                issued_at,
                retention: self.inbox_retention,
                asked_only: replay_only,
            }),
            _ if replay_only => Mode::ReplayOnly,
            _ => Mode::Execute,
        }
    }

    /// UpdateUser and DisableUser (`rpc`): one change of a user, as a keyed request, its
    /// answer `reply(user_id, applied)`; the call is the trace's span `rpc`.
    async fn change<T, R>(
        &self,
        request: Request<T>,
        rpc: &'static str,
        reply: impl FnOnce(Uuid, bool) -> R,
    ) -> Result<Response<R>, Status>
    where
        UserChange: TryFrom<T, Error = Error>,
    {
        let span = traced(&request, rpc);
        let answer = async {
            platform::failpoint::hit(platform::failpoint::points::USERS_ON_REQUEST).await;
            let mode = self.mode(&request)?;
            let change = UserChange::try_from(request.into_inner()).map_err(metrics::invalid)?;
            let answer = change_user::change_user(&self.db, &self.answers, change, mode).await;
            metrics::inbox_request(rpc, &answer);
            let answer = answer?;
            encode_answer(answer, |outcome| {
                applied(outcome).map(|(user_id, applied)| reply(user_id, applied))
            })
        }
        .await;
        span.ended(answer)
    }

    /// Decodes one CreateUsers item: its request, the [`Mode`] of its key, its trace.
    fn item(&self, item: CreateUsersItem, replay_only: bool, call: TraceContext) -> Item {
        let trace = if item.traceparent.is_empty() {
            call
        } else {
            TraceContext::continue_stored(Some(&item.traceparent))
        };
        let issued_at = match item
            .key_created_at
            .as_ref()
            .map(platform::timestamp::from_proto)
        {
            None => None,
            Some(Some(issued_at)) => Some(issued_at),
            Some(None) => {
                return Item {
                    new: Err(metrics::invalid(Error::from(
                        validate::FieldViolation::new("key_created_at", "must be a valid time"),
                    ))),
                    mode: Mode::Execute,
                    trace,
                };
            }
        };
        let new = match item.user {
            Some(user) => NewUser::try_from(user).map_err(metrics::invalid),
            None => Err(metrics::invalid(Error::from(
                validate::FieldViolation::new("user", "must be set"),
            ))),
        };
        Item {
            new,
            mode: self.mode_of(replay_only, issued_at),
            trace,
        }
    }
}

/// Whether `request` carries `idempotency-replay-only: true`.
fn replay_only<T>(request: &Request<T>) -> bool {
    request
        .metadata()
        .get(REPLAY_ONLY_HEADER)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.eq_ignore_ascii_case("true"))
}

/// Refuses a CreateUsers call no item of which can be judged: no items, too many, or a key
/// twice (which of the two would the key's answer be?).
fn check_items(items: &[CreateUsersItem]) -> Result<(), Error> {
    if items.is_empty() || items.len() > create_users::MAX_ITEMS {
        return Err(Error::from(validate::FieldViolation::new(
            "items",
            format!("must hold 1 to {} items", create_users::MAX_ITEMS),
        )));
    }
    let mut seen = std::collections::HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let Some(user) = &item.user else { continue };
        if let Some(first) = seen.insert(user.idempotency_key.as_str(), index) {
            return Err(Error::from(validate::FieldViolation::new(
                "items",
                format!("items {first} and {index} have the same idempotency_key"),
            )));
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl UsersService for UsersApi {
    #[tracing::instrument(name = "CreateUser", skip_all, fields(trace_id))]
    async fn create_user(
        &self,
        request: Request<CreateUserRequest>,
    ) -> Result<Response<CreateUserResponse>, Status> {
        let span = traced(&request, "CreateUser");
        span.ended(
            async {
                platform::failpoint::hit(platform::failpoint::points::USERS_ON_REQUEST).await;
                let mode = self.mode(&request)?;
                let new = NewUser::try_from(request.into_inner()).map_err(metrics::invalid)?;
                let answer = create_user::create_user(&self.db, &self.answers, new, mode).await;
                metrics::inbox_request("CreateUser", &answer);
                let answer = answer?;
                encode_answer(answer, |outcome| match outcome {
                    SavedOutcome::Created { user_id } => Some(CreateUserResponse {
                        user_id: user_id.to_string(),
                    }),
                    _ => None,
                })
            }
            .await,
        )
    }

    #[tracing::instrument(name = "CreateUsers", skip_all, fields(trace_id, items))]
    async fn create_users(
        &self,
        request: Request<CreateUsersRequest>,
    ) -> Result<Response<CreateUsersResponse>, Status> {
        let call = TraceContext::continue_in_current_span(request.metadata());
        let mut span = ExportedSpan::server(call, SERVICE, "CreateUsers");
        let result = async {
            platform::failpoint::hit(platform::failpoint::points::USERS_ON_REQUEST).await;
            let replay_only = replay_only(&request);
            let items = request.into_inner().items;
            tracing::Span::current().record("items", items.len());
            check_items(&items).map_err(metrics::invalid)?;
            let items: Vec<Item> = items
                .into_iter()
                .map(|item| self.item(item, replay_only, call))
                .collect();
            // Each item that carries its own trace (its outbox row's) is a CreateUser
            // span of that trace, so each student's journey shows its execution; the
            // call's span links to each.
            let item_spans: Vec<_> = items
                .iter()
                .map(|item| {
                    (item.trace != call).then(|| {
                        span.link(item.trace);
                        ExportedSpan::server(item.trace, SERVICE, "CreateUser")
                    })
                })
                .collect();
            let answers = match create_users::create_users(&self.db, &self.answers, items).await {
                Ok(answers) => answers,
                Err(err) => {
                    // The items' shared transaction failed: each item failed with it.
                    let status = Status::from(err);
                    for span in item_spans.into_iter().flatten() {
                        span.end(status.code(), status.message());
                    }
                    return Err(status);
                }
            };
            let results = answers
                .into_iter()
                .zip(item_spans)
                .map(|(answer, span)| {
                    // Counted as what each item is: a CreateUser request.
                    metrics::inbox_request("CreateUser", &answer);
                    let result = item_result(answer);
                    if let Some(span) = span {
                        end_item_span(span, &result);
                    }
                    result
                })
                .collect();
            Ok(Response::new(CreateUsersResponse { results }))
        }
        .await;
        span.ended(result)
    }

    #[tracing::instrument(name = "UpdateUser", skip_all, fields(trace_id))]
    async fn update_user(
        &self,
        request: Request<UpdateUserRequest>,
    ) -> Result<Response<UpdateUserResponse>, Status> {
        self.change(request, "UpdateUser", |user_id, applied| {
            UpdateUserResponse {
                user_id: user_id.to_string(),
                applied,
            }
        })
        .await
    }

    #[tracing::instrument(name = "DisableUser", skip_all, fields(trace_id))]
    async fn disable_user(
        &self,
        request: Request<DisableUserRequest>,
    ) -> Result<Response<DisableUserResponse>, Status> {
        self.change(request, "DisableUser", |user_id, applied| {
            DisableUserResponse {
                user_id: user_id.to_string(),
                applied,
            }
        })
        .await
    }

    #[tracing::instrument(name = "GetUser", skip_all, fields(trace_id))]
    async fn get_user(&self, request: Request<GetUserRequest>) -> Result<Response<User>, Status> {
        let span = traced(&request, "GetUser");
        span.ended(
            async {
                let id = validate::uuid("id", &request.into_inner().id)
                    .map_err(metrics::invalid)
                    .map_err(Error::from)?;
                let user = users::Entity::find_by_id(id)
                    .one(&self.db)
                    .await
                    .map_err(Error::from)?
                    .ok_or(Error::NotFound(id))?;
                Ok(Response::new(user_message(user)))
            }
            .await,
        )
    }

    #[tracing::instrument(name = "ListUsers", skip_all, fields(trace_id))]
    async fn list_users(
        &self,
        request: Request<ListUsersRequest>,
    ) -> Result<Response<ListUsersResponse>, Status> {
        let span = traced(&request, "ListUsers");
        span.ended(
            async {
                let request = request.into_inner();
                let (after, limit) = validate::page(request.page_size, &request.page_token)
                    .map_err(metrics::invalid)
                    .map_err(Error::from)?;
                if request.student_id.is_empty() {
                    let page = listing::page(&self.db, after, limit)
                        .await
                        .map_err(Error::from)?;
                    return Ok(Response::new(ListUsersResponse {
                        users: page.users.into_iter().map(user_message).collect(),
                        next_page_token: page
                            .next_after
                            .map(|id| id.to_string())
                            .unwrap_or_default(),
                    }));
                }
                let student_id = validate::uuid("student_id", &request.student_id)
                    .and_then(|id| match after {
                        None => Ok(id),
                        Some(_) => Err(validate::FieldViolation::new(
                            "page_token",
                            "must be empty with student_id: a student's users come in one response",
                        )),
                    })
                    .map_err(metrics::invalid)
                    .map_err(Error::from)?;
                let users = listing::users_of_student(&self.db, student_id)
                    .await
                    .map_err(Error::from)?;
                Ok(Response::new(ListUsersResponse {
                    users: users.into_iter().map(user_message).collect(),
                    next_page_token: String::new(),
                }))
            }
            .await,
        )
    }
}

/// A stored user as the API returns it.
fn user_message(user: users::Model) -> User {
    User {
        id: user.id.to_string(),
        email: user.email,
        first_name: user.first_name,
        last_name: user.last_name,
        document_number: user.document_number,
        student_id: user.student_id.to_string(),
        enabled: user.enabled,
        created_at: Some(platform::timestamp::to_proto(user.created_at)),
        source_version: u64::try_from(user.source_version).unwrap_or_default(),
    }
}

/// Puts the caller's trace id (its `traceparent`, or a new trace) on the handler's span, so
/// every log line of the call carries the `trace_id` of the student's journey; the call is
/// the trace's span `method` of this service (exported when a collector is named).
fn traced<T>(request: &Request<T>, method: &'static str) -> ExportedSpan {
    let trace = TraceContext::continue_in_current_span(request.metadata());
    ExportedSpan::server(trace, SERVICE, method)
}

/// The service's name in span names.
const SERVICE: &str = "users.v1.UsersService";

/// One item's answer as CreateUsers returns it: what CreateUser would have answered, the
/// header turned into `replayed` and a failure into an [`ItemError`].
fn item_result(answer: Result<Answer, Error>) -> CreateUsersResult {
    let (outcome, replayed) = match answer {
        Ok(Answer {
            outcome: SavedOutcome::Created { user_id },
            replayed,
        }) => (Outcome::UserId(user_id.to_string()), replayed),
        Ok(Answer {
            outcome:
                SavedOutcome::Rejected {
                    code,
                    reason,
                    message,
                },
            replayed,
        }) => (
            Outcome::Error(ItemError {
                code,
                reason,
                message,
            }),
            replayed,
        ),
        // A key whose saved answer belongs to another RPC: see `encode_answer`.
        Ok(Answer { replayed, .. }) => (item_error(Error::KeyReused), replayed),
        Err(err) => (item_error(err), false),
    };
    CreateUsersResult {
        outcome: Some(outcome),
        replayed,
    }
}

/// Ends an item's span as CreateUser's would end with the same answer.
fn end_item_span(span: ExportedSpan, result: &CreateUsersResult) {
    match &result.outcome {
        Some(Outcome::Error(error)) => span.end(Code::from_i32(error.code), &error.message),
        _ => span.end(Code::Ok, ""),
    }
}

/// The status CreateUser would fail with, as an item's error.
fn item_error(err: Error) -> Outcome {
    let status = Status::from(err);
    Outcome::Error(ItemError {
        code: status.code() as i32,
        reason: platform::status::reason(&status).unwrap_or_default(),
        message: status.message().to_owned(),
    })
}

fn applied(outcome: &SavedOutcome) -> Option<(Uuid, bool)> {
    match outcome {
        SavedOutcome::Applied { user_id, applied } => Some((*user_id, *applied)),
        _ => None,
    }
}

/// Turns a saved or fresh answer into the gRPC reply, marking replays with the header. A
/// saved rejection becomes its status; `reply` encodes the RPC's own kind of success.
fn encode_answer<R>(
    answer: Answer,
    reply: impl FnOnce(&SavedOutcome) -> Option<R>,
) -> Result<Response<R>, Status> {
    let Answer { outcome, replayed } = answer;
    let mut result = match (&outcome, reply(&outcome)) {
        (_, Some(message)) => Ok(Response::new(message)),
        (
            SavedOutcome::Rejected {
                code,
                reason,
                message,
            },
            None,
        ) => Err(platform::status::with_reason(
            Code::from_i32(*code),
            message.clone(),
            reason,
            crate::error::DOMAIN,
        )),
        // The key's saved answer belongs to another RPC: its fingerprint tag makes this a
        // different request, so it cannot happen; refuse rather than guess.
        (_, None) => Err(Error::KeyReused.into()),
    };
    if replayed {
        let metadata = match &mut result {
            Ok(response) => response.metadata_mut(),
            Err(status) => status.metadata_mut(),
        };
        metadata.insert(REPLAYED_HEADER, MetadataValue::from_static("true"));
    }
    result
}
