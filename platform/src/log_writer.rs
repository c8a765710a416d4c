//! The thread that writes the log: code that logs appends its line to a queue and goes on;
//! the thread writes the queued lines out in batches.
//!
//! Why a thread: a write to stderr blocks while its reader is not reading (a full pipe: a
//! stalled log shipper, a paused terminal), and every service runs its calls on one thread,
//! so a blocking write would stop every call. The queue is bounded: when it is full, new
//! lines are dropped and counted ([`LogWriter::dropped_lines`]) instead of waited for.
//!
//! Why batches: handing each line to a sleeping thread wakes it, a system call and a switch
//! of threads per line on cores the services need. Here only the first line queued after the
//! writer took the last batch wakes it, and the writer writes at most once every [`GATHER`]:
//! a line after a quiet spell is written at once, and the lines that come while a write is
//! recent wait for the rest of [`GATHER`] and go out together with one `write`. A busy
//! service thus costs a few hundred wake-ups and writes a second, however many lines it
//! logs, and an idle one none.
//!
//! Crash points: the queue lives in memory. A process that ends normally writes it out
//! ([`LogWriter`]'s drop); a crash (SIGKILL, an abort) loses what was queued: up to
//! [`GATHER`] of lines, or the whole queue if the reader had stalled.

use std::{
    io::{self, Write},
    mem,
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use tracing_subscriber::fmt::MakeWriter;

/// The shortest time between two writes: the longest a line may wait before it is
/// written, and what a crash may lose of a healthy log.
pub const GATHER: Duration = Duration::from_millis(5);

/// A batch buffer that grew past this (a burst of long lines) is given back once written,
/// so the two buffers do not keep a burst's size for the life of the process.
const KEEP_CAPACITY: usize = 1 << 20;

/// How much may wait for the writer before new lines are dropped: whichever is reached
/// first.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub lines: usize,
    pub bytes: usize,
}

/// Lines queued and not yet taken by the writer, whether the process is stopping, and
/// whether the writer is gone (stopped, or died), so that nothing queued would be written.
#[derive(Default)]
struct Queue {
    bytes: Vec<u8>,
    lines: usize,
    stopping: bool,
    writer_gone: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when the first line enters an empty queue, and when the process stops.
    wake: Condvar,
    /// Signalled when the process stops: cuts a gather short. (Not `wake`, which each
    /// batch's first line signals, so that a gather is not woken by its own lines.)
    stop: Condvar,
    /// Lines dropped: the queue was full, the writer was gone, or writing them failed.
    dropped: AtomicU64,
    limits: Limits,
    gather: Duration,
}

/// Marks the writer gone when its thread ends, however it ends.
struct WriterGone(Arc<Shared>);

impl Drop for WriterGone {
    fn drop(&mut self) {
        self.0.queue().writer_gone = true;
    }
}

