//! A TLS front for a plain-text server on this machine (an S3 server that speaks HTTP only,
//! as Garage does behind its usual reverse proxy): it accepts TLS with a certificate it is
//! given and relays the bytes to the server, so that clients can be tested over `https`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};

/// A running front; it stops with the runtime it was started on.
pub struct TlsFront {
    addr: SocketAddr,
}

impl TlsFront {
    /// Listen on 127.0.0.1 (a free port) with `cert_pem` and `key_pem`, relaying to `target`.
    pub async fn start(target: SocketAddr, cert_pem: &[u8], key_pem: &[u8]) -> Result<TlsFront> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .context("read the front's certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).context("read the front's key")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("the front's certificate and key")?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("listen for the TLS front")?;
        let addr = listener.local_addr().context("the front's address")?;
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return; // a client that did not finish the handshake
                    };
                    let Ok(mut up) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
        Ok(TlsFront { addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}
