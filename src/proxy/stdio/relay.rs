//! The two relay loops: read a chunk, write it onward at once, then offer a copy to the tap.
//!
//! Owns the hot path. In: a readable and a writable descriptor, an optional tap slot. Out: the
//! same bytes on the other side, unchanged and in order, and one [`Note`] when the loop ends.
//! A loop holds exactly one fixed [`READ_BUF`] buffer for its whole life (nothing grows, so
//! nothing oversized is kept), writes with `write_all` on an unbuffered descriptor (no
//! `BufWriter`, no `LineWriter` holding a partial line), and copies only when observed.
//! Must never parse, log per chunk, allocate when unobserved, or wait on the observer.

use std::fs::File;
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::READ_BUF;
use crate::tap::TapSender;

/// What a relay loop (or the waiter) tells the session when it is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Our stdin reached EOF (or failed): the client closed; the child's stdin is now closed.
    ClientEof,
    /// Writing to our stdout failed (EPIPE): the client is gone. The child's stdout is closed.
    ClientGone,
    /// The child's stdout reached EOF and everything read from it was written to our stdout.
    ServerEof,
    /// The child exited (not yet reaped).
    ChildExited,
}

/// One direction's tap sender, shared with the session so it can close the tap even when the
/// relay thread is stuck in a read that will never return (the abandoned stdin reader): the
/// observer only finishes once every sender is gone.
pub struct TapSlot(Mutex<Option<TapSender>>);

impl TapSlot {
    pub fn new(tx: TapSender) -> Arc<Self> {
        Arc::new(TapSlot(Mutex::new(Some(tx))))
    }

    fn offer(&self, seen: Instant, chunk: &[u8]) {
        // Uncontended except at the very end of the session; try_send inside never blocks.
        if let Ok(mut guard) = self.0.lock() {
            if let Some(tx) = guard.as_mut() {
                tx.offer(seen, Bytes::copy_from_slice(chunk));
            }
        }
    }

    /// Announces that bytes were read and are about to be forwarded (see `TapSender::begin`).
    fn begin(&self) {
        if let Ok(guard) = self.0.lock() {
            if let Some(tx) = guard.as_ref() {
                tx.begin();
            }
        }
    }

    /// The announced bytes will not be offered.
    fn settle(&self) {
        if let Ok(guard) = self.0.lock() {
            if let Some(tx) = guard.as_ref() {
                tx.settle();
            }
        }
    }

    /// Sends this direction's EOF marker and drops the sender. Idempotent.
    pub fn close(&self, seen: Instant) {
        let tx = match self.0.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(tx) = tx {
            tx.close(seen);
        }
    }
}

/// Waits until `fd` is ready, for descriptors a client handed us in non-blocking mode.
fn wait_ready<F: AsFd>(fd: &F, flags: PollFlags) {
    let mut fds = [PollFd::new(fd.as_fd(), flags)];
    let _ = poll(&mut fds, PollTimeout::NONE);
}

/// `read` that retries EINTR and waits out EAGAIN. `Ok(0)` is EOF.
fn read_chunk<R: Read + AsFd>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => wait_ready(r, PollFlags::POLLIN),
            other => return other,
        }
    }
}

/// `write_all` that also waits out EAGAIN (std's `write_all` gives up on it).
fn write_chunk<W: Write + AsFd>(w: &mut W, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match w.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => wait_ready(w, PollFlags::POLLOUT),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Client → server: our stdin into the child's stdin. On our EOF it closes the child's stdin
/// (dropping it) and reports [`Note::ClientEof`]. If the child closes its stdin first, it keeps
/// reading ours and discards (as a server that stopped reading would leave the client writing
/// into a pipe; blocking the client instead could deadlock it against its own reader).
pub fn client_to_server<W: Write + AsFd>(
    mut input: File,
    output: W,
    tap: Option<Arc<TapSlot>>,
    notes: Sender<Note>,
) {
    let mut buf = vec![0u8; READ_BUF].into_boxed_slice();
    let mut output = Some(output);
    loop {
        let n = match read_chunk(&mut input, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let seen = Instant::now();
        let Some(out) = output.as_mut() else {
            continue;
        };
        if let Some(tap) = &tap {
            tap.begin();
        }
        if write_chunk(out, &buf[..n]).is_err() {
            output = None;
            if let Some(tap) = &tap {
                tap.settle();
            }
            continue;
        }
        if let Some(tap) = &tap {
            tap.offer(seen, &buf[..n]);
        }
    }
    drop(output);
    if let Some(tap) = &tap {
        tap.close(Instant::now());
    }
    let _ = notes.send(Note::ClientEof);
}

/// Server → client: the child's stdout onto ours. Ends at the child's EOF with every byte
/// written ([`Note::ServerEof`]), or when our stdout breaks ([`Note::ClientGone`]); then it
/// drops the child's stdout so the server sees the same broken pipe it would see unwrapped.
pub fn server_to_client<R: Read + AsFd>(
    mut input: R,
    mut output: File,
    tap: Option<Arc<TapSlot>>,
    notes: Sender<Note>,
) {
    let mut buf = vec![0u8; READ_BUF].into_boxed_slice();
    let note = loop {
        let n = match read_chunk(&mut input, &mut buf) {
            Ok(0) | Err(_) => break Note::ServerEof,
            Ok(n) => n,
        };
        let seen = Instant::now();
        if let Some(tap) = &tap {
            tap.begin();
        }
        if write_chunk(&mut output, &buf[..n]).is_err() {
            if let Some(tap) = &tap {
                tap.settle();
            }
            break Note::ClientGone;
        }
        if let Some(tap) = &tap {
            tap.offer(seen, &buf[..n]);
        }
    };
    drop(input);
    if let Some(tap) = &tap {
        tap.close(Instant::now());
    }
    let _ = notes.send(note);
}
