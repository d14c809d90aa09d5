//! Source locations: every node, error and graph break points at the user's line, captured with
//! `#[track_caller]` on the `Tensor` methods.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::panic::Location;

/// A place in the user's source.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceLoc {
    /// File path as the compiler saw it.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

thread_local! {
    /// The user's line that every op recorded now is attributed to, while a layer made of several ops
    /// runs (see [`SourceLoc::attributed`]).
    static SCOPE: std::cell::RefCell<Option<SourceLoc>> = const { std::cell::RefCell::new(None) };
}

impl SourceLoc {
    /// The location of the caller of the innermost `#[track_caller]` frame — or, inside
    /// [`SourceLoc::attributed`], the line the whole layer was called from.
    #[track_caller]
    pub fn caller() -> Self {
        // Read here: inside the closure below, `Location::caller` would name this file.
        let here = Location::caller();
        SCOPE.with(|s| s.borrow().clone()).unwrap_or_else(|| here.into())
    }

    /// Runs `f` with every op it records (and every error it raises) attributed to `loc`: a layer built
    /// from several ops (`batch_norm`, `group_norm`) shows as the user's one line, not kiln's. The
    /// outermost attribution wins when layers nest.
    pub fn attributed<R>(loc: SourceLoc, f: impl FnOnce() -> R) -> R {
        let outer = SCOPE.with(|s| s.borrow().is_some());
        if outer {
            return f();
        }
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                SCOPE.with(|s| *s.borrow_mut() = None);
            }
        }
        SCOPE.with(|s| *s.borrow_mut() = Some(loc));
        let _reset = Reset;
        f()
    }

    /// A location for nodes that kiln makes itself rather than the user (none of the user's lines applies).
    pub fn internal() -> Self {
        SourceLoc { file: "<kiln>".into(), line: 0, column: 0 }
    }
}

impl From<&Location<'_>> for SourceLoc {
    fn from(l: &Location<'_>) -> Self {
        SourceLoc { file: tidy(l.file()), line: l.line(), column: l.column() }
    }
}

/// `a/b/../c` as `a/c`: a file compiled through `#[path = "../.."]` (the explorer includes an example's
/// source so) is named as a person would name it. Lexical only (paths are the compiler's, not the disk's),
/// and `/`-separated: a Windows path's `\..\` is left as it is.
fn tidy(path: &str) -> String {
    if !path.contains("/..") {
        return path.to_string();
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match (part, parts.last()) {
            ("..", Some(&last)) if last != ".." && !last.is_empty() => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    let tidy = parts.join("/");
    if tidy.is_empty() {
        ".".into()
    } else {
        tidy
    }
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

#[cfg(test)]
mod tests {
    use super::tidy;

    #[test]
    fn parent_steps_fold_lexically() {
        assert_eq!(tidy("app/src/../../examples/graph_breaks.rs"), "examples/graph_breaks.rs");
        assert_eq!(tidy("src/lib.rs"), "src/lib.rs");
        assert_eq!(tidy("../up/a.rs"), "../up/a.rs");
        assert_eq!(tidy("/abs/x/../y.rs"), "/abs/y.rs");
        assert_eq!(tidy("a/.."), ".");
    }
}
