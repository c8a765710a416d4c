//! The gRPC face of the Users service: decode and validate, call a use case, encode.

use platform::validate;
use proto::users::v1::{
    CreateUserRequest, CreateUserResponse, GetUserRequest, REPLAY_ONLY_HEADER, REPLAYED_HEADER,
    User, users_service_server::UsersService,
};
use sea_orm::{DatabaseConnection, EntityTrait};
use tonic::{Code, Request, Response, Status, metadata::MetadataValue};

use crate::{
    create_user::{self, Answer, Mode},
    entity::{inbox::SavedOutcome, users},
    error::Error,
    new_user::NewUser,
};

/// Implements `users.v1.UsersService` over the Users DB.
pub struct UsersApi {
    db: DatabaseConnection,
}

impl UsersApi {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl UsersService for UsersApi {
    #[tracing::instrument(name = "CreateUser", skip_all)]
    async fn create_user(
        &self,
        request: Request<CreateUserRequest>,
    ) -> Result<Response<CreateUserResponse>, Status> {
        platform::failpoint::hit(platform::failpoint::points::USERS_ON_REQUEST).await;
        let replay_only = request
            .metadata()
            .get(REPLAY_ONLY_HEADER)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.eq_ignore_ascii_case("true"));
        let mode = if replay_only {
            Mode::ReplayOnly
        } else {
            Mode::Execute
        };
        let new = NewUser::try_from(request.into_inner())?;
        let answer = create_user::create_user(&self.db, new, mode).await?;
        encode_answer(answer)
    }

    #[tracing::instrument(name = "GetUser", skip_all)]
    async fn get_user(&self, request: Request<GetUserRequest>) -> Result<Response<User>, Status> {
        let id = validate::uuid("id", &request.into_inner().id).map_err(Error::from)?;
        let user = users::Entity::find_by_id(id)
            .one(&self.db)
            .await
            .map_err(Error::from)?
            .ok_or(Error::NotFound(id))?;
        Ok(Response::new(User {
            id: user.id.to_string(),
            email: user.email,
            first_name: user.first_name,
            last_name: user.last_name,
            document_number: user.document_number,
            student_id: user.student_id.to_string(),
            enabled: user.enabled,
            created_at: Some(platform::timestamp::to_proto(user.created_at)),
        }))
    }
}

/// Turns a saved or fresh answer into the gRPC reply, marking replays with the header.
fn encode_answer(answer: Answer) -> Result<Response<CreateUserResponse>, Status> {
    let Answer { outcome, replayed } = answer;
    let mut reply = match outcome {
        SavedOutcome::Created { user_id } => Ok(Response::new(CreateUserResponse {
            user_id: user_id.to_string(),
        })),
        SavedOutcome::Rejected {
            code,
            reason,
            message,
        } => Err(platform::status::with_reason(
            Code::from_i32(code),
            message,
            &reason,
            crate::error::DOMAIN,
        )),
    };
    if replayed {
        let metadata = match &mut reply {
            Ok(response) => response.metadata_mut(),
            Err(status) => status.metadata_mut(),
        };
        metadata.insert(REPLAYED_HEADER, MetadataValue::from_static("true"));
    }
    reply
}
