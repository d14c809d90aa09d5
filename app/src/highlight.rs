//! Syntax colours for the kernel view: comments, keywords, types, numbers and registers of WGSL and PTX,
//! by a small tokenizer (the two languages kiln itself writes, so a full grammar buys nothing).

use egui::text::{LayoutJob, TextFormat};
use egui::{Color32, FontId};

const WGSL_KEYWORDS: &[&str] = &[
    "fn",
    "let",
    "var",
    "const",
    "for",
    "if",
    "else",
    "return",
    "loop",
    "break",
    "continue",
    "while",
    "struct",
    "enable",
    "override",
    "workgroupBarrier",
    "select",
    "bitcast",
];
const WGSL_TYPES: &[&str] = &["f32", "f16", "i32", "u32", "bool", "vec2", "vec3", "vec4", "array", "atomic"];

/// The colour class of one token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// `// …` to the end of the line.
    Comment,
    /// A keyword (WGSL) or a directive or instruction (PTX).
    Keyword,
    /// A type (WGSL) or a state space or type suffix (PTX).
    Type,
    /// A numeric literal.
    Number,
    /// A PTX register (`%t12`).
    Register,
    /// An attribute (`@compute`) or a label.
    Attribute,
    /// Anything else.
    Plain,
}

/// Splits `text` into classified pieces (covering it exactly) for `language` (`wgsl` or `ptx`).
pub fn tokens<'a>(text: &'a str, language: &str) -> Vec<(&'a str, Class)> {
    let ptx = language == "ptx";
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let (len, class) = if rest.starts_with("//") {
            (rest.find('\n').unwrap_or(rest.len()), Class::Comment)
        } else if bytes[i].is_ascii_digit() {
            let n = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_')).unwrap_or(rest.len());
            (n, Class::Number)
        } else if bytes[i] == b'%' && ptx {
            (
                1 + rest[1..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len() - 1),
                Class::Register,
            )
        } else if bytes[i] == b'@' {
            (
                1 + rest[1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '%'))
                    .unwrap_or(rest.len() - 1),
                Class::Attribute,
            )
        } else if bytes[i].is_ascii_alphabetic() || bytes[i] == b'_' || (ptx && bytes[i] == b'.') {
            let n = 1 + rest[1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || (ptx && c == '.')))
                .unwrap_or(rest.len() - 1);
            let word = &rest[..n];
            let class = if ptx {
                if word.starts_with('.') {
                    Class::Type
                } else if rest[n..].starts_with(':') {
                    Class::Attribute
                } else if out.last().is_none_or(|(t, _): &(&str, Class)| t.ends_with('\n') || t.trim().is_empty()) {
                    Class::Keyword
                } else {
                    Class::Plain
                }
            } else if WGSL_KEYWORDS.contains(&word) {
                Class::Keyword
            } else if WGSL_TYPES.contains(&word) {
                Class::Type
            } else {
                Class::Plain
            };
            (n, class)
        } else {
            let n = rest.chars().next().map_or(1, char::len_utf8);
            (n, Class::Plain)
        };
        out.push((&rest[..len], class));
        i += len;
    }
    out
}

/// `text` coloured for `language`, in the monospace font.
pub fn layout(text: &str, language: &str, dark: bool) -> LayoutJob {
    let mut job = LayoutJob::default();
    let font = FontId::monospace(12.0);
    for (piece, class) in tokens(text, language) {
        let color = match (class, dark) {
            (Class::Comment, _) => Color32::from_rgb(110, 140, 110),
            (Class::Keyword, _) => Color32::from_rgb(197, 134, 192),
            (Class::Type, _) => Color32::from_rgb(78, 201, 176),
            (Class::Number, _) => Color32::from_rgb(181, 206, 168),
            (Class::Register, _) => Color32::from_rgb(156, 220, 254),
            (Class::Attribute, _) => Color32::from_rgb(220, 220, 170),
            (Class::Plain, true) => Color32::from_gray(212),
            (Class::Plain, false) => Color32::from_gray(30),
        };
        job.append(piece, 0.0, TextFormat::simple(font.clone(), color));
    }
    job
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_cover_the_text_and_classify_both_languages() {
        let wgsl = "// k0\n@compute fn main() { let v0: f32 = 1.5f; }";
        let t = tokens(wgsl, "wgsl");
        assert_eq!(t.iter().map(|(s, _)| *s).collect::<String>(), wgsl);
        let class = |t: &[(&str, Class)], w: &str| t.iter().find(|(s, _)| *s == w).map(|(_, c)| *c);
        assert_eq!(class(&t, "// k0"), Some(Class::Comment));
        assert_eq!(class(&t, "@compute"), Some(Class::Attribute));
        assert_eq!(
            (class(&t, "fn"), class(&t, "f32"), class(&t, "1.5f")),
            (Some(Class::Keyword), Some(Class::Type), Some(Class::Number))
        );
        let ptx = "    add.f32 %t1, %t2, 0f3F800000;\nL9:\n    .reg .f32 %t3;";
        let t = tokens(ptx, "ptx");
        assert_eq!(t.iter().map(|(s, _)| *s).collect::<String>(), ptx);
        assert_eq!(
            (class(&t, "add.f32"), class(&t, "%t1"), class(&t, "L9")),
            (Some(Class::Keyword), Some(Class::Register), Some(Class::Attribute))
        );
        assert_eq!(class(&t, ".reg"), Some(Class::Type));
    }
}
