//! A fast reader for AdmissionReviews in the shape the API server sends.
//!
//! serde_json spends ~6 instructions per byte walking a 25 KB Node (images,
//! conditions, managedFields) that nodegate never reads: as much CPU as TLS
//! and HTTP together. Strings are 90 % of those bytes, so this reader first
//! indexes, 64 bytes at a time with SSE2, every byte a string can end or go
//! wrong at (`"`, `\`, control characters, non-ASCII); a string's end is then
//! a bit scan, and only the few bytes between strings are read one by one.
//!
//! It is strict on purpose: whatever it accepts, serde_json accepts with the
//! same result, so bad-input answers never change. Anything unusual — a
//! control character, whitespace between tokens, an escape in a key or
//! in a value nodegate reads, a surrogate `\u` escape, a duplicate field, a
//! struct written as an array, a number where nodegate reads a value, deep
//! nesting — returns `None`, and the caller decodes with serde_json instead.
//! The tests check this against serde_json on fixtures and on many thousand
//! mutations of them.

use std::borrow::Cow;

use kube::core::admission::Operation;
use nodegate_shared::keys::{EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use serde::de::IgnoredAny;

use crate::wire::{Gvk, Meta, Node, NodeInfo, Request, Review, Spec, Status, Taint, UserInfo};

/// Deepest nesting skipped inside one ignored value (serde_json skips any
/// depth; deeper documents go to serde_json).
const MAX_SKIP_DEPTH: u32 = 64;

/// The review in `body`, or `None` when serde_json must decide.
pub(crate) fn review(body: &[u8]) -> Option<Review<'_>> {
    let body = trim_json_whitespace(body);
    let mut c = Cursor {
        b: body,
        bits: special_bits(body),
        i: 0,
        non_ascii: false,
    };
    let review = c.review()?;
    // Strings are scanned as bytes; UTF-8 is checked once, and only when
    // one of them held a byte above ASCII (the API server's Nodes rarely do).
    let utf8 = !c.non_ascii || std::str::from_utf8(body).is_ok();
    (c.i == body.len() && utf8).then_some(review)
}

/// `b` without JSON whitespace around it (`trim_ascii` would also drop form
/// feeds, which serde_json refuses). Between tokens there must be none: the
/// API server writes compact JSON, and anything else goes to serde_json.
fn trim_json_whitespace(mut b: &[u8]) -> &[u8] {
    let ws = |c: &u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r');
    while let [first, rest @ ..] = b
        && ws(first)
    {
        b = rest;
    }
    while let [rest @ .., last] = b
        && ws(last)
    {
        b = rest;
    }
    b
}

/// Stores the first value of a struct field; a second one is a duplicate,
/// which serde's derived structs refuse.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    match slot {
        Some(_) => None,
        None => {
            *slot = Some(value);
            Some(())
        }
    }
}

/// What a string held, besides plain ASCII.
#[derive(Default)]
struct Seen {
    escape: bool,
    non_ascii: bool,
}

/// From `i`, an object key and its colon: the index after the colon.
#[inline(always)]
fn key_end(b: &[u8], bits: &[u64], i: usize, seen: &mut Seen) -> Option<usize> {
    if *b.get(i)? != b'"' {
        return None;
    }
    let i = string_end(b, bits, i + 1, seen)?;
    (*b.get(i)? == b':').then_some(i + 1)
}

/// From just after an opening quote: the index after the closing quote.
/// Escapes are checked as serde_json's `str` decoding checks them
/// (surrogates are left to serde_json); a control character ends the fast
/// path, as serde_json refuses it.
#[inline(always)]
fn string_end(b: &[u8], bits: &[u64], mut i: usize, seen: &mut Seen) -> Option<usize> {
    loop {
        i = next_special(bits, i)?;
        match *b.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => {
                seen.escape = true;
                i = escape_end(b, i)?;
            }
            0x80.. => {
                seen.non_ascii = true;
                i += 1;
            }
            _ => return None,
        }
    }
}

