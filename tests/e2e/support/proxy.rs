//! A TCP forwarder that gives a restartable process one address for a whole test.
//!
//! A test that kills a service and starts it again cannot bind the new process to the old
//! port: the port is free in between, and any other test's process (or a client looking
//! for an unreachable port) may take it. Instead the test owns a listener for the whole
//! test and forwards each connection to wherever the service listens now, or closes it at
//! once while the service is down, as a dead host would refuse it.
//!
//! A backend that died by itself (a fail point's abort) is noticed before the test is: the
//! proxy forwards only while the backend's process is running, so it never connects to the
//! dead process's port, which another test may have taken by then.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use tokio::net::{TcpListener, TcpStream};

/// Where a proxy forwards: a listening address and the process that owns it.
#[derive(Debug, Clone, Copy)]
struct Backend {
    addr: SocketAddr,
    pid: u32,
}

/// A listener owned by the test, forwarding to the current backend (if any).
pub struct Proxy {
    addr: SocketAddr,
    backend: Arc<Mutex<Option<Backend>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a fresh port of 127.0.0.1 with no backend yet.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let backend = Arc::new(Mutex::new(None));
        let task = tokio::spawn(forward(listener, backend.clone()));
        Self {
            addr,
            backend,
            task,
        }
    }

    /// The address clients use for the whole test.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends new connections to `addr`, served by process `pid`, while that process runs.
    pub fn set_backend(&self, addr: SocketAddr, pid: u32) {
        self.replace(Some(Backend { addr, pid }));
    }

    /// Refuses new connections until the next [`Proxy::set_backend`].
    pub fn clear_backend(&self) {
        self.replace(None);
    }

    fn replace(&self, backend: Option<Backend>) {
        *self
            .backend
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = backend;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(listener: TcpListener, backend: Arc<Mutex<Option<Backend>>>) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        let target = *backend
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        tokio::spawn(async move {
            let Some(target) = target.filter(|backend| is_running(backend.pid)) else {
                // Reset at once, as a host with nothing listening would: the caller sees the
                // connection refused, the service down.
                let _ = client.set_zero_linger();
                return;
            };
            let _ = client.set_nodelay(true);
            if let Ok(mut server) = TcpStream::connect(target.addr).await {
                let _ = server.set_nodelay(true);
                // Ends when either side closes: a killed backend closes its sockets, so the
                // client sees the connection drop, as it would without the proxy.
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            }
        });
    }
}

/// Tells whether process `pid` is running: it exists and is not a zombie (a child that
/// ended and has not been reaped yet keeps its pid, but no longer its sockets).
fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}
