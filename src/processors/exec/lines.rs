//! A child's output read line by line, no line held beyond the configured maximum.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// One line of a child's output (lossy UTF-8, without the newline), at most the
/// configured maximum; `cut` bytes of it beyond that were dropped unread into memory.
pub(super) struct Line {
    pub(super) text: String,
    pub(super) cut: u64,
}

/// Reads `stream` line by line into `each` until EOF or until `each` returns false.
/// At most `max` bytes of a line are kept: the rest of a longer one is consumed and
/// counted as it arrives, so a handler writing without newlines costs no memory.
pub(super) async fn read_lines<R, F, Fut>(stream: R, max: usize, mut each: F)
where
    R: AsyncRead + Unpin,
    F: FnMut(Line) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    let mut cut = 0u64;
    loop {
        let (used, ended) = match reader.fill_buf().await {
            Ok([]) | Err(_) => {
                // EOF: a last line without a newline still counts.
                if !buf.is_empty() || cut > 0 {
                    each(take_line(&mut buf, &mut cut)).await;
                }
                return;
            }
            Ok(chunk) => {
                let (part, ended) = match chunk.iter().position(|b| *b == b'\n') {
                    Some(i) => (&chunk[..i], true),
                    None => (chunk, false),
                };
                let room = max.saturating_sub(buf.len()).min(part.len());
                buf.extend_from_slice(&part[..room]);
                cut += (part.len() - room) as u64;
                (part.len() + usize::from(ended), ended)
            }
        };
        reader.consume(used);
        if ended && !each(take_line(&mut buf, &mut cut)).await {
            return;
        }
    }
}

/// The line in `buf` (a `\r` before the newline dropped), leaving `buf` empty with
/// its capacity (at most the maximum line) for the next one.
fn take_line(buf: &mut Vec<u8>, cut: &mut u64) -> Line {
    if *cut == 0 && buf.last() == Some(&b'\r') {
        buf.pop();
    }
    let line = Line {
        text: String::from_utf8_lossy(buf).into_owned(),
        cut: std::mem::take(cut),
    };
    buf.clear();
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs [`read_lines`] over `input` with lines of at most `max` bytes.
    fn lines_of(input: &'static [u8], max: usize) -> Vec<(String, u64)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut got = Vec::new();
            read_lines(input, max, |l| {
                got.push((l.text, l.cut));
                async { true }
            })
            .await;
            got
        })
    }

    #[test]
    fn lines_longer_than_the_maximum_are_cut_and_counted() {
        assert_eq!(
            lines_of(b"short\r\nexactly\n0123456789abc\nlast", 7),
            vec![
                ("short".into(), 0),
                ("exactly".into(), 0),
                ("0123456".into(), 6),
                ("last".into(), 0),
            ]
        );
        // A line far longer than BufReader's buffer: cut, counted, the next one whole.
        let huge: &'static [u8] = Box::leak(
            [vec![b'x'; 100_000], b"\nnext\n".to_vec()]
                .concat()
                .into_boxed_slice(),
        );
        assert_eq!(
            lines_of(huge, 256),
            vec![("x".repeat(256), 100_000 - 256), ("next".into(), 0)]
        );
    }
}
