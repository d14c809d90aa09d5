//! ONNX tensors (`TensorProto`) to kiln data: the element types kiln holds, little-endian raw bytes or
//! the typed repeated fields, and external data files next to the model. The 2- and 4-bit types come
//! packed, lowest bits first; kiln holds them a byte an element, so they are unpacked here.

use crate::proto::{tensor_proto::DataLocation, tensor_proto::DataType, TensorProto};
use kiln_graph::{DType, TensorData};
use std::path::Path;

/// kiln's dtype for an ONNX element type, or the ONNX type's name when kiln has no such dtype.
pub fn dtype_of(elem_type: i32) -> Result<DType, String> {
    match DataType::try_from(elem_type) {
        Ok(DataType::Float) => Ok(DType::F32),
        Ok(DataType::Double) => Ok(DType::F64),
        Ok(DataType::Float16) => Ok(DType::F16),
        Ok(DataType::Bfloat16) => Ok(DType::BF16),
        Ok(DataType::Int32) => Ok(DType::I32),
        Ok(DataType::Int64) => Ok(DType::I64),
        Ok(DataType::Uint32) => Ok(DType::U32),
        Ok(DataType::Uint64) => Ok(DType::U64),
        Ok(DataType::Bool) => Ok(DType::Bool),
        Ok(DataType::Uint8) => Ok(DType::U8),
        Ok(DataType::Int8) => Ok(DType::I8),
        Ok(DataType::Uint16) => Ok(DType::U16),
        Ok(DataType::Int16) => Ok(DType::I16),
        Ok(DataType::Float8e4m3fn) => Ok(DType::F8E4M3),
        Ok(DataType::Float8e5m2) => Ok(DType::F8E5M2),
        Ok(DataType::Float8e4m3fnuz) => Ok(DType::F8E4M3FNUZ),
        Ok(DataType::Float8e5m2fnuz) => Ok(DType::F8E5M2FNUZ),
        Ok(DataType::Int4) => Ok(DType::I4),
        Ok(DataType::Uint4) => Ok(DType::U4),
        Ok(DataType::Int2) => Ok(DType::I2),
        Ok(DataType::Uint2) => Ok(DType::U2),
        Ok(DataType::Float4e2m1) => Ok(DType::F4E2M1),
        Ok(other) => Err(format!("element type {}", other.as_str_name().to_lowercase())),
        Err(_) => Err(format!("element type {elem_type}")),
    }
}

/// The ONNX element type of a kiln dtype.
pub fn onnx_type(d: DType) -> DataType {
    match d {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
        DType::Bool => DataType::Bool,
        DType::U8 => DataType::Uint8,
        DType::I8 => DataType::Int8,
        DType::U16 => DataType::Uint16,
        DType::I16 => DataType::Int16,
        DType::F8E4M3 => DataType::Float8e4m3fn,
        DType::F8E5M2 => DataType::Float8e5m2,
        DType::F8E4M3FNUZ => DataType::Float8e4m3fnuz,
        DType::F8E5M2FNUZ => DataType::Float8e5m2fnuz,
        DType::I4 => DataType::Int4,
        DType::U4 => DataType::Uint4,
        DType::I2 => DataType::Int2,
        DType::U2 => DataType::Uint2,
        DType::F4E2M1 => DataType::Float4e2m1,
    }
}

/// Bits of an element ONNX packs several to a byte: 4 (int4, uint4, float4e2m1) or 2 (int2, uint2).
fn packed_bits(d: DType) -> Option<usize> {
    match d {
        DType::I4 | DType::U4 | DType::F4E2M1 => Some(4),
        DType::I2 | DType::U2 => Some(2),
        _ => None,
    }
}

/// The values of `numel` packed codes of `dtype` (`bits` each, the first in the lowest bits of the first
/// byte): integers sign-extended where signed, float codes decoded.
fn unpack(bytes: &[u8], numel: usize, bits: usize, dtype: DType) -> Vec<f64> {
    let mask = (1u8 << bits) - 1;
    (0..numel)
        .map(|i| {
            let code = (bytes[i * bits / 8] >> (i * bits % 8)) & mask;
            match (dtype.minifloat(), dtype.narrow_bits()) {
                (Some(f), _) => f.decode(code),
                (None, Some((_, true))) => f64::from(((code << (8 - bits)) as i8) >> (8 - bits)),
                _ => f64::from(code),
            }
        })
        .collect()
}

