//! Which GPU a process opens: `KILN_CUDA_DEVICE` when set; else, in a data-parallel world (a launcher
//! set `WORLD_SIZE`), its `LOCAL_RANK` — one process per GPU, as torchrun and `kiln-run` start them; else
//! device 0. A malformed value is an error naming the variable, not a silent device 0.

/// The device ordinal from the environment read through `var`.
pub fn device_ordinal(var: impl Fn(&str) -> Option<String>) -> Result<usize, String> {
    let parse = |name: &str, v: String| {
        v.trim().parse::<usize>().map_err(|_| format!("{name}={v:?} is not a device number (0, 1, …)"))
    };
    if let Some(v) = var("KILN_CUDA_DEVICE") {
        return parse("KILN_CUDA_DEVICE", v);
    }
    match (var("WORLD_SIZE"), var("LOCAL_RANK")) {
        (Some(_), Some(v)) => parse("LOCAL_RANK", v),
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::device_ordinal;

    fn with(pairs: &[(&str, &str)]) -> Result<usize, String> {
        device_ordinal(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn the_environment_picks_the_device() {
        assert_eq!(with(&[]), Ok(0));
        assert_eq!(with(&[("LOCAL_RANK", "1")]), Ok(0), "LOCAL_RANK alone is not a world");
        assert_eq!(with(&[("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")]), Ok(1));
        assert_eq!(with(&[("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("KILN_CUDA_DEVICE", "0")]), Ok(0));
        assert!(with(&[("KILN_CUDA_DEVICE", "gpu1")]).unwrap_err().contains("KILN_CUDA_DEVICE=\"gpu1\""));
        assert!(with(&[("WORLD_SIZE", "2"), ("LOCAL_RANK", "-1")]).unwrap_err().contains("LOCAL_RANK"));
    }
}
