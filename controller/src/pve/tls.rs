//! TLS settings for one cluster: its CA bundle, the system roots, or (when the
//! operator set `insecure: true`) no verification at all.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::Cluster;

/// Why a cluster's TLS settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
    #[error("reading ca_file {}: {source}", path.display())]
    ReadCa {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("parsing ca_file {}: {source}", path.display())]
    ParseCa {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("adding a CA from {}: {source}", path.display())]
    AddCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("ca_file {} holds no certificate", path.display())]
    NoCertificate { path: PathBuf },
    /// The HTTP client could not be built on these settings.
    #[error("{0}")]
    Client(#[source] reqwest::Error),
}

pub(super) fn client_config(cluster: &Cluster) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?;
    if cluster.insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth());
    }
    let mut roots = RootCertStore::empty();
    match &cluster.ca_file {
        Some(path) => {
            let at = || path.to_path_buf();
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|source| TlsError::ReadCa { path: at(), source })?
            {
                let cert = cert.map_err(|source| TlsError::ParseCa { path: at(), source })?;
                roots
                    .add(cert)
                    .map_err(|source| TlsError::AddCa { path: at(), source })?;
            }
            if roots.is_empty() {
                return Err(TlsError::NoCertificate { path: at() });
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// Accepts any server certificate: the operator's explicit `insecure: true`.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
