//! `ImageDecoder` (opset 20): an encoded image (JPEG, PNG, BMP, PNM, TIFF, WebP) decoded on the host by
//! the `image` crate from the bytes read back — under `compile` a graph break, as decoding is in
//! torchvision's `decode_image` — and handed on as a `[height, width, channels]` u8 tensor.
//!
//! Not in browser builds: there a page decodes images itself, and the decoders would add to its wasm.

use super::{Node, OpResult};
use crate::value::Value;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["ImageDecoder"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "ImageDecoder" => decode(node),
        _ => return None,
    })
}

#[cfg(not(target_arch = "wasm32"))]
use native::decode;

/// The decoder, native builds only.
#[cfg(not(target_arch = "wasm32"))]
mod native {
    use super::super::{invalid, unsupported, Node, OpError, OpResult};
    use crate::value::Value;
    use kiln_graph::DType;

    /// The most bytes of an encoded image kiln reads back.
    const MAX_BYTES: usize = 1 << 26;
    /// The most pixels of a decoded image (16 Mi: 4096 × 4096), checked from its header before decoding.
    const MAX_PIXELS: u64 = 1 << 24;
    /// The most a decoder may allocate (a 16-bit RGBA image of `MAX_PIXELS` pixels and room besides).
    const MAX_DECODER_BYTES: u64 = 1 << 28;

    /// The image of input 0's bytes in `pixel_format`'s channels.
    pub(super) fn decode(node: &Node) -> OpResult<Vec<Value>> {
        let format = node.string("pixel_format").unwrap_or_else(|| "RGB".into());
        if !matches!(format.as_str(), "RGB" | "BGR" | "Grayscale") {
            return invalid(format!("pixel_format {format:?} (RGB, BGR or Grayscale)"));
        }
        let x = node.tensor(0)?;
        if x.dtype() != DType::U8 {
            return invalid(format!("encoded image of dtype {} (u8)", x.dtype()));
        }
        let Some(n) = x.shape().as_concrete().map(|d| d.iter().product::<usize>()) else {
            return unsupported("an encoded image of symbolic length");
        };
        if n > MAX_BYTES {
            return unsupported(format!("an encoded image of {n} bytes (up to {MAX_BYTES})"));
        }
        let bytes: Vec<u8> = x.to_data()?.values().iter().map(|&v| v as u8).collect();
        if is_jpeg2000(&bytes) {
            return unsupported("a JPEG 2000 image (kiln decodes JPEG, PNG, BMP, PNM, TIFF and WebP)");
        }
        let failed = |e: image::ImageError| OpError::Invalid(format!("decoding the image: {e}"));
        let reader = || image::ImageReader::new(std::io::Cursor::new(&bytes)).with_guessed_format();
        // The size first, from the header: a small file can describe a huge image.
        let (w, h) = reader().map_err(|e| failed(e.into()))?.into_dimensions().map_err(failed)?;
        if u64::from(w) * u64::from(h) > MAX_PIXELS {
            return unsupported(format!("a {w} × {h} image (up to {MAX_PIXELS} pixels)"));
        }
        let mut reader = reader().map_err(|e| failed(e.into()))?;
        let mut limits = image::Limits::default();
        limits.max_alloc = Some(MAX_DECODER_BYTES);
        reader.limits(limits);
        let image = reader.decode().map_err(failed)?;
        let (w, h) = (image.width() as usize, image.height() as usize);
        let (values, channels): (Vec<f64>, usize) = match format.as_str() {
            "Grayscale" => (luma(&image.to_rgb8()).into_iter().map(f64::from).collect(), 1),
            "BGR" => {
                let rgb = image.to_rgb8();
                (rgb.pixels().flat_map(|p| [p[2], p[1], p[0]]).map(f64::from).collect(), 3)
            }
            _ => (image.to_rgb8().into_raw().into_iter().map(f64::from).collect(), 3),
        };
        Ok(vec![Value::Tensor(node.model.constant(values, &[h, w, channels], DType::U8)?)])
    }

