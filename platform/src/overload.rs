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
