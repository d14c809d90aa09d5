//! Every shader goes through naga's validator before a device sees it. A failure names the kernel and
//! shows the numbered source, so a codegen bug reads like a compiler error, not a driver crash.

/// A shader naga rejected.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ValidationError(pub String);

fn invalid(kernel: &str, source: &str, report: String) -> ValidationError {
    ValidationError(kiln_graph::error::rejected_source(kernel, "naga (invalid WGSL)", &report, source))
}

/// Parses and validates `source` with every capability on (the device's own checks follow at pipeline
/// creation).
pub fn validate(kernel: &str, source: &str) -> Result<naga::Module, ValidationError> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| invalid(kernel, source, e.emit_to_string_with_path(source, kernel)))?;
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    v.validate(&module).map_err(|e| invalid(kernel, source, e.emit_to_string_with_path(source, kernel)))?;
    Ok(module)
}