impl Shared {
    /// Nothing panics while holding the lock, so a poisoned lock still holds a whole queue.
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, line: &[u8]) {
        let mut queue = self.queue();
        let full = queue.lines >= self.limits.lines
            || (queue.lines > 0 && queue.bytes.len() + line.len() > self.limits.bytes);
        if full || queue.writer_gone {
            drop(queue);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let first = queue.lines == 0;
        queue.bytes.extend_from_slice(line);
        queue.lines += 1;
        drop(queue);
        if first {
            self.wake.notify_one();
        }
    }

    /// The writer thread: waits for a line, lets more gather while the last write is recent,
    /// writes them all at once. Returns once the process stops and the queue is written out.
    fn write_lines(&self, out: &mut dyn Write) {
        // Two buffers swapped back and forth: a busy log allocates nothing.
        let mut batch = Vec::new();
        let mut last_write: Option<Instant> = None;
        loop {
            let mut queue = self.queue();
            while queue.lines == 0 && !queue.stopping {
                queue = self
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if queue.lines == 0 {
                return;
            }
            let since = last_write.map_or(self.gather, |at| at.elapsed());
            if since < self.gather {
                queue = self
                    .stop
                    .wait_timeout_while(queue, self.gather - since, |queue| !queue.stopping)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            mem::swap(&mut queue.bytes, &mut batch);
            let lines = mem::take(&mut queue.lines);
            drop(queue);
            // A reader that went away (EPIPE) or a full disk: the batch's lines are counted
            // as dropped (some may have been written before the error); later ones are
            // tried again.
            if out.write_all(&batch).and_then(|()| out.flush()).is_err() {
                self.dropped.fetch_add(lines as u64, Ordering::Relaxed);
            }
            last_write = Some(Instant::now());
            if batch.capacity() > KEEP_CAPACITY {
                batch = Vec::new();
            } else {
                batch.clear();
            }
        }
    }
}

/// Where the log's lines go: give it to `tracing_subscriber::fmt::layer().with_writer`.
/// Each `write` is one line (the fmt layer writes each event with one `write_all`).
#[derive(Clone)]
pub struct Lines(Arc<Shared>);

impl<'a> MakeWriter<'a> for Lines {
    type Writer = &'a Lines;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Write for &Lines {
    /// Queues the line, or drops and counts it when the queue is full; never blocks on the
    /// reader, never fails.
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        self.0.push(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// Lines dropped so far: the queue was full, or writing them failed.
    pub fn dropped_lines(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }
}

/// The running writer thread. Dropping it writes out the queued lines and stops the thread,
/// waiting at most `final_write` for a reader that does not read.
#[must_use = "dropping it stops the log writer"]
pub struct LogWriter {
    shared: Arc<Shared>,
    finished: mpsc::Receiver<()>,
    final_write: Duration,
}

impl LogWriter {
    /// Starts the thread `log-writer` writing to `out`, with room for `limits` of queued
    /// lines, a write at most every `gather` ([`GATHER`]).
    pub fn start(
        out: impl Write + Send + 'static,
        limits: Limits,
        gather: Duration,
        final_write: Duration,
    ) -> io::Result<(Self, Lines)> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            stop: Condvar::new(),
            dropped: AtomicU64::new(0),
            limits,
            gather,
        });
        let (done, finished) = mpsc::channel();
        let writer = Arc::clone(&shared);
        let mut out = out;
        thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || {
                {
                    // The writer is marked gone (also when it panics) before a stopping
                    // process stops waiting for it: a line logged after that is counted,
                    // not queued for no one.
                    let _gone = WriterGone(Arc::clone(&writer));
                    writer.write_lines(&mut out);
                }
                let _ = done.send(());
            })?;
        let lines = Lines(Arc::clone(&shared));
        let writer = Self {
            shared,
            finished,
            final_write,
        };
        Ok((writer, lines))
    }
}

