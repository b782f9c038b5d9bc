//! Raw HTTPS requests to the emulator, for what typed clients hide
//! (status codes of watch streams, `Warning` headers).
//!
//! No upstream counterpart: a test client.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use crate::server::Emulator;
use crate::users;

/// A buffered response.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl RawResponse {
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// The texts of all `Warning: 299 - "..."` headers.
    pub fn warnings(&self) -> Vec<String> {
        self.headers
            .get_all(http::header::WARNING)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .map(|v| {
                let quoted = v.strip_prefix("299 - ").unwrap_or(&v);
                let inner = quoted
                    .strip_prefix('"')
                    .and_then(|q| q.strip_suffix('"'))
                    .unwrap_or(quoted);
                inner.replace("\\\"", "\"").replace("\\\\", "\\")
            })
            .collect()
    }
}

impl Emulator {
    /// One request as `user` (token auth; `None` sends no token), read to the
    /// end — for a watch pass `timeoutSeconds` so the stream ends.
    pub async fn raw(
        &self,
        user: Option<&str>,
        method: &str,
        path_and_query: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<RawResponse> {
        let cfg = crate::tls::client_config_for_bundle(self.ca_pem().as_bytes())
            .map_err(anyhow::Error::msg)?;
        let tcp = tokio::net::TcpStream::connect(self.addr()).await?;
        let tls = tokio_rustls::TlsConnector::from(cfg)
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(http::header::HOST, "localhost")
            .header(http::header::CONTENT_TYPE, content_type);
        if let Some(u) = user {
            req = req.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", users::token(u)),
            );
        }
        let resp = sender
            .send_request(req.body(Full::new(Bytes::from(body)))?)
            .await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(RawResponse {
            status,
            headers,
            body,
        })
    }
}
