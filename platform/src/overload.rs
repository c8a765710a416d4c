//! Load shedding: a server-wide limit on requests in flight. A request over the limit is
//! answered at once with RESOURCE_EXHAUSTED and `RetryInfo` instead of queueing, so a flood
//! gets quick answers, memory stays bounded, and the service serves normally again as soon
//! as the flood ends. Health checks are never shed: a busy service is still a live one.
//!
//! tower's `LoadShed` + `ConcurrencyLimit` (tonic's `load_shed`) limit each connection
//! separately and cannot attach `RetryInfo`; this layer is the small global version.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::sync::Semaphore;
use tonic::body::Body;
use tower::{Layer, Service};

/// Limits requests in flight across all connections.
#[derive(Clone)]
pub struct ShedLoadLayer {
    permits: Arc<Semaphore>,
    retry_after: Duration,
}

impl ShedLoadLayer {
    /// Allows `max_in_flight` requests at once; the rest are told to retry after
    /// `retry_after`.
    pub fn new(max_in_flight: usize, retry_after: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_in_flight)),
            retry_after,
        }
    }
}

impl<S> Layer<S> for ShedLoadLayer {
    type Service = ShedLoad<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ShedLoad {
            inner,
            permits: self.permits.clone(),
            retry_after: self.retry_after,
        }
    }
}

/// The service [`ShedLoadLayer`] wraps around the routes.
#[derive(Clone)]
pub struct ShedLoad<S> {
    inner: S,
    permits: Arc<Semaphore>,
    retry_after: Duration,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for ShedLoad<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path().starts_with("/grpc.health.v1.Health/") {
            return Box::pin(self.inner.call(request));
        }
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let response = self.inner.call(request);
                Box::pin(async move {
                    let response = response.await;
                    drop(permit);
                    response
                })
            }
            Err(_) => {
                let status = crate::status::overloaded(self.retry_after);
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures::FutureExt as _;
    use tonic::Code;
    use tonic_types::StatusExt as _;

    use super::*;

    /// A call to the layered service, as the server would poll it.
    type Answer = BoxFuture<Result<http::Response<Body>, Infallible>>;

    /// A route whose calls wait until the test lets one through (a permit of `gate` each).
    #[derive(Clone)]
    struct Gated(Arc<Semaphore>);

    impl Service<http::Request<()>> for Gated {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let gate = self.0.clone();
            Box::pin(async move {
                gate.acquire().await.expect("gate open").forget();
                Ok(http::Response::new(Body::empty()))
            })
        }
    }

    fn call(service: &mut ShedLoad<Gated>, path: &str) -> Answer {
        service.call(
            http::Request::builder()
                .uri(path)
                .body(())
                .expect("request"),
        )
    }

    const CREATE: &str = "/users.v1.UsersService/CreateUser";
    const HEALTH: &str = "/grpc.health.v1.Health/Check";
    const WATCH: &str = "/grpc.health.v1.Health/Watch";

    /// What one call answered at once, if it did: its gRPC status (`None` while admitted
    /// and waiting at the route).
    fn answered_at_once(call: &mut Answer) -> Option<tonic::Status> {
        let response = call.now_or_never()?.expect("infallible");
        Some(
            tonic::Status::from_header_map(response.headers())
                .unwrap_or_else(|| tonic::Status::ok("")),
        )
    }

    /// Exactly `max_in_flight` calls are admitted; the next is answered at once with
    /// RESOURCE_EXHAUSTED and the configured `RetryInfo` wait; a call that ends (answered,
    /// or dropped by its caller) frees its slot; health is never shed and takes no slot.
    #[tokio::test]
    async fn calls_past_the_limit_are_shed_at_once_until_a_slot_frees() {
        let gate = Arc::new(Semaphore::new(0));
        let mut service =
            ShedLoadLayer::new(2, Duration::from_millis(250)).layer(Gated(gate.clone()));
        let admitted = |service: &mut ShedLoad<Gated>, path: &str, why: &str| {
            let mut answer = call(service, path);
            assert!(answered_at_once(&mut answer).is_none(), "admitted: {why}");
            answer
        };
        let shed = |service: &mut ShedLoad<Gated>, why: &str| {
            let status = answered_at_once(&mut call(service, CREATE))
                .unwrap_or_else(|| panic!("shed at once: {why}"));
            assert_eq!(status.code(), Code::ResourceExhausted, "{why}");
            status
        };

        let first = admitted(&mut service, CREATE, "the first of two");
        let second = admitted(&mut service, CREATE, "the second of two");
        let status = shed(&mut service, "the limit is taken");
        assert_eq!(
            status
                .get_details_retry_info()
                .and_then(|retry| retry.retry_delay),
            Some(Duration::from_millis(250))
        );
        let health = admitted(&mut service, HEALTH, "health, with every slot taken");
        // Watch too: the stream clients' own health checking keeps open.
        let watch = admitted(&mut service, WATCH, "health's Watch, with every slot taken");

        // The second caller goes away: its slot is free. Health takes none of it.
        drop(second);
        let other_health = admitted(&mut service, HEALTH, "health, with a slot free");
        let third = admitted(&mut service, CREATE, "in the slot the second freed");
        shed(&mut service, "the limit is taken again");

        // The first call is answered: its slot serves the next call.
        gate.add_permits(1);
        let response = first.await.expect("infallible");
        assert!(
            tonic::Status::from_header_map(response.headers()).is_none(),
            "served"
        );
        let fourth = admitted(&mut service, CREATE, "in the slot the first freed");
        shed(&mut service, "the limit is taken once more");

        gate.add_permits(5);
        for answer in [health, watch, other_health, third, fourth] {
            let response = answer.await.expect("infallible");
            assert!(
                tonic::Status::from_header_map(response.headers()).is_none(),
                "served"
            );
        }
    }
}
