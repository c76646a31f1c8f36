//! A loopback TCP proxy that can be cut: every connection through it is dropped
//! and new ones are closed at once until it is restored — a database (or API
//! server) outage as its clients see it, without stopping the server behind it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A proxy from a port of its own on 127.0.0.1 to `target`.
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    cut: AtomicBool,
    connections: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn connections(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let accept = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if shared.cut.load(Ordering::SeqCst) {
                        continue; // dropped: closed at once
                    }
                    let task = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    let mut connections = shared.connections();
                    connections.retain(|c| !c.is_finished());
                    connections.push(task);
                }
            }
        });
        Ok(TcpProxy { port, shared, accept })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        for connection in self.shared.connections().drain(..) {
            connection.abort();
        }
    }

    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
