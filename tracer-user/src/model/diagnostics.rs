//! The one diagnostics channel of every layer: a line on stderr with the
//! target's control characters escaped (names, paths and errors can carry
//! them), and the escaping itself, which the renderers use for stdout.
use std::io::Write;

/// `text` with every control character but the newline written as an
/// escape (`\x1b`, `\u{9b}`): names come from the target, and an escape
/// sequence in a symbol must not reach the terminal (retitle it, move the
/// cursor, hide lines). JSON escapes them itself.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => escaped.push(c),
            c if c.is_control() && (c as u32) < 0x80 => {
                escaped.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => escaped.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => escaped.push(c),
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// A diagnostic line on stderr; a stderr that is gone is ignored (the
/// result is on stdout or in the JSON, and there is nowhere to say more).
pub(crate) fn note(line: std::fmt::Arguments) {
    let line = line.to_string();
    let _ = writeln!(std::io::stderr().lock(), "{}", printable(&line));
}