/// Reads `t` into host data. `dir` is where external data files are looked up (the model's folder).
pub fn to_data(t: &TensorProto, dir: Option<&Path>) -> Result<TensorData, String> {
    let dtype = dtype_of(t.data_type())?;
    let dims: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is negative")))
        .collect::<Result<_, _>>()?;
    let numel = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or("too many elements")?;
    let width = dtype.size_bytes();
    let file_bytes = match packed_bits(dtype) {
        Some(bits) => numel.checked_mul(bits).ok_or("too many elements")?.div_ceil(8),
        None => numel * width,
    };
    let raw: Option<Vec<u8>> = if t.data_location() == DataLocation::External {
        Some(external(t, dir, file_bytes)?)
    } else {
        t.raw_data.clone()
    };
    if let Some(bits) = packed_bits(dtype) {
        // Raw bytes, or one packed byte an `int32_data` entry.
        let bytes: Vec<u8> = match raw {
            Some(bytes) => bytes,
            None => t.int32_data.iter().map(|&v| v as u8).collect(),
        };
        if bytes.len() != file_bytes {
            return Err(format!("{} bytes for {numel} packed {dtype} elements (want {file_bytes})", bytes.len()));
        }
        return TensorData::from_f64(unpack(&bytes, numel, bits, dtype), &dims, dtype).map_err(|e| e.to_string());
    }
    let values: Vec<f64> = match raw {
        Some(bytes) => {
            if bytes.len() != numel * width {
                return Err(format!("{} raw bytes for {numel} {dtype} elements", bytes.len()));
            }
            return TensorData::from_le_bytes(&bytes, &dims, dtype).map_err(|e| e.to_string());
        }
        None => match dtype {
            DType::F32 => t.float_data.iter().map(|&v| v as f64).collect(),
            DType::F64 => t.double_data.clone(),
            DType::I64 => t.int64_data.iter().map(|&v| v as f64).collect(),
            // Both unsigned widths are stored in `uint64_data`.
            DType::U32 | DType::U64 => t.uint64_data.iter().map(|&v| v as f64).collect(),
            // Stored as the bit patterns in `int32_data` (half types) or as values (int32, bool).
            DType::F16 => t.int32_data.iter().map(|&v| half::f16::from_bits(v as u16).to_f64()).collect(),
            DType::BF16 => t.int32_data.iter().map(|&v| half::bf16::from_bits(v as u16).to_f64()).collect(),
            // Narrow integers are stored widened in `int32_data` too.
            DType::I32 | DType::Bool | DType::U8 | DType::I8 | DType::U16 | DType::I16 => {
                t.int32_data.iter().map(|&v| v as f64).collect()
            }
            // 8-bit floats as their bit patterns, as the half types.
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ => match dtype.minifloat() {
                Some(f) => t.int32_data.iter().map(|&v| f.decode(v as u8)).collect(),
                None => vec![],
            },
            // Unpacked above.
            DType::I4 | DType::U4 | DType::I2 | DType::U2 | DType::F4E2M1 => vec![],
        },
    };
    if values.len() != numel {
        return Err(format!("{} values for shape {dims:?}", values.len()));
    }
    TensorData::from_f64(values, &dims, dtype).map_err(|e| e.to_string())
}

/// The bytes of an external tensor: `location` (relative to the model's folder, never outside it),
/// `offset` and `length` from its `external_data` entries.
fn external(t: &TensorProto, dir: Option<&Path>, want: usize) -> Result<Vec<u8>, String> {
    let get = |k: &str| t.external_data.iter().find(|e| e.key() == k).map(|e| e.value().to_string());
    let location = get("location").ok_or("external data without a location")?;
    let dir = dir.ok_or("external data, but the model was not read from a file")?;
    let rel = Path::new(&location);
    if rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(format!("external data location {location:?} leaves the model's folder"));
    }
    let parse = |k: &str| get(k).map(|v| v.parse::<u64>().map_err(|_| format!("external data {k} {v:?}"))).transpose();
    let offset = parse("offset")?.unwrap_or(0);
    let length = parse("length")?.unwrap_or(want as u64);
    if length != want as u64 {
        return Err(format!("external data length {length} for {want} bytes of elements"));
    }
    use std::io::{Read, Seek, SeekFrom};
    let path = dir.join(rel);
    let mut f = std::fs::File::open(&path).map_err(|e| format!("external data {}: {e}", path.display()))?;
    f.seek(SeekFrom::Start(offset)).map_err(|e| format!("external data {}: {e}", path.display()))?;
    let mut bytes = vec![0u8; want];
    f.read_exact(&mut bytes).map_err(|e| format!("external data {} (offset {offset}): {e}", path.display()))?;
    Ok(bytes)
}
