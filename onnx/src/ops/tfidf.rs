//! ONNX's `TfIdfVectorizer`: each row of token ids scored by the n-grams of a fixed pool it contains —
//! counts (`TF`), a weight per n-gram present (`IDF`), or both (`TFIDF`) — where an n-gram's tokens may
//! lie up to `max_skip_count` apart. Counting n-grams is a host job (hashing token sequences), so the
//! tokens are read back, as for `Unique` (a graph break under `compile`), and the scores come back as
//! an f32 constant of the output's static shape.

use super::{invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::DType;
use std::collections::{HashMap, HashSet};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["TfIdfVectorizer"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "TfIdfVectorizer").then(|| tfidf(node))
}

/// The most tokens kiln reads back and scans (each start position walks up to `max_gram_length` tokens
/// for each skip distance).
const MAX_TOKENS: usize = 1 << 22;

/// How a row's n-gram counts become its scores.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tf,
    Idf,
    TfIdf,
}

/// The pool's n-grams within the counted lengths: each one's output column, and every prefix of one
/// (a walk along a row stops at the first sequence that starts no n-gram).
struct Pool {
    column: HashMap<Vec<i64>, usize>,
    prefixes: HashSet<Vec<i64>>,
}

impl Pool {
    /// `pool` holds the 1-grams from `counts[0]`, the 2-grams from `counts[1]`, …, each length's n-grams
    /// back to back; n-gram `k` (in pool order, over every length) scores into column `indexes[k]`.
    /// Lengths outside `lengths` take their place in the numbering but are not counted.
    fn new(pool: &[i64], counts: &[i64], indexes: &[i64], lengths: (usize, usize)) -> OpResult<Pool> {
        let (mut column, mut prefixes, mut k) = (HashMap::new(), HashSet::new(), 0usize);
        for (i, &start) in counts.iter().enumerate() {
            let n = i + 1;
            let end = counts.get(i + 1).map_or(pool.len() as i64, |&e| e);
            if start < 0 || end < start || end as usize > pool.len() {
                return invalid(format!("ngram_counts {counts:?} over a pool of {}", pool.len()));
            }
            for gram in pool[start as usize..end as usize].chunks_exact(n) {
                if (lengths.0..=lengths.1).contains(&n) {
                    let Some(&c) = indexes.get(k) else {
                        return invalid(format!("ngram_indexes has {} entries; the pool more n-grams", indexes.len()));
                    };
                    column.insert(gram.to_vec(), usize::try_from(c).map_err(|_| invalid_index(c))?);
                    prefixes.extend((1..=n).map(|m| gram[..m].to_vec()));
                }
                k += 1;
            }
        }
        Ok(Pool { column, prefixes })
    }
}

fn invalid_index(c: i64) -> super::OpError {
    super::OpError::Invalid(format!("ngram_indexes entry {c} (a column, 0 or more)"))
}

/// `X` `[C]` or `[B, C]` of integer tokens into `[width]` or `[B, width]` scores, `width` the largest
/// of `ngram_indexes` plus one.
fn tfidf(node: &Node) -> OpResult<Vec<Value>> {
    if node.string_count("pool_strings").is_some_and(|n| n > 0) {
        return unsupported("TfIdfVectorizer over strings (kiln's tensors hold numbers)");
    }
    let x = node.tensor(0)?;
    if !x.dtype().is_int() || x.dtype() == DType::Bool {
        return invalid(format!("tokens of {} (integers)", x.dtype()));
    }
    let Some(dims) = x.shape().as_concrete() else { return unsupported("TfIdfVectorizer over symbolic dims") };
    let (rows, len) = match dims[..] {
        [c] => (1, c),
        [b, c] => (b, c),
        _ => return invalid(format!("tokens {dims:?} ([C] or [B, C])")),
    };
    if rows * len > MAX_TOKENS {
        return unsupported(format!("{} tokens read back to the host (up to {MAX_TOKENS})", rows * len));
    }
    let mode = match node.string("mode").as_deref() {
        Some("TF") => Mode::Tf,
        Some("IDF") => Mode::Idf,
        Some("TFIDF") => Mode::TfIdf,
        other => return invalid(format!("mode {other:?} (TF, IDF or TFIDF)")),
    };
    let (min_n, max_n) = (node.int("min_gram_length", 1), node.int("max_gram_length", 1));
    let skips = node.int("max_skip_count", 0);
    if min_n < 1 || max_n < min_n || skips < 0 {
        return invalid(format!("gram lengths {min_n}..={max_n}, max_skip_count {skips}"));
    }
    let (min_n, max_n, skips) = (min_n as usize, max_n as usize, skips as usize);
    let indexes = node.ints("ngram_indexes").unwrap_or_default();
    let width = indexes.iter().max().map_or(0, |&m| m.max(-1) + 1) as usize;
    let counts = node.ints("ngram_counts").unwrap_or_default();
    let pool = Pool::new(&node.ints("pool_int64s").unwrap_or_default(), &counts, &indexes, (min_n, max_n))?;
    let weights = node.floats("weights").unwrap_or_default();
    if !weights.is_empty() && weights.len() < width {
        return invalid(format!("{} weights for {width} columns", weights.len()));
    }
    let tokens: Vec<i64> = x.to_data()?.values().iter().map(|&v| v as i64).collect();
    let mut freq = vec![0u64; rows * width];
    for (r, row) in tokens.chunks(len.max(1)).enumerate().take(rows) {
        count_row(row, &pool, (min_n, max_n), skips, &mut freq[r * width..(r + 1) * width]);
    }
    let scores: Vec<f64> = freq
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let w = weights.get(i % width.max(1)).map_or(1.0, |&w| w as f64);
            match mode {
                Mode::Tf => f as f64,
                Mode::Idf => {
                    if f > 0 {
                        w
                    } else {
                        0.0
                    }
                }
                Mode::TfIdf => w * f as f64,
            }
        })
        .collect();
    let out_dims = if dims.len() == 1 { vec![width] } else { vec![rows, width] };
    Ok(vec![Value::Tensor(node.model.constant(scores, &out_dims, DType::F32)?)])
}

