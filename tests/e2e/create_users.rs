//! CreateUsers: many keys in one call, each item answered exactly as CreateUser would
//! answer it alone, the new ones written in one transaction.

use std::collections::HashSet;

use proto::users::v1::{
    CreateUserRequest, CreateUsersItem, CreateUsersRequest, CreateUsersResult,
    create_users_result::Outcome,
};
use sea_orm::EntityTrait;
use tonic::{Code, Request, metadata::MetadataValue};
use users_svc::entity::inbox::{self, SavedOutcome};
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{
        Backend, TestApp,
        invariants::{stored_user, users_and_inbox_rows},
        spawn_app,
    },
};

on_both_backends!(
    a_call_creates_each_item_once_and_a_repeat_replays_every_item,
    each_item_gets_the_answer_create_user_would_give_it_alone,
    a_call_no_item_of_which_can_be_judged_is_refused_whole,
    a_call_of_exactly_100_items_creates_every_user,
    replay_only_calls_never_create,
    two_racing_calls_with_the_same_keys_create_each_user_once,
    a_call_mixing_known_keys_with_new_ones_answers_each_in_its_place,
);

/// A valid CreateUser request, the `n`th of a set: its own key, student, e-mail and
/// document number.
fn user(n: usize) -> CreateUserRequest {
    CreateUserRequest {
        idempotency_key: format!("key-{n}"),
        email: format!("user{n}@example.edu"),
        first_name: "Ana".to_owned(),
        last_name: "Pérez".to_owned(),
        document_number: format!("DOC-{n:04}"),
        student_id: Uuid::from_u128(n as u128 + 1).to_string(),
    }
}

fn item(user: CreateUserRequest) -> CreateUsersItem {
    CreateUsersItem {
        user: Some(user),
        ..CreateUsersItem::default()
    }
}

fn call(users: impl IntoIterator<Item = CreateUserRequest>) -> CreateUsersRequest {
    CreateUsersRequest {
        items: users.into_iter().map(item).collect(),
    }
}

async fn send(app: &TestApp, request: CreateUsersRequest) -> Vec<CreateUsersResult> {
    app.users
        .clone()
        .create_users(request)
        .await
        .expect("answered")
        .into_inner()
        .results
}

/// The user id of a result that has one, and whether it was replayed.
fn created(result: &CreateUsersResult) -> (Uuid, bool) {
    match &result.outcome {
        Some(Outcome::UserId(id)) => (Uuid::parse_str(id).expect("uuid"), result.replayed),
        other => panic!("expected a user id, got {other:?}"),
    }
}

/// The code, reason and message of a result that is an error, and whether it was replayed.
fn refused(result: &CreateUsersResult) -> (Code, String, String, bool) {
    match &result.outcome {
        Some(Outcome::Error(error)) => (
            Code::from_i32(error.code),
            error.reason.clone(),
            error.message.clone(),
            result.replayed,
        ),
        other => panic!("expected an error, got {other:?}"),
    }
}

async fn a_call_creates_each_item_once_and_a_repeat_replays_every_item(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let first = send(&app, call((0..3).map(user))).await;
    let ids: Vec<Uuid> = first
        .iter()
        .map(|result| {
            let (id, replayed) = created(result);
            assert!(!replayed, "a first execution is not a replay");
            id
        })
        .collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 3, "{ids:?}");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (3, 3));
    // Each user is its item's, and its key saved that user.
    for (n, id) in ids.iter().enumerate() {
        let stored = stored_user(&app.users_db, *id).await;
        let sent = user(n);
        assert_eq!(
            (
                stored.email,
                stored.document_number,
                stored.student_id.to_string()
            ),
            (sent.email, sent.document_number, sent.student_id)
        );
        let entry = inbox::Entity::find_by_id(sent.idempotency_key)
            .one(&app.users_db)
            .await
            .expect("query")
            .expect("inbox row");
        assert_eq!(
            serde_json::from_value::<SavedOutcome>(entry.result).expect("outcome"),
            SavedOutcome::Created { user_id: *id }
        );
    }
    // The same call again, from a replica that remembers none of it (it reads the table)
    // and from this one (memory): every item's saved user, replayed, nothing new.
    let mut replica = app.users_replica().await;
    let from_table = replica
        .create_users(call((0..3).map(user)))
        .await
        .expect("answered")
        .into_inner()
        .results;
    let from_memory = send(&app, call((0..3).map(user))).await;
    for again in [from_table, from_memory] {
        let replayed: Vec<(Uuid, bool)> = again.iter().map(created).collect();
        assert_eq!(
            replayed,
            ids.iter().map(|id| (*id, true)).collect::<Vec<_>>()
        );
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (3, 3));
}