/// The first special byte at or after `i`.
#[inline]
fn next_special(bits: &[u64], i: usize) -> Option<usize> {
    let mut word = i / 64;
    let mut m = *bits.get(word)? & (u64::MAX << (i % 64));
    while m == 0 {
        word += 1;
        m = *bits.get(word)?;
    }
    Some(word * 64 + m.trailing_zeros() as usize)
}

/// One bit per byte of `b` that is special: `"`, `\\`, a control character
/// or above ASCII. Strings are most of a Node's bytes; with this index,
/// finding a string's end is a bit scan instead of a byte loop.
fn special_bits(b: &[u8]) -> Vec<u64> {
    let mut bits = Vec::with_capacity(b.len().div_ceil(64));
    let blocks = b.chunks_exact(64);
    let rest = blocks.remainder();
    bits.extend(blocks.map(|block| <&[u8; 64]>::try_from(block).map_or(0, block_bits)));
    if !rest.is_empty() {
        // Spaces are not special.
        let mut last = [b' '; 64];
        last[..rest.len()].copy_from_slice(rest);
        bits.push(block_bits(&last));
    }
    bits
}

/// The special bytes of a 64-byte block, bit `j` for byte `j`: SSE2, which
/// every x86_64 has.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline]
fn block_bits(block: &[u8; 64]) -> u64 {
    use safe_arch::{
        cmp_eq_mask_i8_m128i, cmp_lt_mask_i8_m128i, load_unaligned_m128i, move_mask_i8_m128i,
        set_splat_i8_m128i,
    };
    let mut bits = 0u64;
    for (k, chunk) in block.chunks_exact(16).enumerate() {
        if let Ok(chunk) = chunk.try_into() {
            let v = load_unaligned_m128i(chunk);
            // Signed: bytes above ASCII are negative, so this finds them too.
            let hits = cmp_lt_mask_i8_m128i(v, set_splat_i8_m128i(0x20))
                | cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'"' as i8))
                | cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'\\' as i8));
            bits |= u64::from(move_mask_i8_m128i(hits) as u16) << (16 * k);
        }
    }
    bits
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline]
fn block_bits(block: &[u8; 64]) -> u64 {
    swar_block_bits(block)
}

/// [`block_bits`] eight bytes at a time, without SIMD.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2"), allow(dead_code))]
fn swar_block_bits(block: &[u8; 64]) -> u64 {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const LOW7: u64 = ONES * 0x7F;
    // The high bit of each zero byte, exactly: no carry crosses bytes
    // (unlike the classic `(v - ONES) & !v`).
    let zero = |v: u64| !(((v & LOW7) + LOW7) | v) & !LOW7;
    let mut bits = 0u64;
    for (k, word) in block.chunks_exact(8).enumerate() {
        if let Ok(word) = word.try_into() {
            let x = u64::from_le_bytes(word);
            // Below 0x20, adding 0x60 to the low 7 bits leaves the top bit clear.
            let control_or_high = x | !((x & LOW7) + ONES * 0x60);
            let high = (zero(x ^ (ONES * u64::from(b'"')))
                | zero(x ^ (ONES * u64::from(b'\\')))
                | control_or_high)
                & !LOW7;
            // Gather the eight high bits into one byte, byte j to bit j.
            let byte = (high >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56;
            bits |= byte << (8 * k);
        }
    }
    bits
}

/// The escape at `i` (a backslash): the index after it.
fn escape_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i + 1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(i + 2),
        b'u' => {
            let mut code = 0u32;
            for &h in b.get(i + 2..i + 6)? {
                code = code << 4 | char::from(h).to_digit(16)?;
            }
            (!(0xD800..0xE000).contains(&code)).then_some(i + 6)
        }
        _ => None,
    }
}

#[inline]
fn literal_end(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    let end = i + word.len();
    (b.get(i..end)? == word).then_some(end)
}