/// Adds one row's n-gram counts into `freq`. For each distance `d` from 1 to `skips + 1`, every start
/// position walks tokens `d` apart, counting each sequence of a counted length that is in the pool,
/// until the sequence starts no n-gram; 1-grams are counted on the first distance only (a single token
/// has no gaps).
fn count_row(row: &[i64], pool: &Pool, (min_n, max_n): (usize, usize), skips: usize, freq: &mut [u64]) {
    let mut shortest = min_n;
    for d in 1..=skips + 1 {
        for start in 0..row.len() {
            if start + d * (shortest - 1) >= row.len() {
                break;
            }
            let mut gram = Vec::with_capacity(max_n);
            for at in (start..row.len()).step_by(d).take(max_n) {
                gram.push(row[at]);
                if !pool.prefixes.contains(&gram) {
                    break;
                }
                if gram.len() >= shortest {
                    if let Some(&c) = pool.column.get(&gram) {
                        freq[c] += 1;
                    }
                }
            }
        }
        if shortest == 1 {
            shortest = 2;
            if shortest > max_n {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, ints, run_one, string};
    use crate::proto::AttributeProto;
    use crate::value::Value;
    use kiln_graph::Tensor;

    fn floats(name: &str, v: &[f32]) -> AttributeProto {
        AttributeProto { name: Some(name.into()), floats: v.to_vec(), ..Default::default() }
    }

    /// The pool: 1-grams 2, 3, 5, 4 (columns 0–3) and 2-grams (5, 6), (7, 8), (6, 7) (columns 4–6).
    fn attrs(mode: &str, min: i64, max: i64, skips: i64) -> Vec<AttributeProto> {
        vec![
            string("mode", mode),
            int("min_gram_length", min),
            int("max_gram_length", max),
            int("max_skip_count", skips),
            ints("ngram_counts", &[0, 4]),
            ints("ngram_indexes", &[0, 1, 2, 3, 4, 5, 6]),
            ints("pool_int64s", &[2, 3, 5, 4, 5, 6, 7, 8, 6, 7]),
        ]
    }

    fn run(attrs: Vec<AttributeProto>, tokens: &[i32], dims: &[usize]) -> Vec<f32> {
        let x = Tensor::from_slice(tokens, dims).unwrap();
        let out = run_one("TfIdfVectorizer", attrs, &[Some(Value::Tensor(x))]).unwrap();
        out[0].to_vec::<f32>().unwrap()
    }

    #[test]
    fn counts_grams_with_and_without_gaps() {
        let row = [1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8];
        // Contiguous: 3 three times, 5 once; (7, 8), (6, 7), (5, 6) once each.
        assert_eq!(run(attrs("TF", 1, 2, 0), &row, &[12]), [0.0, 3.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
        // Bigrams only, tokens up to 5 apart (six distances): (7, 8) at distances 1, 3 and 6 of the
        // 12, (5, 6) at 1, (6, 7) at 1 — as ONNX's reference counts them.
        let gaps = run(attrs("TF", 2, 2, 5), &row, &[12]);
        assert_eq!(&gaps[..4], [0.0; 4], "no 1-grams below min_gram_length");
        assert_eq!(&gaps[4..], [1.0, 3.0, 1.0]);
        // Two rows; IDF weights each present n-gram once; TFIDF multiplies.
        let two = [3, 3, 5, 6, 2, 2, 2, 4];
        assert_eq!(run(attrs("TF", 1, 2, 0), &two, &[2, 4]), [0., 2., 1., 0., 1., 0., 0., 3., 0., 0., 1., 0., 0., 0.]);
        let mut w = attrs("TFIDF", 1, 2, 0);
        w.push(floats("weights", &[1.0, 0.5, 2.0, 1.0, 4.0, 1.0, 1.0]));
        assert_eq!(run(w, &two[..4], &[4]), [0.0, 1.0, 2.0, 0.0, 4.0, 0.0, 0.0]);
        assert_eq!(run(attrs("IDF", 1, 2, 0), &two[..4], &[4]), [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn strings_and_bad_attributes_are_typed_errors() {
        let x = Some(Value::Tensor(Tensor::from_slice(&[1i32, 2], &[2]).unwrap()));
        let mut a = attrs("BM25", 1, 2, 0);
        let e = run_one("TfIdfVectorizer", a.clone(), std::slice::from_ref(&x)).unwrap_err();
        assert!(e.starts_with("invalid") && e.contains("TFIDF"), "{e}");
        a[0] = string("mode", "TF");
        a[5] = ints("ngram_indexes", &[0, 1]);
        let e = run_one("TfIdfVectorizer", a, &[x]).unwrap_err();
        assert!(e.contains("ngram_indexes has 2 entries"), "{e}");
    }
}