/// One call holding new items, an invalid one, one whose document number another key took
/// and an expired key; then one with a key reused for another request and a known key.
/// Each item gets its own answer; the new ones are created (the taken document number makes
/// the shared transaction fail, so they are created one by one), nothing else is.
async fn each_item_gets_the_answer_create_user_would_give_it_alone(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users_client = app.users.clone();
    // Known before the call: key-1 (user 1) and key-9 (which takes user 3's document).
    users_client.create_user(user(1)).await.expect("created");
    let mut taker = user(9);
    taker.document_number = user(3).document_number;
    let taker_id = users_client
        .create_user(taker.clone())
        .await
        .expect("created")
        .into_inner()
        .user_id;
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (2, 2));

    let mut invalid = user(2);
    invalid.email = "not an e-mail".into();
    let mut reused = user(1);
    reused.email = "someone.else@example.edu".into();
    reused.idempotency_key = "key-1".into();
    let expired = CreateUsersItem {
        user: Some(user(5)),
        key_created_at: Some(platform::timestamp::to_proto(
            chrono::Utc::now() - chrono::TimeDelta::days(365),
        )),
        traceparent: String::new(),
    };
    let request = CreateUsersRequest {
        items: vec![
            item(user(0)),
            item(invalid),
            item(user(3)),
            item(user(4)),
            expired,
            item(user(6)),
        ],
    };
    let results = send(&app, request).await;
    assert_eq!(results.len(), 6);
    let (fresh_0, replayed) = created(&results[0]);
    assert!(!replayed);
    // A refusal that is no saved answer says so: `replayed` only for answers from the inbox.
    let (code, _, message, replayed) = refused(&results[1]);
    assert_eq!(
        (code, message.as_str(), replayed),
        (
            Code::InvalidArgument,
            "invalid email: must be an e-mail address like name@example.org",
            false
        )
    );
    let (code, reason, _, replayed) = refused(&results[2]);
    assert_eq!(
        (code, reason.as_str(), replayed),
        (Code::AlreadyExists, "DOCUMENT_NUMBER_TAKEN", false)
    );
    let (fresh_4, _) = created(&results[3]);
    let (code, reason, _, replayed) = refused(&results[4]);
    assert_eq!(
        (code, reason.as_str(), replayed),
        (Code::FailedPrecondition, "DELIVERY_EXPIRED", false)
    );
    let (fresh_6, _) = created(&results[5]);
    assert_eq!(
        [fresh_0, fresh_4, fresh_6]
            .iter()
            .collect::<HashSet<_>>()
            .len(),
        3
    );
    // Created: users 0, 4 and 6; saved: their answers and user 3's rejection.
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (5, 6));

    // A key reused with another request: refused; a known key in the same call: answered
    // from the inbox.
    let results = send(&app, call([reused, taker])).await;
    let (code, reason, _, replayed) = refused(&results[0]);
    assert_eq!(
        (code, reason.as_str(), replayed),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED", false)
    );
    assert_eq!(
        created(&results[1]),
        (Uuid::parse_str(&taker_id).expect("uuid"), true)
    );
    // The rejection replays as a rejection.
    let results = send(&app, call([user(3)])).await;
    let (code, reason, _, replayed) = refused(&results[0]);
    assert_eq!(
        (code, reason.as_str(), replayed),
        (Code::AlreadyExists, "DOCUMENT_NUMBER_TAKEN", true)
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (5, 6));

    // One document under two keys in one call: two requests, judged in order, like two
    // CreateUser calls; not a call that cannot be judged.
    let mut second = user(8);
    second.document_number = user(7).document_number;
    let results = send(&app, call([user(7), second])).await;
    created(&results[0]);
    let (code, reason, _, replayed) = refused(&results[1]);
    assert_eq!(
        (code, reason.as_str(), replayed),
        (Code::AlreadyExists, "DOCUMENT_NUMBER_TAKEN", false)
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (6, 8));
}

