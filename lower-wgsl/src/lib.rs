//! kiln-wgsl