impl Drop for LogWriter {
    /// A reader that does not read keeps the writer in `write` for good; the process stops
    /// waiting for it after `final_write` and the lines still queued are lost. Lines logged
    /// once the writer is gone are dropped and counted.
    fn drop(&mut self) {
        self.shared.queue().stopping = true;
        self.shared.wake.notify_one();
        self.shared.stop.notify_one();
        let _ = self.finished.recv_timeout(self.final_write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer's destination that records each `write_all` it is given as one batch, and
    /// can hold the writer inside its first write until the test lets it go.
    #[derive(Clone)]
    struct Sink {
        batches: Arc<Mutex<Vec<Vec<u8>>>>,
        first_write: Option<Hold>,
        fail: bool,
        panic: bool,
        /// Told after each write.
        written: Option<mpsc::Sender<()>>,
    }

    /// The sink's side of a held first write.
    #[derive(Clone)]
    struct Hold {
        entered: mpsc::SyncSender<()>,
        release: Arc<Mutex<mpsc::Receiver<()>>>,
    }

    /// The test's side: learns when the writer is inside its first write, and lets it go.
    struct Held {
        entered: mpsc::Receiver<()>,
        release: mpsc::SyncSender<()>,
    }

    impl Sink {
        /// A sink whose first write waits until the test lets it go (or drops [`Held`]).
        fn holding_its_first_write() -> (Self, Held) {
            let (entered, entered_rx) = mpsc::sync_channel(1);
            let (release, release_rx) = mpsc::sync_channel(1);
            let hold = Hold {
                entered,
                release: Arc::new(Mutex::new(release_rx)),
            };
            let held = Held {
                entered: entered_rx,
                release,
            };
            let sink = Self {
                first_write: Some(hold),
                ..Self::new()
            };
            (sink, held)
        }

        fn new() -> Self {
            Self {
                batches: Arc::default(),
                first_write: None,
                fail: false,
                panic: false,
                written: None,
            }
        }

        fn batches(&self) -> Vec<String> {
            let batches = self.batches.lock().unwrap();
            batches
                .iter()
                .map(|batch| String::from_utf8(batch.clone()).unwrap())
                .collect()
        }
    }

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if let Some(hold) = self.first_write.take() {
                hold.entered.send(()).unwrap();
                // Err once the test dropped its sender: let go either way.
                let _ = hold.release.lock().unwrap().recv();
            }
            if self.fail {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            assert!(!self.panic, "the sink panics");
            self.batches.lock().unwrap().push(bytes.to_vec());
            if let Some(written) = &self.written {
                let _ = written.send(());
            }
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Room for `lines` lines, whatever their size.
    fn room_for(lines: usize) -> Limits {
        Limits {
            lines,
            bytes: usize::MAX,
        }
    }

    fn log(lines: &Lines, text: &str) {
        let mut writer = lines.make_writer();
        writer.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn lines_queued_when_the_process_stops_are_written_in_order() {
        let sink = Sink::new();
        let (writer, lines) =
            LogWriter::start(sink.clone(), room_for(100), GATHER, Duration::from_secs(10)).unwrap();
        for n in 0..50 {
            log(&lines, &format!("line {n}\n"));
        }
        drop(writer);
        let expected: String = (0..50).map(|n| format!("line {n}\n")).collect();
        assert_eq!(sink.batches().concat(), expected);
        assert_eq!(lines.dropped_lines(), 0);
    }

    /// A line is written while the process goes on, not only when it stops: each line
    /// here arrives when the writer has gone back to waiting for the next.
    #[test]
    fn a_line_logged_after_a_quiet_spell_is_written_while_the_process_runs() {
        let (written, writes) = mpsc::channel();
        let mut sink = Sink::new();
        sink.written = Some(written);
        let (_writer, lines) =
            LogWriter::start(sink.clone(), room_for(100), GATHER, Duration::from_secs(10)).unwrap();
        for n in 0..5 {
            log(&lines, &format!("line {n}\n"));
            writes
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("line {n} not written within 10 s"));
        }
        let expected: String = (0..5).map(|n| format!("line {n}\n")).collect();
        assert_eq!(sink.batches().concat(), expected);
    }

    /// Writes are at least a gather apart (an hour here): a line after a quiet spell is
    /// written at once, the lines that follow a recent write wait, and go out together
    /// (here at the stop).
    #[test]
    fn lines_that_follow_a_recent_write_wait_and_go_out_together() {
        let (written, writes) = mpsc::channel();
        let mut sink = Sink::new();
        sink.written = Some(written);
        let hour = Duration::from_secs(3600);
        let (writer, lines) =
            LogWriter::start(sink.clone(), room_for(100), hour, Duration::from_secs(10)).unwrap();
        log(&lines, "after a quiet spell\n");
        writes
            .recv_timeout(Duration::from_secs(10))
            .expect("a line after a quiet spell is written at once");
        log(&lines, "right after a write\n");
        assert!(
            writes.recv_timeout(Duration::from_millis(200)).is_err(),
            "written though the last write is recent"
        );
        log(&lines, "and another\n");
        drop(writer);
        assert_eq!(
            sink.batches(),
            [
                "after a quiet spell\n",
                "right after a write\nand another\n"
            ]
        );
    }

    /// The point of the batches: lines that arrive while the writer is busy are written with
    /// one `write`, not one each. The sink holds the writer in its first write while 999
    /// more lines are queued, so the count of writes is exact.
    #[test]
    fn lines_queued_while_the_writer_writes_go_out_in_one_write() {
        let (sink, held) = Sink::holding_its_first_write();
        let (writer, lines) = LogWriter::start(
            sink.clone(),
            room_for(10_000),
            GATHER,
            Duration::from_secs(10),
        )
        .unwrap();
        log(&lines, "first\n");
        held.entered.recv().unwrap();
        for n in 1..1000 {
            log(&lines, &format!("line {n}\n"));
        }
        held.release.send(()).unwrap();
        drop(writer);
        let batches = sink.batches();
        assert_eq!(batches.len(), 2, "writes: {}", batches.len());
        assert_eq!(batches[0], "first\n");
        let rest: String = (1..1000).map(|n| format!("line {n}\n")).collect();
        assert_eq!(batches[1], rest);
    }

    /// A reader that stopped reading: the writer is stuck in `write`, the queue fills, and
    /// every line past the limit is dropped and counted while logging never waits. Stopping
    /// gives up on the stuck writer after the final-write wait.
    #[test]
    fn a_full_queue_drops_and_counts_new_lines_instead_of_waiting() {
        let (sink, held) = Sink::holding_its_first_write();
        let (writer, lines) = LogWriter::start(
            sink.clone(),
            room_for(10),
            GATHER,
            Duration::from_millis(50),
        )
        .unwrap();
        log(&lines, "taken by the writer\n");
        held.entered.recv().unwrap();
        for n in 0..25 {
            log(&lines, &format!("line {n}\n"));
        }
        assert_eq!(lines.dropped_lines(), 15);
        drop(writer);
        assert!(sink.batches().is_empty());
    }

    #[test]
    fn lines_that_fail_to_be_written_are_counted_as_dropped() {
        let mut sink = Sink::new();
        sink.fail = true;
        let (writer, lines) =
            LogWriter::start(sink, room_for(100), GATHER, Duration::from_secs(10)).unwrap();
        for n in 0..7 {
            log(&lines, &format!("line {n}\n"));
        }
        drop(writer);
        assert_eq!(lines.dropped_lines(), 7);
    }

    /// Long lines fill the queue by their bytes before their count: past the byte limit,
    /// new lines are dropped and counted.
    #[test]
    fn a_queue_of_long_lines_is_full_at_its_byte_limit() {
        let (sink, held) = Sink::holding_its_first_write();
        let limits = Limits {
            lines: 100,
            bytes: 25,
        };
        let (writer, lines) =
            LogWriter::start(sink.clone(), limits, GATHER, Duration::from_secs(10)).unwrap();
        log(&lines, "taken by the writer\n");
        held.entered.recv().unwrap();
        for _ in 0..10 {
            log(&lines, "0123456789\n");
        }
        // Two of 11 bytes fit in 25.
        assert_eq!(lines.dropped_lines(), 8);
        held.release.send(()).unwrap();
        drop(writer);
        assert_eq!(
            sink.batches().concat(),
            format!("taken by the writer\n{}", "0123456789\n".repeat(2))
        );
    }

    /// Once the writer is gone, stopped or dead, a line logged is counted as dropped: no
    /// line waits in a queue nobody will write.
    #[test]
    fn lines_logged_once_the_writer_is_gone_are_counted_as_dropped() {
        let sink = Sink::new();
        let (writer, lines) =
            LogWriter::start(sink.clone(), room_for(100), GATHER, Duration::from_secs(10)).unwrap();
        log(&lines, "before the stop\n");
        drop(writer);
        for n in 0..3 {
            log(&lines, &format!("after the stop {n}\n"));
        }
        assert_eq!(lines.dropped_lines(), 3);
        assert_eq!(sink.batches().concat(), "before the stop\n");

        let mut sink = Sink::new();
        sink.panic = true;
        let (writer, lines) =
            LogWriter::start(sink, room_for(100), GATHER, Duration::from_secs(10)).unwrap();
        log(&lines, "the writer dies writing this\n");
        // Returns once the writer's thread ended, its panic unwound.
        drop(writer);
        for n in 0..4 {
            log(&lines, &format!("after the panic {n}\n"));
        }
        assert_eq!(lines.dropped_lines(), 4);
    }
}
