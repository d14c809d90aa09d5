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

impl SourceLoc {
    /// The location of the caller of the innermost `#[track_caller]` frame.
    #[track_caller]
    pub fn caller() -> Self {
        Location::caller().into()
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
/// source so) is named as a person would name it. Lexical only: paths are the compiler's, not the disk's.
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
    parts.join("/")
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
    }
}
