//! `cargo run -p devstack`: builds the three binaries, starts them on the embedded default
//! (SQLite files under ./data/), waits until both services are healthy, and stops all three
//! on Ctrl-C.

use std::{path::Path, time::Duration};

use anyhow::bail;
use devstack::{Process, build_binaries, wait_until_serving_over};
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tonic::transport::{Certificate, ClientTlsConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Registered first, so a Ctrl-C at any moment reaches the handler below.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    // `cargo run --release -p devstack` runs release binaries (for benchmarks).
    let bin = build_binaries(!cfg!(debug_assertions), &[])?;
    std::fs::create_dir_all("data")?;
    let mut processes = Vec::new();
    for (name, service) in [
        ("users-svc", Some("users.v1.UsersService")),
        ("student-svc", Some("student.v1.StudentService")),
        ("relay", None),
    ] {
        let log = Path::new("data").join(format!("{name}.log"));
        let mut process = Process::spawn_in_own_group(&bin.join(name), &[], &[], &log)?;
        if let Some(service) = service {
            let addr = process.listening_addr(Duration::from_secs(30))?;
            let tls = health_tls(name)?;
            wait_until_serving_over(addr, service, Duration::from_secs(30), tls.as_ref()).await?;
            println!("{name:<12} healthy on {addr}  (log: {})", log.display());
        } else {
            println!("{name:<12} running           (log: {})", log.display());
        }
        processes.push(process);
    }
    println!("all three are up; press Ctrl-C to stop them");

    let outcome = tokio::select! {
        _ = interrupt.recv() => Ok(()),
        _ = terminate.recv() => Ok(()),
        name = watch_for_exit(&mut processes) => Err(name),
    };
    for process in processes.iter_mut().rev() {
        let _ = process.signal(Signal::SIGTERM);
    }
    for process in processes.iter_mut().rev() {
        if process.wait_timeout(Duration::from_secs(10))?.is_none() {
            process.kill()?;
            println!(
                "{} killed: still running 10 s after SIGTERM",
                process.name()
            );
        } else {
            println!("{} stopped", process.name());
        }
    }
    match outcome {
        Ok(()) => Ok(()),
        Err(name) => bail!("{name} exited unexpectedly; see data/{name}.log"),
    }
}

/// TLS for the health check of `name`, when it serves TLS (`STUDENT_TLS_CERT` /
/// `USERS_TLS_CERT` set): trusting `USERS_TLS_CA`, the CA the relay trusts too.
fn health_tls(name: &str) -> anyhow::Result<Option<ClientTlsConfig>> {
    let cert_var = if name == "student-svc" {
        "STUDENT_TLS_CERT"
    } else {
        "USERS_TLS_CERT"
    };
    if std::env::var_os(cert_var).is_none() {
        return Ok(None);
    }
    let tls = match std::env::var_os("USERS_TLS_CA") {
        Some(ca) => {
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca)?))
        }
        None => ClientTlsConfig::new().with_native_roots(),
    };
    Ok(Some(tls))
}

/// Returns the name of the first process that ends on its own.
async fn watch_for_exit(processes: &mut [Process]) -> String {
    loop {
        for process in processes.iter_mut() {
            if let Ok(Some(_)) = process.try_wait() {
                return process.name().to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