    /// Whether `bytes` open as JPEG 2000: a JP2 file's signature box, or a bare codestream's SOC and SIZ
    /// markers.
    fn is_jpeg2000(bytes: &[u8]) -> bool {
        bytes.starts_with(&[0, 0, 0, 0x0c, b'j', b'P', b' ', b' ']) || bytes.starts_with(&[0xff, 0x4f, 0xff, 0x51])
    }

    /// Grey levels as ONNX's reference makes them (Pillow's `convert("L")`: ITU-R 601-2 luma in fixed
    /// point, `(19595 R + 38470 G + 7471 B + 2^15) >> 16`), not the `image` crate's Rec. 709 weights.
    fn luma(rgb: &image::RgbImage) -> Vec<u8> {
        rgb.pixels()
            .map(|p| {
                ((19595 * u32::from(p[0]) + 38470 * u32::from(p[1]) + 7471 * u32::from(p[2]) + 0x8000) >> 16) as u8
            })
            .collect()
    }
}

#[cfg(target_arch = "wasm32")]
fn decode(_: &Node) -> OpResult<Vec<Value>> {
    super::unsupported("ImageDecoder in a browser build (decode the image on the page)")
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::super::testing::{run_one, string};
    use crate::value::Value;
    use kiln_graph::Tensor;

    /// A 2 × 1 PNG (red over grey 200) made here, decoded in each pixel format: RGB as stored, BGR
    /// reversed, grey by Pillow's weights (red is 76, where Rec. 709's would give 54). Bytes that are
    /// no image, and a header promising more pixels than kiln decodes, are errors, not a panic or an
    /// allocation the process cannot survive.
    #[test]
    fn pixel_formats_and_bad_bytes() {
        let mut png = Vec::new();
        let img = image::RgbImage::from_raw(1, 2, vec![255, 0, 0, 200, 200, 200]).unwrap();
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
        let arg = [Some(Value::Tensor(Tensor::from_slice(&png, &[png.len()]).unwrap()))];
        let rgb = run_one("ImageDecoder", vec![], &arg).unwrap();
        assert_eq!(rgb[0].shape().as_concrete(), Some(vec![2, 1, 3]));
        assert_eq!(rgb[0].to_vec::<u8>().unwrap(), vec![255, 0, 0, 200, 200, 200]);
        let bgr = run_one("ImageDecoder", vec![string("pixel_format", "BGR")], &arg).unwrap();
        assert_eq!(bgr[0].to_vec::<u8>().unwrap(), vec![0, 0, 255, 200, 200, 200]);
        let grey = run_one("ImageDecoder", vec![string("pixel_format", "Grayscale")], &arg).unwrap();
        assert_eq!(grey[0].shape().as_concrete(), Some(vec![2, 1, 1]));
        assert_eq!(grey[0].to_vec::<u8>().unwrap(), vec![76, 200]);
        let junk = [Some(Value::Tensor(Tensor::from_slice(&[1u8, 2, 3, 4], &[4]).unwrap()))];
        let e = run_one("ImageDecoder", vec![], &junk).unwrap_err();
        assert!(e.contains("decoding the image"), "{e}");
        // A PPM header claiming 65,536 × 65,536 pixels: refused before anything is decoded.
        let huge = b"P6\n65536 65536\n255\n\x01\x02\x03".to_vec();
        let arg_huge = [Some(Value::Tensor(Tensor::from_slice(&huge, &[huge.len()]).unwrap()))];
        let e = run_one("ImageDecoder", vec![], &arg_huge).unwrap_err();
        assert!(e.contains("65536 × 65536"), "{e}");
        let e = run_one("ImageDecoder", vec![string("pixel_format", "CMYK")], &arg).unwrap_err();
        assert!(e.contains("pixel_format"), "{e}");
    }
}
