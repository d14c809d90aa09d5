//! Which of wgpu's own run-time checks kiln's shaders are compiled with.
//!
//! wgpu assumes a shader may come from anyone, so by default it rewrites each one before the driver sees
//! it: every dynamic index into a fixed-size array (the matmul and attention templates' workgroup
//! tiles) is clamped with a `min`, every loop gets a hidden iteration counter, and workgroup memory is
//! zeroed when a workgroup starts. A clamped index cannot fold into a load's immediate offset, so the
//! attention template's tile reads each become an add, a `min` and a load where one load was.
//!
//! kiln's shaders are its own: the lowering clamps or guards every buffer index it emits (the kernel
//! interpreter runs each kernel in CI and faults on an out-of-bounds access), its templates index their
//! workgroup tiles within the tile shapes the validator checks, its loops are counted loops with bounds,
//! and its templates write their workgroup memory before a barrier and any read. The conformance tests
//! run trusted, on lavapipe in CI and on NVIDIA's Vulkan driver (`benches/NOTES.md`, session 36).
//! So kiln drops the checks it does not need ([`ShaderChecks::default`]). Storage buffers stay checked
//! by the driver where it offers robust buffer access (wgpu asks for it), and integer division keeps
//! its guards (a user's integer tensor may divide by zero; the guard folds away where the divisor is a
//! constant, as index arithmetic's are). A browser applies its own checks whatever is asked here.

/// The run-time checks wgpu adds to kiln's shaders, beyond integer division's (always kept). The
/// default, what kiln's shaders are compiled with, is none of the three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShaderChecks {
    /// Dynamic indices into arrays clamped (storage buffers: only where the driver cannot check them).
    pub bounds: bool,
    /// A hidden iteration counter in every loop, so a driver may not assume a loop ends.
    pub loops: bool,
    /// Workgroup memory zeroed when a workgroup starts.
    pub zero_init: bool,
}

impl ShaderChecks {
    /// Every check wgpu makes by default.
    pub const ALL: ShaderChecks = ShaderChecks { bounds: true, loops: true, zero_init: true };

    /// The checks `KILN_WGPU_SHADER_CHECKS` asks for: `on` (all of wgpu's, to tell a kiln bug from a
    /// driver's), or a comma-separated list of `bounds`, `loops`, `zero-init`; unset or `off`, the
    /// default. An unknown word is an error naming the ones it takes.
    pub fn from_env() -> Result<ShaderChecks, String> {
        match std::env::var("KILN_WGPU_SHADER_CHECKS") {
            Err(_) => Ok(ShaderChecks::default()),
            Ok(v) => ShaderChecks::parse(&v),
        }
    }

    /// Parses `KILN_WGPU_SHADER_CHECKS`'s value (see [`ShaderChecks::from_env`]).
    pub fn parse(value: &str) -> Result<ShaderChecks, String> {
        let mut checks = ShaderChecks::default();
        for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "on" | "all" => checks = ShaderChecks::ALL,
                "off" | "none" => {}
                "bounds" => checks.bounds = true,
                "loops" => checks.loops = true,
                "zero-init" => checks.zero_init = true,
                other => {
                    return Err(format!(
                        "KILN_WGPU_SHADER_CHECKS={value}: `{other}` is not one of on, off, bounds, loops, zero-init"
                    ))
                }
            }
        }
        Ok(checks)
    }

    /// The module-level checks to create a shader with.
    pub fn runtime_checks(self) -> wgpu::ShaderRuntimeChecks {
        // SAFETY: a check left out is one whose requirement kiln's shaders meet by construction (module
        // docs): every index kiln emits is in bounds, every loop is bounded. Division keeps its checks.
        let mut checks = unsafe { wgpu::ShaderRuntimeChecks::all(false) };
        checks.bounds_checks = self.bounds;
        checks.force_loop_bounding = self.loops;
        checks.int_div_checks = true;
        checks
    }

    /// A shader module of kiln's own `source`, created with these checks.
    pub fn module(self, device: &wgpu::Device, label: &str, source: &str) -> wgpu::ShaderModule {
        let descriptor =
            wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(source.into()) };
        if self == ShaderChecks::ALL {
            return device.create_shader_module(descriptor);
        }
        // SAFETY: kiln's own shaders, which keep the rules `runtime_checks` relies on.
        unsafe { device.create_shader_module_trusted(descriptor, self.runtime_checks()) }
    }

    /// The pipeline options these checks ask for (workgroup memory zeroed or not).
    pub fn compilation_options(self) -> wgpu::PipelineCompilationOptions<'static> {
        wgpu::PipelineCompilationOptions { zero_initialize_workgroup_memory: self.zero_init, ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::ShaderChecks;

    #[test]
    fn the_setting_reads_each_check_and_refuses_unknown_words() {
        assert_eq!(ShaderChecks::parse("off").unwrap(), ShaderChecks::default());
        assert_eq!(ShaderChecks::parse("on").unwrap(), ShaderChecks::ALL);
        let loops = ShaderChecks::parse("loops").unwrap();
        assert!(loops.loops && !loops.bounds && !loops.zero_init);
        assert_eq!(ShaderChecks::parse("bounds, loops,zero-init").unwrap(), ShaderChecks::ALL);
        let e = ShaderChecks::parse("bounds,fast").unwrap_err();
        assert!(e.contains("`fast`") && e.contains("zero-init"), "{e}");
        assert!(ShaderChecks::ALL.runtime_checks().int_div_checks);
        assert!(ShaderChecks::default().runtime_checks().int_div_checks, "division keeps its guards");
    }
}
