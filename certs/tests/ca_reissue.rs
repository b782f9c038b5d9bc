//! A CA re-issue under cert-manager, followed the way its CA issuer works,
//! with real TLS handshakes: the API server (a client trusting only the
//! caBundle) against a webhook replica (a server presenting its leaf).
//!
//! With `cert-manager.io/inject-ca-from`, cainjector copies the leaf
//! Secret's `ca.crt` into caBundle as soon as the leaf is re-issued, while
//! the replicas keep serving the old leaf until the kubelet has synced the
//! Secret volume and the webhook reloaded it. After a CA re-issue the new
//! leaf's `ca.crt` is the new CA certificate; these tests show which CA
//! re-issues survive that flip in either order: one that keeps the CA key
//! (`privateKey.rotationPolicy: Never`, as the shipped component sets), not
//! one with a new key.
//!
//! Left out: cert-manager itself (the certificates are made here as its CA
//! issuer makes them: the CA certificate from the Secret signs, the chain's
//! root becomes `ca.crt`), cainjector's and the kubelet's timing (both
//! orders are tried instead), and Go's verifier (webpki verifies here; both
//! build the chain from the issuer name and check the signature with the
//! CA's key, and neither needs the root's serial to match).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
    SerialNumber,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use serde_yaml::Value;
use time::OffsetDateTime;
use x509_parser::extensions::ParsedExtension;

const COMPONENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../manifests/components/cert-manager"
);

/// The name the API server dials: `<service>.<namespace>.svc`.
const DIALED: &str = "nodegate-webhook.nodegate.svc";

/// Every document of a YAML file of the component.
fn docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{COMPONENT}/{file}")).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

/// The component's Certificates: the CA one (isCA) and the serving one.
fn certificates() -> (Value, Value) {
    let all: Vec<Value> = ["issuers.yaml", "certificate.yaml"]
        .iter()
        .flat_map(|f| docs(f))
        .filter(|d| d["kind"] == "Certificate")
        .collect();
    let (ca, leaf): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|d| d["spec"]["isCA"].as_bool() == Some(true));
    assert_eq!((ca.len(), leaf.len()), (1, 1), "one CA and one leaf");
    (ca[0].clone(), leaf[0].clone())
}

/// The shipped CA Certificate keeps its key across re-issue, and it is the
/// one whose Secret signs the serving certificate: otherwise the flip of
/// caBundle after a CA re-issue fails every call until the pods reload.
#[test]
fn the_shipped_ca_certificate_keeps_its_key_and_signs_the_leaf() {
    let (ca, leaf) = certificates();
    assert_eq!(
        ca["spec"]["privateKey"]["rotationPolicy"], "Never",
        "the CA Certificate must set privateKey.rotationPolicy: Never (cert-manager >= 1.18 defaults to Always)"
    );
    let issuer = leaf["spec"]["issuerRef"]["name"].as_str().unwrap();
    let signing = docs("issuers.yaml")
        .into_iter()
        .find(|d| d["kind"] == "Issuer" && d["metadata"]["name"] == issuer)
        .unwrap();
    assert_eq!(
        signing["spec"]["ca"]["secretName"],
        ca["spec"]["secretName"]
    );
    // cainjector reads the serving Certificate's Secret: its ca.crt is the
    // CA above.
    let inject = &docs("inject-ca.yaml")[0];
    assert_eq!(
        inject["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "{}/{}",
            leaf["metadata"]["namespace"].as_str().unwrap(),
            leaf["metadata"]["name"].as_str().unwrap()
        )
    );
}

/// A CA certificate as cert-manager's selfSigned issuer makes it for the
/// component: subject from commonName, signed by its own key, a fresh serial
/// and validity each issue.
fn issue_ca(
    key: &KeyPair,
    serial: u8,
    not_before: OffsetDateTime,
) -> (CertificateParams, Certificate) {
    let (ca, _) = certificates();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        ca["spec"]["commonName"].as_str().unwrap(),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(SerialNumber::from_slice(&[serial]));
    params.not_before = not_before;
    params.not_after = not_before + time::Duration::days(3650);
    let cert = params.self_signed(key).unwrap();
    (params, cert)
}

