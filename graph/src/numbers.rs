//! Floats in JSON, where NaN and the infinities have no literal: serde_json writes them all as `null`,
//! which made a graph holding `+inf` and one holding `-inf` serialise alike — the same compile-cache key
//! and kernel id, so one ran the other's kernel. Every f64 kiln serialises (constants, pad values, kernel
//! IR constants, saved cases) goes through here: finite values as numbers, the rest as the strings
//! `"nan"`, `"inf"` and `"-inf"`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Number {
    Finite(f64),
    Special(String),
}

fn to_number(x: f64) -> Number {
    match x {
        x if x.is_finite() => Number::Finite(x),
        x if x.is_nan() => Number::Special("nan".into()),
        x if x > 0.0 => Number::Special("inf".into()),
        _ => Number::Special("-inf".into()),
    }
}

fn from_number<E: serde::de::Error>(n: Number) -> Result<f64, E> {
    match n {
        Number::Finite(x) => Ok(x),
        Number::Special(s) => match s.as_str() {
            "nan" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            other => Err(E::custom(format!("`{other}` is not a number"))),
        },
    }
}

/// One f64 (`#[serde(with = "crate::numbers")]`).
pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    to_number(*v).serialize(s)
}

/// One f64.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    from_number(Number::deserialize(d)?)
}

/// A vector of f64 (`#[serde(with = "crate::numbers::many")]`).
pub mod many {
    use super::{from_number, to_number, Number};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes each value as [`super::serialize`] does.
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        v.iter().map(|&x| to_number(x)).collect::<Vec<_>>().serialize(s)
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Number>::deserialize(d)?.into_iter().map(from_number).collect()
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct One(#[serde(with = "super")] f64);

    #[test]
    fn non_finite_values_keep_their_identity() {
        let texts: Vec<String> = [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1.5]
            .iter()
            .map(|&v| serde_json::to_string(&One(v)).unwrap())
            .collect();
        assert_eq!(texts, [r#""inf""#, r#""-inf""#, r#""nan""#, "1.5"]);
        for (t, v) in texts.iter().zip([f64::INFINITY, f64::NEG_INFINITY]) {
            assert_eq!(serde_json::from_str::<One>(t).unwrap(), One(v));
        }
        assert!(serde_json::from_str::<One>(&texts[2]).unwrap().0.is_nan());
        assert!(serde_json::from_str::<One>(r#""infinity""#).is_err());
    }
}
