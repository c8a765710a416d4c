//! The gRPC face of the Student service: decode and validate, call a use case, encode.

use platform::{otlp::ExportedSpan, trace::TraceContext, validate};
use proto::student::v1::{
    CreateStudentRequest, DeactivateStudentRequest, GetStudentRequest, ListStudentsRequest,
    ListStudentsResponse, Student, UpdateStudentRequest, UserLinkStatus,
    student_service_server::StudentService,
};
use sea_orm::DatabaseConnection;
use tonic::{Request, Response, Status};

use student_store::{
    students::StudentView,
    sync::{LinkState, link_state},
    wake::RelayBell,
};

use crate::{
    direct::DirectUsers,
    error::Error,
    new_student::{NewStudent, StudentChange},
    students,
    writer::StudentWriter,
};

/// The trace a student change belongs to: the caller's `traceparent`, continued, or a new
/// one. Its id goes on the handler's span, so every log line of the call carries it, and
/// the context goes on the outbox row, so the relay and Users continue it. The call is the
/// trace's span `method` of this service (exported when a collector is named).
fn traced<T>(request: &Request<T>, method: &'static str) -> (TraceContext, ExportedSpan) {
    let trace = TraceContext::continue_in_current_span(request.metadata());
    (
        trace,
        ExportedSpan::server(trace, "student.v1.StudentService", method),
    )
}

/// Implements `student.v1.StudentService` over the Student DB.
pub struct StudentApi {
    db: DatabaseConnection,
    link: Link,
    bell: RelayBell,
    writer: StudentWriter,
}

/// How CreateStudent gets the login user.
#[derive(Clone, Default)]
pub enum Link {
    /// Through the outbox: the design.
    #[default]
    Outbox,
    /// By calling Users itself: the naive baseline (see [`crate::direct`]).
    Direct(Box<DirectUsers>),
}

impl StudentApi {
    /// UpdateStudent and DeactivateStudent: one change of a student, within `trace`.
    async fn change(
        &self,
        request: impl TryInto<StudentChange, Error = Error>,
        trace: TraceContext,
    ) -> Result<Response<Student>, Status> {
        let change = request.try_into()?;
        let view = students::change_student(&self.db, &self.bell, change, trace).await?;
        Ok(Response::new(encode(view)))
    }

    /// Starts CreateStudent's writers (inside a Tokio runtime).
    pub fn new(db: DatabaseConnection, link: Link, bell: RelayBell) -> Self {
        let writer = StudentWriter::start(db.clone(), bell.clone());
        Self {
            db,
            link,
            bell,
            writer,
        }
    }
}

#[tonic::async_trait]
impl StudentService for StudentApi {
    #[tracing::instrument(name = "CreateStudent", skip_all, fields(trace_id))]
    async fn create_student(
        &self,
        request: Request<CreateStudentRequest>,
    ) -> Result<Response<Student>, Status> {
        let (trace, span) = traced(&request, "CreateStudent");
        span.ended(
            async {
                let new = NewStudent::try_from(request.into_inner())?;
                let view = students::create_student(&self.db, &self.writer, &self.link, new, trace)
                    .await?;
                Ok(Response::new(encode(view)))
            }
            .await,
        )
    }

    #[tracing::instrument(name = "UpdateStudent", skip_all, fields(trace_id))]
    async fn update_student(
        &self,
        request: Request<UpdateStudentRequest>,
    ) -> Result<Response<Student>, Status> {
        let (trace, span) = traced(&request, "UpdateStudent");
        span.ended(self.change(request.into_inner(), trace).await)
    }

    #[tracing::instrument(name = "DeactivateStudent", skip_all, fields(trace_id))]
    async fn deactivate_student(
        &self,
        request: Request<DeactivateStudentRequest>,
    ) -> Result<Response<Student>, Status> {
        let (trace, span) = traced(&request, "DeactivateStudent");
        span.ended(self.change(request.into_inner(), trace).await)
    }

    #[tracing::instrument(name = "GetStudent", skip_all)]
    async fn get_student(
        &self,
        request: Request<GetStudentRequest>,
    ) -> Result<Response<Student>, Status> {
        let id = validate::uuid("id", &request.into_inner().id).map_err(Error::from)?;
        let view = students::get_student(&self.db, id).await?;
        Ok(Response::new(encode(view)))
    }

    #[tracing::instrument(name = "ListStudents", skip_all)]
    async fn list_students(
        &self,
        request: Request<ListStudentsRequest>,
    ) -> Result<Response<ListStudentsResponse>, Status> {
        let request = request.into_inner();
        // The token is the id of the last student of the previous page.
        let (after, limit) =
            validate::page(request.page_size, &request.page_token).map_err(Error::from)?;
        let page = students::list_students(&self.db, after, limit).await?;
        Ok(Response::new(ListStudentsResponse {
            students: page.students.into_iter().map(encode).collect(),
            next_page_token: page.next_after.map(|id| id.to_string()).unwrap_or_default(),
        }))
    }
}

fn encode(view: StudentView) -> Student {
    let StudentView {
        student,
        create_user,
    } = view;
    let (status, link_error) = match link_state(&student, create_user.as_ref()) {
        LinkState::Linked => (UserLinkStatus::Linked, String::new()),
        LinkState::Pending => (UserLinkStatus::Pending, String::new()),
        LinkState::Failed(error) => (UserLinkStatus::Failed, error.to_string()),
        LinkState::Unknown => (UserLinkStatus::Unspecified, String::new()),
    };
    Student {
        id: student.id.to_string(),
        first_name: student.first_name,
        last_name: student.last_name,
        email: student.email,
        document_number: student.document_number,
        user_id: student.user_id.map(|id| id.to_string()).unwrap_or_default(),
        user_link_status: status.into(),
        link_error,
        created_at: Some(platform::timestamp::to_proto(student.created_at)),
        version: u64::try_from(student.version).unwrap_or_default(),
        synced_version: u64::try_from(student.synced_version).unwrap_or_default(),
        active: student.active,
    }
}