/// A serving certificate as the CA issuer signs it: the component's
/// dnsNames, issuer name and signature from the CA.
fn issue_leaf(ca: &CertificateParams, ca_key: &KeyPair) -> (Certificate, KeyPair) {
    let (_, leaf) = certificates();
    let names: Vec<String> = leaf["spec"]["dnsNames"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    assert!(names.iter().any(|n| n == DIALED));
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::new(names).unwrap();
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(90);
    let cert = params
        .signed_by(&key, &Issuer::from_params(ca, ca_key))
        .unwrap();
    (cert, key)
}

/// One TLS handshake on loopback: a server presenting `leaf`, a client
/// trusting only `ca` and dialing [`DIALED`]. Then one byte each way, so
/// both sides finished. The client's error, if any.
fn handshake(leaf: &Certificate, leaf_key: &KeyPair, ca: &Certificate) -> Result<(), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Timeouts only bound a broken test; nothing waits on them.
    let limit = Some(Duration::from_secs(10));
    let server = std::thread::spawn(move || -> Result<(), String> {
        let (mut sock, _) = listener.accept().map_err(|e| e.to_string())?;
        sock.set_read_timeout(limit).map_err(|e| e.to_string())?;
        let mut conn =
            rustls::ServerConnection::new(Arc::new(server_cfg)).map_err(|e| e.to_string())?;
        let mut tls = rustls::Stream::new(&mut conn, &mut sock);
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).map_err(|e| e.to_string())?;
        tls.write_all(&byte).map_err(|e| e.to_string())?;
        tls.flush().map_err(|e| e.to_string())
    });
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(limit).unwrap();
    let name = ServerName::try_from(DIALED).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(client_cfg), name).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    let client = (|| {
        tls.write_all(b"x")?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte)?;
        Ok::<_, std::io::Error>(byte)
    })();
    drop(sock);
    let served = server.join().unwrap();
    match client {
        Ok(byte) => {
            assert_eq!(&byte, b"x");
            served.map_err(|e| format!("client done but the server failed: {e}"))
        }
        Err(e) => Err(e.to_string()),
    }
}

fn subject_key_id(cert: &Certificate) -> Vec<u8> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert.der()).unwrap();
    x509.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
            _ => None,
        })
        .unwrap()
}

/// `rotationPolicy: Never`: the re-issued CA has the same subject, key and
/// SubjectKeyId, so it verifies the leaf signed before it, and the old CA
/// verifies the leaf signed after it. Whichever of caBundle and the pods
/// moves first, every call still verifies.
#[test]
fn a_ca_reissued_with_its_key_keeps_every_call_verifiable_in_both_orders() {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let now = OffsetDateTime::now_utc();
    let (ca1_params, ca1) = issue_ca(&key, 1, now - time::Duration::days(2));
    let (l1, l1_key) = issue_leaf(&ca1_params, &key);
    let (ca2_params, ca2) = issue_ca(&key, 2, now - time::Duration::minutes(5));
    let (l2, l2_key) = issue_leaf(&ca2_params, &key);
    assert_ne!(ca1.der(), ca2.der(), "a new CA certificate");
    assert_eq!(subject_key_id(&ca1), subject_key_id(&ca2));

    for (what, leaf, leaf_key, trusted) in [
        (
            "caBundle flipped first: trusts CA2, pod serves L1",
            &l1,
            &l1_key,
            &ca2,
        ),
        (
            "pod reloaded first: trusts CA1, pod serves L2",
            &l2,
            &l2_key,
            &ca1,
        ),
        ("both moved: trusts CA2, pod serves L2", &l2, &l2_key, &ca2),
        (
            "before the re-issue: trusts CA1, pod serves L1",
            &l1,
            &l1_key,
            &ca1,
        ),
    ] {
        handshake(leaf, leaf_key, trusted).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// The window the setting closes: a CA re-issued with a new key (the
/// default `Always` of cert-manager 1.18 and later) verifies no leaf signed before it, and the
/// old CA verifies no leaf signed after it. Until every pod serves the new
/// leaf, every call that reaches an old one fails TLS, and with
/// `failurePolicy: Ignore` the Node is stored ungated.
#[test]
fn a_ca_reissued_with_a_new_key_fails_every_call_until_the_pods_reload() {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let now = OffsetDateTime::now_utc();
    let (ca1_params, ca1) = issue_ca(&key, 1, now - time::Duration::days(2));
    let (l1, l1_key) = issue_leaf(&ca1_params, &key);
    let new_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let (ca2_params, ca2) = issue_ca(&new_key, 2, now - time::Duration::minutes(5));
    let (l2, l2_key) = issue_leaf(&ca2_params, &new_key);
    assert_ne!(subject_key_id(&ca1), subject_key_id(&ca2));

    for (what, leaf, leaf_key, trusted) in [
        (
            "caBundle flipped first: trusts CA2', pod serves L1",
            &l1,
            &l1_key,
            &ca2,
        ),
        (
            "pod reloaded first: trusts CA1, pod serves L2'",
            &l2,
            &l2_key,
            &ca1,
        ),
    ] {
        let err = handshake(leaf, leaf_key, trusted)
            .err()
            .unwrap_or_else(|| panic!("{what}: the handshake succeeded"));
        // Same issuer name, so the chain is built; the old key's signature
        // does not verify under the new one.
        assert!(
            err.contains("invalid peer certificate: BadSignature"),
            "{what}: {err}"
        );
    }
    // The same setup verifies once both sides moved: the key is the cause.
    handshake(&l2, &l2_key, &ca2).unwrap();
}
