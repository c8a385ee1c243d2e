//! What of a large message is kept: the limits that the relay's trimming (the stdio tap's
//! sender) and the observer's `MessageBuf` (every transport) both apply, so they agree on what
//! the observer needs. They live here, below both, because the relay must never import
//! observation; the reasons behind each figure are on the items and in `bench/README.md`
//! ("Large messages").

/// Largest JSON object frame parsed whole, unless it is marked as a catalog (see
/// [`CATALOG_FRAME_BYTES`]). A larger one (a multi-megabyte tool result, a large upload in the
/// arguments) is observed from its first [`SUMMARY_HEAD`] and last [`SUMMARY_TAIL`] bytes (see
/// `crate::observe::summary`); the tap does not even pass its middle on (see `crate::tap`).
///
/// Why not more: until a frame's length is known, the relay holds what it read of it, and a
/// larger bound makes its read blocks outgrow the CPU's cache (measured: `bench/README.md`,
/// "Large messages"). Whatever the observer reads from a message that is not a catalog sits in
/// its first or last few KiB anyway.
pub const WHOLE_FRAME_BYTES: usize = 256 * 1024;

/// Largest JSON object frame parsed whole when its first [`SUMMARY_HEAD`] bytes contain
/// [`CATALOG_MARK`], as a `tools/list` result does (`{"jsonrpc":"2.0","id":1,"result":{"tools":[`,
/// or `{"result":{"tools":[` in the TypeScript SDK's order): the catalog fingerprint
/// (`registryVersion`) and the tool definition hashes (`toolDef`, drift) need the whole page.
/// 1 MiB keeps every ordinary catalog whole. A larger page is not hashed at all: the calls after
/// it carry no `registryVersion`, `toolDef`, `listed` or `hints` until a list is read whole
/// (see `crate::observe::catalog`).
pub const CATALOG_FRAME_BYTES: usize = 1024 * 1024;

/// What marks a frame as a possible catalog page. A false positive (a tool result that mentions
/// the key early) only means the frame is held whole up to [`CATALOG_FRAME_BYTES`], as every
/// frame used to be; a catalog page whose `"tools"` key comes later than [`SUMMARY_HEAD`] bytes
/// in is summarised, and then has no `registryVersion` (one warning), as a page over
/// [`CATALOG_FRAME_BYTES`] has none.
pub const CATALOG_MARK: &[u8] = b"\"tools\"";

/// Bytes kept from the start of a frame larger than [`WHOLE_FRAME_BYTES`].
pub const SUMMARY_HEAD: usize = 16 * 1024;

/// Bytes kept from the end of a frame larger than [`WHOLE_FRAME_BYTES`].
pub const SUMMARY_TAIL: usize = 16 * 1024;

/// Where large JSON object frames start and how much of them is kept; shared by `observe::frame::MessageBuf`
/// (every transport) and the stdio tap's sender so all agree on what the observer needs (tests
/// shrink them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summarize {
    /// Largest object frame held whole.
    pub whole: usize,
    /// Largest object frame held whole when its head holds [`CATALOG_MARK`].
    pub catalog: usize,
    /// Bytes kept from the start of a larger one.
    pub head: usize,
    /// Bytes kept from its end.
    pub tail: usize,
}

/// The limits in use: [`WHOLE_FRAME_BYTES`], [`SUMMARY_HEAD`], [`SUMMARY_TAIL`].
pub const SUMMARIZE: Summarize = Summarize {
    whole: WHOLE_FRAME_BYTES,
    catalog: CATALOG_FRAME_BYTES,
    head: SUMMARY_HEAD,
    tail: SUMMARY_TAIL,
};

/// Do the first `head` bytes of `a` followed by `b` contain [`CATALOG_MARK`]?
pub(crate) fn head_has_mark(a: &[u8], b: &[u8], head: usize) -> bool {
    let a = &a[..a.len().min(head)];
    let b = &b[..b.len().min(head - a.len())];
    let find = |h: &[u8]| memchr::memmem::find(h, CATALOG_MARK).is_some();
    if find(a) || find(b) {
        return true;
    }
    // The mark may straddle the seam between the two.
    let m = CATALOG_MARK.len() - 1;
    let mut seam = [0u8; 2 * (CATALOG_MARK.len() - 1)];
    let left = &a[a.len().saturating_sub(m)..];
    let right = &b[..b.len().min(m)];
    seam[..left.len()].copy_from_slice(left);
    seam[left.len()..left.len() + right.len()].copy_from_slice(right);
    find(&seam[..left.len() + right.len()])
}
