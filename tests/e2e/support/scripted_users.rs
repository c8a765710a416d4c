//! The real Users in the test's process, but for what a test scripts.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use proto::users::v1::{
    CreateUserRequest, CreateUserResponse, CreateUsersRequest, CreateUsersResponse,
    DisableUserRequest, DisableUserResponse, GetUserRequest, ListUsersRequest, ListUsersResponse,
    UpdateUserRequest, UpdateUserResponse, User,
    users_service_server::{UsersService, UsersServiceServer},
};
use tokio::sync::Semaphore;
use tonic::Code;

use super::TestApp;

/// What the real Users is made to do: CreateUsers refused whole with a code (an older
/// Users answers UNIMPLEMENTED, as tonic answers an unknown method), the first CreateUser
/// (or every one) shed with a `RetryInfo` wait, or each CreateUser held until the test lets one through.
/// [`ScriptedUsersRunning`] counts CreateUsers calls and notes when each CreateUser call
/// arrived.
#[derive(Default)]
pub struct Script {
    pub refuse_create_users: Option<Code>,
    pub shed_first_create_user: Option<Duration>,
    /// Every CreateUser call shed with this `RetryInfo` wait: a Users that stays overloaded.
    pub shed_every_create_user: Option<Duration>,
    /// The first CreateUser call of each key shed with this `RetryInfo` wait.
    pub shed_each_keys_first_create_user: Option<Duration>,
    /// Each CreateUser call takes a permit (for good) before it is answered: with none
    /// free it waits, so the test answers calls one permit at a time.
    pub create_user_gate: Option<Arc<Semaphore>>,
    /// The same for each CreateUsers call (before it is refused or answered).
    pub create_users_gate: Option<Arc<Semaphore>>,
    /// The same for each UpdateUser call.
    pub update_user_gate: Option<Arc<Semaphore>>,
    /// ListUsers answered UNIMPLEMENTED, as a Users older than the method answers.
    pub no_list_users: bool,
    /// ListUsers without a student refused for its `student_id`, as a Users whose
    /// ListUsers only answered for one student refused it.
    pub list_users_by_student_only: bool,
}

struct ScriptedUsers {
    real: users_svc::UsersApi,
    script: Script,
    create_users_calls: Arc<AtomicUsize>,
    create_user_calls: Arc<Mutex<Vec<Instant>>>,
    create_user_calls_by_key: Arc<Mutex<Vec<(String, Instant)>>>,
    update_user_calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl UsersService for ScriptedUsers {
    async fn create_user(
        &self,
        request: tonic::Request<CreateUserRequest>,
    ) -> Result<tonic::Response<CreateUserResponse>, tonic::Status> {
        let key = request.get_ref().idempotency_key.clone();
        let (first, keys_first) = {
            let mut calls = self.create_user_calls.lock().expect("calls");
            calls.push(Instant::now());
            let mut by_key = self.create_user_calls_by_key.lock().expect("calls");
            let keys_first = !by_key.iter().any(|(seen, _)| *seen == key);
            by_key.push((key, Instant::now()));
            (calls.len() == 1, keys_first)
        };
        if let Some(gate) = &self.script.create_user_gate {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        match (
            self.script.shed_first_create_user,
            self.script.shed_every_create_user,
        ) {
            (Some(wait), _) if first => Err(platform::status::overloaded(wait)),
            (_, Some(wait)) => Err(platform::status::overloaded(wait)),
            _ => match self.script.shed_each_keys_first_create_user {
                Some(wait) if keys_first => Err(platform::status::overloaded(wait)),
                _ => self.real.create_user(request).await,
            },
        }
    }

    async fn create_users(
        &self,
        request: tonic::Request<CreateUsersRequest>,
    ) -> Result<tonic::Response<CreateUsersResponse>, tonic::Status> {
        self.create_users_calls.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.script.create_users_gate {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        match self.script.refuse_create_users {
            Some(code) => Err(tonic::Status::new(code, "refused whole by the test")),
            None => self.real.create_users(request).await,
        }
    }

    async fn update_user(
        &self,
        request: tonic::Request<UpdateUserRequest>,
    ) -> Result<tonic::Response<UpdateUserResponse>, tonic::Status> {
        self.update_user_calls.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.script.update_user_gate {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        self.real.update_user(request).await
    }

    async fn disable_user(
        &self,
        request: tonic::Request<DisableUserRequest>,
    ) -> Result<tonic::Response<DisableUserResponse>, tonic::Status> {
        self.real.disable_user(request).await
    }

    async fn get_user(
        &self,
        request: tonic::Request<GetUserRequest>,
    ) -> Result<tonic::Response<User>, tonic::Status> {
        self.real.get_user(request).await
    }

    async fn list_users(
        &self,
        request: tonic::Request<ListUsersRequest>,
    ) -> Result<tonic::Response<ListUsersResponse>, tonic::Status> {
        if self.script.no_list_users {
            return Err(tonic::Status::unimplemented(""));
        }
        if self.script.list_users_by_student_only && request.get_ref().student_id.is_empty() {
            return Err(platform::status::invalid_argument(
                &platform::validate::FieldViolation::new("student_id", "must be a hyphenated UUID"),
            ));
        }
        self.real.list_users(request).await
    }
}

/// What a test reads back from its [`ScriptedUsers`], which serves until `_serving` drops.
pub struct ScriptedUsersRunning {
    pub url: String,
    pub create_users_calls: Arc<AtomicUsize>,
    pub create_user_calls: Arc<Mutex<Vec<Instant>>>,
    /// Each CreateUser call's key and when it arrived.
    pub create_user_calls_by_key: Arc<Mutex<Vec<(String, Instant)>>>,
    pub update_user_calls: Arc<AtomicUsize>,
    _serving: tokio_util::sync::DropGuard,
}

/// Serves [`ScriptedUsers`] over `app`'s Users DB.
pub async fn scripted_users(app: &TestApp, script: Script) -> ScriptedUsersRunning {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let settings = users_svc::InboxSettings::default();
    let users = ScriptedUsers {
        real: users_svc::UsersApi::new(
            app.users_db.clone(),
            settings.retention,
            users_svc::answer_cache::AnswerCache::new(settings.cache_entries, settings.retention),
        ),
        script,
        create_users_calls: Arc::default(),
        create_user_calls: Arc::default(),
        create_user_calls_by_key: Arc::default(),
        update_user_calls: Arc::default(),
    };
    let (create_users_calls, create_user_calls, create_user_calls_by_key, update_user_calls) = (
        users.create_users_calls.clone(),
        users.create_user_calls.clone(),
        users.create_user_calls_by_key.clone(),
        users.update_user_calls.clone(),
    );
    let definition = platform::grpc_server::ServiceDefinition {
        routes: tonic::service::Routes::new(UsersServiceServer::new(users)),
        name: "users.v1.UsersService",
        file_descriptor_set: proto::users::v1::FILE_DESCRIPTOR_SET,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(platform::grpc_server::serve(
        listener,
        definition,
        // Calls held at the gate wait as long as the test needs, not the default 10 s.
        platform::grpc_server::ServerOptions {
            limits: platform::grpc_server::Limits {
                request_timeout: Duration::from_secs(120),
                ..platform::grpc_server::Limits::default()
            },
            tls: None,
        },
        app.users_db.clone(),
        stop.clone(),
    ));
    ScriptedUsersRunning {
        url: format!("http://{addr}"),
        create_users_calls,
        create_user_calls,
        create_user_calls_by_key,
        update_user_calls,
        _serving: stop.drop_guard(),
    }
}
