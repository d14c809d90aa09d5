//! Every shader goes through naga's validator before a device sees it. A failure names the kernel and
//! shows the numbered source, so a codegen bug reads like a compiler error, not a driver crash.

/// A shader naga rejected.
#[derive(Debug, thiserror::Error)]
#[error("kernel {kernel}: invalid WGSL\n{report}\n{numbered}")]
pub struct ValidationError {
    /// Kernel name.
    pub kernel: String,
    /// naga's message with line and column.
    pub report: String,
    /// The source, one numbered line each.
    pub numbered: String,
}

fn numbered(source: &str) -> String {
    source.lines().enumerate().map(|(i, l)| format!("{:4} | {l}\n", i + 1)).collect()
}

/// Parses and validates `source` with every capability on (the device's own checks follow at pipeline
/// creation).
pub fn validate(kernel: &str, source: &str) -> Result<naga::Module, ValidationError> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| ValidationError {
        kernel: kernel.into(),
        report: e.emit_to_string_with_path(source, kernel),
        numbered: numbered(source),
    })?;
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    v.validate(&module).map_err(|e| ValidationError {
        kernel: kernel.into(),
        report: e.emit_to_string_with_path(source, kernel),
        numbered: numbered(source),
    })?;
    Ok(module)
}