/// The number at `i` in JSON's grammar (as serde_json skips it): the index after it.
fn number_end(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |i: usize| {
        b.get(i..)
            .map_or(0, |r| r.iter().take_while(|d| d.is_ascii_digit()).count())
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match *b.get(i)? {
        b'0' => {
            i += 1;
            if b.get(i).is_some_and(u8::is_ascii_digit) {
                return None;
            }
        }
        b'1'..=b'9' => i += digits(i),
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        let n = digits(i + 1);
        if n == 0 {
            return None;
        }
        i += 1 + n;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let n = digits(i);
        if n == 0 {
            return None;
        }
        i += n;
    }
    Some(i)
}

struct Cursor<'a> {
    b: &'a [u8],
    /// [`special_bits`] of `b`.
    bits: Vec<u64>,
    i: usize,
    /// A string held a byte above ASCII: UTF-8 is checked at the end.
    non_ascii: bool,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.i = literal_end(self.b, self.i, word)?;
        Some(())
    }

    /// After an opening quote: the raw bytes up to the closing quote, and
    /// whether they hold escapes.
    fn string_rest(&mut self) -> Option<(&'a [u8], bool)> {
        let start = self.i;
        let mut seen = Seen::default();
        self.i = string_end(self.b, &self.bits, start, &mut seen)?;
        self.non_ascii |= seen.non_ascii;
        Some((self.b.get(start..self.i - 1)?, seen.escape))
    }

    /// Any string, escapes allowed.
    fn any_string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        self.string_rest().map(drop)
    }

    /// A string without escapes, as raw bytes (object keys are only
    /// compared; UTF-8 is checked for the whole body at the end).
    fn unescaped(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        match self.string_rest()? {
            (raw, false) => Some(raw),
            (_, true) => None,
        }
    }

    /// A string without escapes, borrowed.
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.unescaped()?).ok()
    }

    fn cow(&mut self) -> Option<Cow<'a, str>> {
        self.str().map(Cow::Borrowed)
    }

    /// `null`, or what `f` reads.
    fn nullable<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            self.literal(b"null").map(|()| None)
        } else {
            f(self).map(Some)
        }
    }

    fn opt_str(&mut self) -> Option<Option<Cow<'a, str>>> {
        self.nullable(Self::cow)
    }

    /// An object: `field` is called with each key (never escaped) and must
    /// read its value.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.unescaped()?;
            self.eat(b':')?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Any JSON value, checked and thrown away. One tight loop over the
    /// tokens, with the kind of each open container kept as one bit
    /// (1 = object): this is where almost all of a Node's bytes go.
    fn skip(&mut self) -> Option<()> {
        let b = self.b;
        let bits = &self.bits[..];
        let mut i = self.i;
        let mut objects = 0u64;
        let mut depth = 0u32;
        let mut seen = Seen::default();
        loop {
            // A value: most are strings.
            let c = *b.get(i)?;
            if c == b'"' {
                i = string_end(b, bits, i + 1, &mut seen)?;
            } else if c == b'{' || c == b'[' {
                // `}` and `]` follow their openers by 2.
                if *b.get(i + 1)? == c + 2 {
                    i += 2;
                } else {
                    depth += 1;
                    if depth > MAX_SKIP_DEPTH {
                        return None;
                    }
                    objects = objects << 1 | u64::from(c == b'{');
                    i += 1;
                    if c == b'{' {
                        i = key_end(b, bits, i, &mut seen)?;
                    }
                    continue;
                }
            } else {
                i = match c {
                    b't' => literal_end(b, i, b"true")?,
                    b'f' => literal_end(b, i, b"false")?,
                    b'n' => literal_end(b, i, b"null")?,
                    b'-' | b'0'..=b'9' => number_end(b, i)?,
                    _ => return None,
                };
            }
            // Close what is complete, then a comma (and a key) or the end.
            loop {
                if depth == 0 {
                    self.i = i;
                    self.non_ascii |= seen.non_ascii;
                    return Some(());
                }
                let in_object = objects & 1 == 1;
                match *b.get(i)? {
                    b',' => {
                        i += 1;
                        if in_object {
                            i = key_end(b, bits, i, &mut seen)?;
                        }
                        break;
                    }
                    b'}' if in_object => {}
                    b']' if !in_object => {}
                    _ => return None,
                }
                i += 1;
                objects >>= 1;
                depth -= 1;
            }
        }
    }

    fn review(&mut self) -> Option<Review<'a>> {
        let (mut api_version, mut kind, mut request) = (None, None, None);
        self.object(|c, key| match key {
            b"apiVersion" => once(&mut api_version, c.cow()?),
            b"kind" => once(&mut kind, c.cow()?),
            b"request" => once(&mut request, c.nullable(Self::request)?),
            _ => c.skip(),
        })?;
        Some(Review {
            api_version: api_version?,
            kind: kind?,
            request: request.flatten(),
        })
    }

    fn request(&mut self) -> Option<Request<'a>> {
        let mut uid = None;
        let mut kind = None;
        let mut resource = None;
        let mut sub_resource = None;
        let mut name = None;
        let mut operation = None;
        let mut user_info = None;
        let mut object = None;
        let mut old_object = None;
        let mut dry_run = None;
        self.object(|c, key| match key {
            b"uid" => once(&mut uid, c.cow()?),
            b"kind" => once(&mut kind, c.gvk()?),
            b"resource" => once(&mut resource, c.skip()?),
            b"subResource" => once(&mut sub_resource, c.opt_str()?),
            b"name" => once(&mut name, c.cow()?),
            b"operation" => once(&mut operation, c.operation()?),
            b"userInfo" => once(&mut user_info, c.user_info()?),
            b"object" => once(&mut object, c.nullable(Self::node)?),
            b"oldObject" => once(&mut old_object, c.nullable(Self::node)?),
            b"dryRun" => once(&mut dry_run, c.bool()?),
            _ => c.skip(),
        })?;
        resource?;
        Some(Request {
            uid: uid?,
            kind: kind?,
            resource: IgnoredAny,
            sub_resource: sub_resource.flatten(),
            name: name.unwrap_or_default(),
            operation: operation?,
            user_info: user_info?,
            object: object.flatten(),
            old_object: old_object.flatten(),
            dry_run: dry_run.unwrap_or_default(),
        })
    }

    fn bool(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|()| true),
            b'f' => self.literal(b"false").map(|()| false),
            _ => None,
        }
    }

    fn operation(&mut self) -> Option<Operation> {
        Some(match self.str()? {
            "CREATE" => Operation::Create,
            "UPDATE" => Operation::Update,
            "DELETE" => Operation::Delete,
            "CONNECT" => Operation::Connect,
            _ => return None,
        })
    }

    fn gvk(&mut self) -> Option<Gvk<'a>> {
        let (mut group, mut version, mut kind) = (None, None, None);
        self.object(|c, key| match key {
            b"group" => once(&mut group, c.cow()?),
            b"version" => once(&mut version, c.cow()?),
            b"kind" => once(&mut kind, c.cow()?),
            _ => c.skip(),
        })?;
        Some(Gvk {
            group: group?,
            version: version?,
            kind: kind?,
        })
    }

    /// An object of which only the field `name` is read (once, as in a
    /// derived struct); the rest is skipped.
    fn one_field<T>(
        &mut self,
        name: &[u8],
        mut read: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Option<T>> {
        let mut value = None;
        self.object(|c, key| {
            if key == name {
                once(&mut value, read(c)?)
            } else {
                c.skip()
            }
        })?;
        Some(value)
    }

    fn user_info(&mut self) -> Option<UserInfo<'a>> {
        let username = self.one_field(b"username", Self::opt_str)?;
        Some(UserInfo {
            username: username.flatten(),
        })
    }

    fn node(&mut self) -> Option<Node<'a>> {
        let (mut metadata, mut spec, mut status) = (None, None, None);
        self.object(|c, key| match key {
            b"metadata" => once(&mut metadata, c.meta()?),
            b"spec" => once(&mut spec, c.nullable(Self::spec)?),
            b"status" => once(&mut status, c.nullable(Self::status)?),
            _ => c.skip(),
        })?;
        Some(Node {
            metadata: metadata.unwrap_or_default(),
            spec: spec.flatten(),
            status: status.flatten(),
        })
    }

    fn meta(&mut self) -> Option<Meta<'a>> {
        let (mut name, mut resource_version, mut exclude, mut ready_boot_id) =
            (None, None, None, None);
        self.object(|c, key| match key {
            b"name" => once(&mut name, c.opt_str()?),
            b"resourceVersion" => once(&mut resource_version, c.opt_str()?),
            b"labels" => once(&mut exclude, c.nullable(|c| c.pick(EXCLUDE_LABEL))?),
            b"annotations" => once(
                &mut ready_boot_id,
                c.nullable(|c| c.pick(READY_BOOT_ID_ANNOTATION))?,
            ),
            _ => c.skip(),
        })?;
        Some(Meta {
            name: name.flatten(),
            resource_version: resource_version.flatten(),
            exclude: exclude.flatten().flatten(),
            ready_boot_id: ready_boot_id.flatten().flatten(),
        })
    }

    /// The value under `wanted` in a map of strings; the last one wins, as
    /// in a map.
    fn pick(&mut self, wanted: &str) -> Option<Option<Cow<'a, str>>> {
        let mut found = None;
        self.object(|c, key| {
            if key == wanted.as_bytes() {
                found = Some(c.cow()?);
                Some(())
            } else {
                c.any_string()
            }
        })?;
        Some(found)
    }

    fn spec(&mut self) -> Option<Spec<'a>> {
        let taints = self.one_field(b"taints", |c| c.nullable(Self::taints))?;
        Some(Spec {
            taints: taints.flatten(),
        })
    }

    fn taints(&mut self) -> Option<Vec<Taint<'a>>> {
        self.eat(b'[')?;
        let mut taints = Vec::new();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(taints);
        }
        loop {
            taints.push(self.taint()?);
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(taints);
                }
                _ => return None,
            }
        }
    }

    /// One taint entry: an object's `key` and `effect` when they are
    /// strings; any other entry matches nothing. Numbers go to serde_json,
    /// which may refuse them as out of range.
    fn taint(&mut self) -> Option<Taint<'a>> {
        match self.peek()? {
            b'{' => {
                let mut taint = Taint::default();
                self.object(|c, key| match key {
                    b"key" => c.maybe_str().map(|v| taint.key = v),
                    b"effect" => c.maybe_str().map(|v| taint.effect = v),
                    _ => c.skip(),
                })?;
                Some(taint)
            }
            b'-' | b'0'..=b'9' => None,
            _ => self.skip().map(|()| Taint::default()),
        }
    }

    /// A string's text, or `None` for another value that is not a number.
    fn maybe_str(&mut self) -> Option<Option<Cow<'a, str>>> {
        match self.peek()? {
            b'"' => self.cow().map(Some),
            b'-' | b'0'..=b'9' => None,
            _ => self.skip().map(|()| None),
        }
    }

    fn status(&mut self) -> Option<Status<'a>> {
        let node_info = self.one_field(b"nodeInfo", |c| c.nullable(Self::node_info))?;
        Some(Status {
            node_info: node_info.flatten(),
        })
    }

    fn node_info(&mut self) -> Option<NodeInfo<'a>> {
        let boot_id = self.one_field(b"bootID", Self::opt_str)?;
        Some(NodeInfo {
            boot_id: boot_id.flatten(),
        })
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    use super::*;
    use crate::fixtures::{
        kubelet_create, kubelet_node, node_controller_update_after_reboot, review as fixture,
        with_annotation, with_taints,
    };

    /// What serde_json makes of `body`, in the same terms.
    fn by_serde(body: &[u8]) -> Option<String> {
        serde_json::from_slice::<Review<'_>>(body)
            .ok()
            .map(|r| format!("{r:?}"))
    }

    /// The property: whatever the fast reader accepts, serde_json accepts,
    /// with the same result. Returns whether the fast reader accepted.
    fn agrees(body: &[u8]) -> bool {
        match review(body) {
            Some(fast) => {
                let fast = format!("{fast:?}");
                assert_eq!(
                    by_serde(body).as_deref(),
                    Some(fast.as_str()),
                    "fast reader accepted what serde_json reads otherwise: {}",
                    String::from_utf8_lossy(body)
                );
                true
            }
            None => false,
        }
    }

    fn bodies() -> Vec<Vec<u8>> {
        let node = kubelet_node("n1", "boot-2", 3);
        let odd = with_taints(
            with_annotation(node.clone(), "note", "caf\u{e9} \"quoted\" \\ /"),
            json!([{"key": "a", "effect": "NoSchedule", "value": "x"}, "junk", null, true, [1, {"k": -0.5e-3}],
                   {"key": {"x": [1, 2]}, "effect": null, "timeAdded": null}]),
        );
        [
            kubelet_create("uid-1", "n1"),
            node_controller_update_after_reboot("uid-2", "n1"),
            fixture(
                "uid-3",
                "UPDATE",
                Some("status"),
                "system:node:n1",
                node.clone(),
                Some(node),
                true,
            ),
            fixture("uid-4", "CREATE", None, "u", odd, None, false),
        ]
        .iter()
        .map(|v| serde_json::to_vec(v).unwrap())
        .collect()
    }

    #[test]
    fn reads_the_api_servers_reviews_as_serde_json_does() {
        for body in bodies() {
            assert!(agrees(&body), "{}", String::from_utf8_lossy(&body));
            // Go's encoder ends a document with a newline.
            let mut nl = body.clone();
            nl.push(b'\n');
            assert!(agrees(&nl));
            // Whitespace between tokens (never sent by the API server) is
            // left to serde_json.
            let spaced = String::from_utf8(body).unwrap().replace("\":", "\" : ");
            assert!(!agrees(spaced.as_bytes()));
            assert!(by_serde(spaced.as_bytes()).is_some());
        }
    }

    /// Inputs the fast reader must leave to serde_json, whether serde_json
    /// accepts them (pretty-printed, escaped keys, deep nesting) or not.
    #[test]
    fn leaves_the_unusual_to_serde_json() {
        let base = String::from_utf8(bodies().remove(0)).unwrap();
        let pretty = serde_json::to_string_pretty(&kubelet_create("u", "n1")).unwrap();
        let deep = base.replacen(
            "\"options\":",
            &format!(
                "\"deep\":{}1{},\"options\":",
                "[".repeat(70),
                "]".repeat(70)
            ),
            1,
        );
        let cases: Vec<(&str, String)> = vec![
            ("pretty-printed", pretty),
            (
                "escaped key",
                base.replacen("\"uid\":", "\"ui\\u0064\":", 1),
            ),
            (
                "escaped value read",
                base.replacen("\"uid-1\"", "\"uid\\u002d1\"", 1),
            ),
            (
                "surrogate escape",
                base.replacen("\"amd64\"", "\"\\ud83d\\ude00\"", 1),
            ),
            (
                "lone surrogate",
                base.replacen("\"amd64\"", "\"\\ud83d\"", 1),
            ),
            (
                "duplicate field",
                base.replacen("\"uid\":", "\"uid\":\"x\",\"uid\":", 1),
            ),
            (
                "struct as array",
                base.replacen(
                    "{\"group\":\"\",\"kind\":\"Node\",\"version\":\"v1\"}",
                    "[\"\",\"v1\",\"Node\"]",
                    1,
                ),
            ),
            (
                "number as taint key",
                base.replacen(
                    "\"key\":\"node.kubernetes.io/not-ready\"",
                    "\"key\":1e999",
                    1,
                ),
            ),
            ("deep nesting", deep),
            ("form feed before", format!("\u{c}{base}")),
            ("tab between tokens", base.replacen(",", ",\t", 1)),
            (
                "raw control character",
                base.replacen("amd64", "amd\u{1}64", 1),
            ),
            ("trailing garbage", format!("{base}x")),
            ("two documents", format!("{base}{base}")),
            (
                "operation as map",
                base.replacen("\"CREATE\"", "{\"CREATE\":null}", 1),
            ),
            (
                "null metadata",
                base.replacen("\"metadata\":{", "\"metadata\":null,\"x\":{", 1),
            ),
        ];
        for (name, body) in cases {
            assert!(!agrees(body.as_bytes()), "{name}: fast reader accepted");
        }
        // Invalid UTF-8 in a string serde_json skips: serde_json does not
        // look, the fast reader refuses.
        let mut bad = base.clone().into_bytes();
        let at = base.find("amd64").unwrap();
        bad[at] = 0xff;
        assert!(!agrees(&bad));
    }

    /// The property on many thousand mutations of real reviews: byte
    /// flips, insertions, deletions, duplicated and dropped ranges, with
    /// bytes that matter to JSON.
    #[test]
    fn never_accepts_what_serde_json_reads_otherwise() {
        const ALPHABET: &[u8] =
            b"{}[]:,\" \\/\t\n\r\x0c\x00\x1f\x7f\x80\xc3\xa9\xff0123456789-+.eEnultrfasxbu";
        let small = [
            fixture(
                "u-1",
                "CREATE",
                None,
                "system:node:n1",
                with_taints(
                    kubelet_node("n1", "b", 1),
                    json!([{"key": "k", "effect": "NoSchedule"}, 5]),
                ),
                None,
                false,
            ),
            fixture(
                "u-2",
                "UPDATE",
                None,
                "x",
                with_annotation(
                    kubelet_node("n1", "b", 1),
                    "nodegate.dev/ready-boot-id",
                    "a",
                ),
                Some(kubelet_node("n1", "b", 0)),
                true,
            ),
            // Escapes and non-ASCII in skipped strings, odd taint entries.
            fixture(
                "u-3",
                "CREATE",
                None,
                "y",
                with_taints(
                    with_annotation(kubelet_node("n1", "b", 0), "n", "\u{e9}\"\\/\u{1F600}"),
                    json!([{"key": "a", "effect": "NoSchedule"}, "s", null, [true, {"k": -1.5e3}]]),
                ),
                None,
                false,
            ),
        ]
        .map(|v| serde_json::to_vec(&v).unwrap());
        // NODEGATE_SCAN_MUTATIONS / NODEGATE_SCAN_SEED run more or other
        // cases (best with `cargo test --release`).
        let env = |name: &str| std::env::var(name).ok().and_then(|n| n.parse::<u64>().ok());
        let rounds = env("NODEGATE_SCAN_MUTATIONS").map_or(30_000, |n| n as usize);
        let seed = env("NODEGATE_SCAN_SEED").unwrap_or(0x6e6f_6465_6761_7465);
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut fast, mut serde_ok, mut total) = (0, 0, 0);
        for round in 0..rounds {
            let mut body = small[round % small.len()].clone();
            for _ in 0..rng.random_range(1..=3) {
                let at = rng.random_range(0..body.len());
                match rng.random_range(0..6) {
                    0 | 1 => body[at] = ALPHABET[rng.random_range(0..ALPHABET.len())],
                    2 => body.insert(at, ALPHABET[rng.random_range(0..ALPHABET.len())]),
                    3 => {
                        body.remove(at);
                    }
                    4 => {
                        let end = (at + rng.random_range(1..40)).min(body.len());
                        let copy = body[at..end].to_vec();
                        let to = rng.random_range(0..body.len());
                        body.splice(to..to, copy);
                    }
                    _ => {
                        let end = (at + rng.random_range(1..40)).min(body.len());
                        body.drain(at..end);
                    }
                }
            }
            total += 1;
            serde_ok += usize::from(by_serde(&body).is_some());
            fast += usize::from(agrees(&body));
        }
        eprintln!("mutations: {total}, serde_json read {serde_ok}, fast reader {fast}");
        // The mutations reach both sides of the property.
        assert!(
            fast > total / 20,
            "fast reader accepted only {fast} of {total}"
        );
        assert!(serde_ok > fast, "{serde_ok} vs {fast}");
    }

    /// The portable scanner finds exactly what the SSE2 one finds, so
    /// non-x86 builds read the same.
    #[test]
    fn portable_and_simd_indexes_agree() {
        let naive = |b: &[u8; 64]| {
            b.iter().enumerate().fold(0u64, |m, (j, &c)| {
                m | u64::from(matches!(c, b'"' | b'\\' | ..0x20 | 0x80..)) << j
            })
        };
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let mut block = [0u8; 64];
            for c in &mut block {
                *c = match rng.random_range(0..4) {
                    0 => rng.random(),
                    1 => b"\"\\ \x1f\x20\x7f\x80"[rng.random_range(0..7)],
                    _ => rng.random_range(0x20..0x7f),
                };
            }
            assert_eq!(swar_block_bits(&block), naive(&block), "{block:?}");
            assert_eq!(block_bits(&block), naive(&block), "{block:?}");
        }
    }
}
