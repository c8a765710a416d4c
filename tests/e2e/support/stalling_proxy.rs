//! A TCP forwarder to a PostgreSQL server that can leave its connections open and silent:
//! what a NAT, a firewall or a failed-over host does to a connection it dropped without a
//! word (half-open). Neither end is closed, nothing is refused, and no byte gets through.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream, tcp::OwnedReadHalf, tcp::OwnedWriteHalf},
    task::JoinSet,
};

/// A listener owned by the test, forwarding each connection to the server of a PostgreSQL
/// URL until told otherwise. Dropping it ends every connection.
pub struct StallingProxy {
    url: String,
    state: Arc<State>,
    task: tokio::task::AbortHandle,
}

#[derive(Default)]
struct State {
    /// Connections numbered from 0 in the order they were accepted.
    accepted: AtomicU64,
    /// Connections numbered below this forward nothing more.
    silenced_below: AtomicU64,
    /// Whether new connections are closed at once, as a server refusing them would.
    refusing: AtomicBool,
    refused: AtomicUsize,
}

impl StallingProxy {
    /// Forwards to the server `url` names (its host, and its port or PostgreSQL's 5432).
    pub async fn start(url: &str) -> Self {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let slash = rest.find('/').unwrap_or(rest.len());
        let (authority, path) = rest.split_at(slash);
        let (user, server) = match authority.rsplit_once('@') {
            Some((user, server)) => (format!("{user}@"), server.to_owned()),
            None => (String::new(), authority.to_owned()),
        };
        let server = if server.contains(':') {
            server
        } else {
            format!("{server}:5432")
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(State::default());
        let task = tokio::spawn(serve(listener, server, state.clone()));
        Self {
            url: format!("{scheme}://{user}{addr}{path}"),
            state,
            task: task.abort_handle(),
        }
    }

    /// The URL with the proxy in place of the server.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every connection open now stays open and forwards nothing more, either way.
    /// Connections made later forward as before.
    pub fn silence_open_connections(&self) {
        let accepted = self.state.accepted.load(Ordering::SeqCst);
        self.state.silenced_below.store(accepted, Ordering::SeqCst);
    }

    /// New connections are closed at once (true) or forwarded (false).
    pub fn refuse_new_connections(&self, refusing: bool) {
        self.state.refusing.store(refusing, Ordering::SeqCst);
    }

    /// How many connections were accepted to be forwarded so far (not those refused).
    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// How many connections were closed at once so far.
    pub fn refused(&self) -> usize {
        self.state.refused.load(Ordering::SeqCst)
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections until aborted; aborting it ends every connection's forwarding.
async fn serve(listener: TcpListener, server: String, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors, say: not a spin.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        if state.refusing.load(Ordering::SeqCst) {
            state.refused.fetch_add(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let number = state.accepted.fetch_add(1, Ordering::SeqCst);
        let Ok(upstream) = TcpStream::connect(&server).await else {
            continue;
        };
        let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = upstream.into_split();
        connections.spawn(copy(client_read, server_write, number, state.clone()));
        connections.spawn(copy(server_read, client_write, number, state.clone()));
    }
}

/// Copies one direction of connection `number` until either end closes; once it is
/// silenced, forwards nothing, not even a close: both ends stay open.
async fn copy(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, number: u64, state: Arc<State>) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let read = from.read(&mut buffer).await;
        if number < state.silenced_below.load(Ordering::SeqCst) {
            // Held, with both halves, until the proxy is dropped.
            std::future::pending::<()>().await;
        }
        let read = match read {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
