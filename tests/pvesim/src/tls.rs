//! A throwaway CA and a server certificate it signs, so clients can verify
//! TLS against pvesim exactly as against a cluster with its own CA.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

#[derive(Debug)]
pub struct Certs {
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
    pub server: Arc<ServerConfig>,
}

pub fn generate(hostnames: &[&str]) -> anyhow::Result<Certs> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pvesim CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate()?;
    let names: Vec<String> = hostnames.iter().map(|h| h.to_string()).collect();
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name.push(DnType::CommonName, "pvesim");
    let cert = params.signed_by(&key, &issuer)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    // Proxmox speaks HTTP/1.1 only.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Certs {
        ca_pem: ca_cert.pem(),
        server: Arc::new(server),
    })
}