async fn a_call_no_item_of_which_can_be_judged_is_refused_whole(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // Key 0 twice, for two different users: which would the key's answer be?
    let mut twice = call((0..3).map(user));
    twice.items[2] = item(CreateUserRequest {
        idempotency_key: user(0).idempotency_key,
        ..user(2)
    });
    let cases = [
        (call([]), "invalid items: must hold 1 to 100 items"),
        (
            call((0..101).map(user)),
            "invalid items: must hold 1 to 100 items",
        ),
        (
            twice,
            "invalid items: items 0 and 2 have the same idempotency_key",
        ),
    ];
    for (request, message) in cases {
        let status = app
            .users
            .clone()
            .create_users(request)
            .await
            .expect_err("refused");
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, message)
        );
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
}

/// The limit on items is inclusive: a call of exactly 100 creates every user.
async fn a_call_of_exactly_100_items_creates_every_user(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let results = send(&app, call((0..100).map(user))).await;
    assert_eq!(results.len(), 100);
    for result in &results {
        assert!(!created(result).1, "created now, not replayed");
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (100, 100));
}

async fn replay_only_calls_never_create(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let known = send(&app, call([user(0)])).await;
    let (known, _) = created(&known[0]);
    let mut request = Request::new(call([user(0), user(1)]));
    request.metadata_mut().insert(
        "idempotency-replay-only",
        MetadataValue::from_static("true"),
    );
    let results = app
        .users
        .clone()
        .create_users(request)
        .await
        .expect("answered")
        .into_inner()
        .results;
    assert_eq!(created(&results[0]), (known, true));
    let (code, reason, _, replayed) = refused(&results[1]);
    assert_eq!(
        (code, reason.as_str(), replayed),
        (Code::NotFound, "NOT_IN_INBOX", false)
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
}

/// Two relays holding the same rows send the same keys at once: whichever transaction
/// commits first creates the users; the other is refused by the inbox's keys and answers
/// each item from the inbox. Both calls get the same user for each key.
async fn two_racing_calls_with_the_same_keys_create_each_user_once(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for round in 0..5 {
        let keys = (round * 10)..(round * 10 + 10);
        let mut replica = app.users_replica().await;
        let (here, there) = tokio::join!(send(&app, call(keys.clone().map(user))), async {
            replica
                .create_users(call(keys.clone().map(user)))
                .await
                .expect("answered")
                .into_inner()
                .results
        });
        let here: Vec<Uuid> = here.iter().map(|result| created(result).0).collect();
        let there: Vec<Uuid> = there.iter().map(|result| created(result).0).collect();
        assert_eq!(here, there, "round {round}");
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (50, 50));
}

/// The call a relay sends after it died between Users' commit and its own finalize: some
/// keys Users has executed, some new. The new ones are written together, and every answer
/// lands in its own item's place (the relay links each row to the user in its row's
/// place): the known key its saved user, replayed; each new key a user made of its own
/// item. Known keys first, then in the middle.
async fn a_call_mixing_known_keys_with_new_ones_answers_each_in_its_place(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let known = app
        .users
        .clone()
        .create_user(user(0))
        .await
        .expect("created alone")
        .into_inner()
        .user_id;
    let known = Uuid::parse_str(&known).expect("uuid");
    let mut ids = vec![known];
    for (n, places) in [(1, [0, 1, 2]), (2, [3, 1, 4])] {
        let results = send(&app, call(places.map(user))).await;
        assert_eq!(results.len(), 3, "call {n}");
        for (place, n_user) in places.into_iter().enumerate() {
            let (id, replayed) = created(&results[place]);
            let is_known = n_user < ids.len();
            assert_eq!(replayed, is_known, "call {n}, item {place}");
            if is_known {
                assert_eq!(id, ids[n_user], "call {n}, item {place}: its saved user");
            } else {
                let stored = stored_user(&app.users_db, id).await;
                let sent = user(n_user);
                assert_eq!(
                    (stored.email, stored.student_id.to_string()),
                    (sent.email, sent.student_id),
                    "call {n}, item {place}: a user made of its own item"
                );
            }
        }
        // The new users of this call, in the order their items came.
        for (place, n_user) in places.into_iter().enumerate() {
            if n_user >= ids.len() {
                ids.push(created(&results[place]).0);
            }
        }
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (5, 5));
}
