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
        SourceLoc { file: l.file().to_string(), line: l.line(), column: l.column() }
    }
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}
