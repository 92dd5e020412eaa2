//! The text log format's field formatter: the output of tracing-subscriber's `DefaultFields`
//! (`name=value` pairs separated by spaces, strings quoted as `Debug` quotes them), with the
//! common cases written directly — integers and booleans, and strings of printable ASCII
//! without a quote or backslash — instead of through `format_args!` and `dyn Debug`. Measured
//! under the overhead benchmark, formatting the request log line's fields was over half of the
//! line's cost.
//!
//! Invariants: the output is byte-for-byte `DefaultFields`' (a test compares them); everything
//! else — the `message` field, `r#` names, errors, `Debug` values, strings that need escaping,
//! and any writer with ANSI colours — is handed to a `DefaultVisitor`, so its escaping of
//! control characters (terminal injection) and its styling apply unchanged.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};

/// The text format's `FormatFields` (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fields;

impl<'a> MakeVisitor<Writer<'a>> for Fields {
    type Visitor = Visitor<'a>;

    fn make_visitor(&self, writer: Writer<'a>) -> Visitor<'a> {
        Visitor {
            direct: !writer.has_ansi_escapes(),
            writer,
            is_empty: true,
            result: Ok(()),
        }
    }
}

/// Writes one event's (or span's) fields.
pub struct Visitor<'a> {
    writer: Writer<'a>,
    direct: bool,
    is_empty: bool,
    result: fmt::Result,
}

impl Visitor<'_> {
    /// Whether `field` may be written here rather than by `DefaultVisitor`.
    fn plain(&self, field: &Field) -> bool {
        let name = field.name();
        self.direct && self.result.is_ok() && name != "message" && !name.starts_with("r#")
    }

    /// Writes ` name=` (the space only between fields) then `value`.
    fn direct(&mut self, field: &Field, value: &str, quoted: bool) {
        let w = &mut self.writer;
        let mut r = Ok(());
        if !std::mem::replace(&mut self.is_empty, false) {
            r = r.and(w.write_char(' '));
        }
        r = r.and(w.write_str(field.name())).and(w.write_char('='));
        self.result = if quoted {
            r.and(w.write_char('"'))
                .and(w.write_str(value))
                .and(w.write_char('"'))
        } else {
            r.and(w.write_str(value))
        };
    }

    /// Hands one field to `DefaultVisitor`, continuing its spacing.
    fn delegate(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let mut inner = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut inner);
        self.result = inner.finish();
        // `DefaultVisitor` writes nothing for a skipped field; a written one clears this.
        self.is_empty = false;
    }
}

/// Whether `Debug` would print `s` as itself between quotes.
fn needs_no_escape(s: &str) -> bool {
    s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for Visitor<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.plain(field) {
            self.direct(field, itoa::Buffer::new().format(value), false);
        } else {
            self.delegate(|v| v.record_u64(field, value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.plain(field) {
            self.direct(field, itoa::Buffer::new().format(value), false);
        } else {
            self.delegate(|v| v.record_i64(field, value));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.plain(field) {
            self.direct(field, if value { "true" } else { "false" }, false);
        } else {
            self.delegate(|v| v.record_bool(field, value));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if self.plain(field) && needs_no_escape(value) {
            self.direct(field, value, true);
        } else {
            self.delegate(|v| v.record_str(field, value));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.delegate(|v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.delegate(|v| v.record_debug(field, value));
    }
}

impl VisitOutput<fmt::Result> for Visitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for Visitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    /// Emits the same events under a subscriber with `fields`, returns the text.
    fn emit<N>(fields: N) -> String
    where
        N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static,
    {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buf.clone())
            .with_ansi(false)
            .without_time()
            .fmt_fields(fields)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let err = std::io::Error::other("boom");
            tracing::info!(
                target: "fairgate::request",
                tenant = "bench-1",
                model = Some("gpt-4o-mini"),
                none = None::<u64>,
                status = 200u16,
                delta = -3i64,
                ok = true,
                quoted = "say \"hi\"\n\u{1b}[31m",
                unicode = "héllo",
                empty = "",
                r#type = "raw",
                ratio = 0.5f64,
                error = &err as &(dyn std::error::Error + 'static),
                "request {}", 1
            );
            let span = tracing::info_span!("conn", peer = "127.0.0.1", n = 7u64);
            let _in = span.enter();
            tracing::warn!(first = 1u64, "in a span");
            tracing::info!(only = "field");
        });
        let text = buf.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn output_is_default_fields_output() {
        let ours = emit(Fields);
        let theirs = emit(tracing_subscriber::fmt::format::DefaultFields::new());
        assert_eq!(ours, theirs);
        assert!(ours.contains(r#"tenant="bench-1" model="gpt-4o-mini" status=200 delta=-3"#));
    }

    #[test]
    fn only_plain_ascii_is_written_directly() {
        assert!(needs_no_escape("bench-1 a/b:c"));
        for s in ["a\"b", "a\\b", "tab\t", "\u{1b}[31m", "é", "\u{7f}"] {
            assert!(!needs_no_escape(s), "{s:?}");
        }
    }
}
