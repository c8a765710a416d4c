//! Server reflection speaks v1 and v1alpha (grpcurl of any age works without .proto files),
//! and each server lists exactly what it serves.

use std::net::SocketAddr;

use crate::{
    on_both_backends,
    support::{Backend, spawn_app},
};

on_both_backends!(each_server_lists_its_own_services_over_both_reflection_versions);

/// Lists services through one reflection version's generated client.
macro_rules! list_services {
    ($version:ident, $addr:expr) => {{
        use tonic_reflection::pb::$version::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", $addr))
            .expect("endpoint")
            .connect_lazy();
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = ServerReflectionClient::new(channel)
            .server_reflection_info(futures::stream::iter([request]))
            .await
            .expect("reflection call")
            .into_inner();
        match answers
            .message()
            .await
            .expect("answer")
            .and_then(|a| a.message_response)
        {
            Some(MessageResponse::ListServicesResponse(list)) => {
                let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
                names.sort();
                names
            }
            other => panic!("unexpected reflection answer {other:?}"),
        }
    }};
}

async fn services(addr: SocketAddr) -> (Vec<String>, Vec<String>) {
    (list_services!(v1, addr), list_services!(v1alpha, addr))
}

async fn each_server_lists_its_own_services_over_both_reflection_versions(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for (addr, own) in [
        (app.student_addr, "student.v1.StudentService"),
        (app.users_addr, "users.v1.UsersService"),
    ] {
        let (v1, v1alpha) = services(addr).await;
        for listed in [&v1, &v1alpha] {
            assert!(listed.contains(&own.to_owned()), "{own} listed: {listed:?}");
            assert!(
                listed.contains(&"grpc.health.v1.Health".to_owned()),
                "{listed:?}"
            );
            let foreign = if own.starts_with("student") {
                "users.v1.UsersService"
            } else {
                "student.v1.StudentService"
            };
            assert!(
                !listed.contains(&foreign.to_owned()),
                "{foreign} is not served here: {listed:?}"
            );
        }
    }
}
