//! Reading a request body within bounds: a size cap, a deadline, and a byte
//! budget shared by every request in flight.

use std::sync::Arc;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How much of an oversized body is kept to find the review's uid: the API
/// server writes `request.uid` within its first hundred bytes.
pub const PREFIX_BYTES: usize = 4096;

/// Bytes of request bodies held at once, across all requests.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
}

impl BodyBudget {
    pub fn new(bytes: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// Bytes not held by any request now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

/// Why a body was not read in full.
#[derive(Debug)]
pub enum BodyError {
    /// Over `max` bytes (declared or received); `prefix` holds its start.
    TooLarge { prefix: Bytes },
    /// Not complete before the deadline.
    Timeout,
    /// The shared budget is spent.
    Busy,
    /// The client broke the body off.
    Broken(axum::Error),
}

/// A body read in full, holding its share of the budget until dropped.
#[derive(Debug)]
pub struct ReadBody {
    pub bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

/// Reads `body` up to `max` bytes, until `deadline`, reserving each chunk
/// from `budget` as it arrives (so bytes are held only once really sent).
/// `declared` is the Content-Length, if any: over `max` the body is refused
/// after reading only its prefix.
pub async fn read(
    body: Body,
    declared: Option<u64>,
    max: usize,
    deadline: Instant,
    budget: &BodyBudget,
) -> Result<ReadBody, BodyError> {
    let too_large = declared.is_some_and(|n| n > max as u64);
    let limit = if too_large { PREFIX_BYTES } else { max };
    match tokio::time::timeout_at(deadline, collect(body, limit, budget)).await {
        Err(_) => Err(BodyError::Timeout),
        Ok(Ok(read)) if too_large => Err(BodyError::TooLarge { prefix: read.bytes }),
        Ok(r) => r,
    }
}

async fn collect(mut body: Body, limit: usize, budget: &BodyBudget) -> Result<ReadBody, BodyError> {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    let mut held: Option<OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Broken)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if len + data.len() > limit {
            let mut prefix = BytesMut::with_capacity(PREFIX_BYTES);
            for c in chunks.iter().chain([&data]) {
                let room = PREFIX_BYTES - prefix.len();
                prefix.extend_from_slice(&c[..c.len().min(room)]);
            }
            return Err(BodyError::TooLarge {
                prefix: prefix.freeze(),
            });
        }
        let n = u32::try_from(data.len()).map_err(|_| BodyError::Busy)?;
        let permit = budget
            .bytes
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| BodyError::Busy)?;
        match &mut held {
            Some(h) => h.merge(permit),
            None => held = Some(permit),
        }
        len += data.len();
        chunks.push(data);
    }
    let bytes = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => {
            let mut all = BytesMut::with_capacity(len);
            for c in &chunks {
                all.extend_from_slice(c);
            }
            all.freeze()
        }
    };
    Ok(ReadBody { bytes, _held: held })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    fn stream(
        parts: Vec<&'static [u8]>,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        futures::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from_static(p))))
    }

    fn chunks(parts: Vec<&'static [u8]>) -> Body {
        Body::from_stream(stream(parts))
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn reads_within_the_cap_and_holds_its_bytes_until_dropped() {
        let budget = BodyBudget::new(100);
        let body = chunks(vec![b"hello ", b"world"]);
        let r = read(body, None, 20, soon(), &budget).await.unwrap();
        assert_eq!(&r.bytes[..], b"hello world");
        assert_eq!(budget.available(), 89);
        drop(r);
        assert_eq!(budget.available(), 100);
    }

    #[tokio::test]
    async fn over_the_cap_keeps_only_the_prefix_and_releases_the_budget() {
        let budget = BodyBudget::new(100);
        let body = chunks(vec![b"0123456789", b"abcdefghij", b"more"]);
        match read(body, None, 15, soon(), &budget).await {
            Err(BodyError::TooLarge { prefix }) => assert_eq!(&prefix[..], b"0123456789abcdefghij"),
            other => panic!("{other:?}"),
        }
        assert_eq!(budget.available(), 100);
        // Declared too large: refused after the prefix only.
        let body = chunks(vec![b"{\"uid\":1}"]);
        match read(body, Some(1 << 30), 15, soon(), &budget).await {
            Err(BodyError::TooLarge { prefix }) => assert_eq!(&prefix[..], b"{\"uid\":1}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_spent_budget_refuses_and_a_stalled_body_times_out() {
        let budget = BodyBudget::new(8);
        let body = chunks(vec![b"0123456789"]);
        assert!(matches!(
            read(body, None, 100, soon(), &budget).await,
            Err(BodyError::Busy)
        ));
        // Three bytes, then nothing more.
        let body = Body::from_stream(stream(vec![b"abc"]).chain(futures::stream::pending()));
        let r = read(
            body,
            None,
            100,
            Instant::now() + Duration::from_millis(50),
            &budget,
        )
        .await;
        assert!(matches!(r, Err(BodyError::Timeout)), "{r:?}");
        assert_eq!(budget.available(), 8);
    }
}
